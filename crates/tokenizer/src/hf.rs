//! Loading a tokenizer from a Hugging Face model folder.
//!
//! Owner: `engram-tokenizer`. Files read (all relative to the folder):
//! * `tokenizer.json` — required;
//! * `tokenizer_config.json` — optional: `bos_token`, `eos_token` (strings or
//!   `{"content": ..}` objects), `add_bos_token`, `chat_template` (a string, or a
//!   list of `{name, template}` where `default` wins);
//! * `chat_template.jinja` (transformers 5) — wins over any other template source;
//!   then `chat_template.json` (`{"chat_template": ..}`), then tokenizer_config's;
//! * `generation_config.json` — optional: `eos_token_id` (int or list) adds stop ids.
//!
//! Every error names the file it is about.

use crate::chat_template::ChatTemplate;
use crate::error::{Result, TokenizerError};
use crate::tokenizer::{guess_bos, SpecialFacts, Tokenizer};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn read_optional(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(TokenizerError::Io { path: path.to_path_buf(), source }),
    }
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    let Some(text) = read_optional(path)? else {
        return Ok(None);
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizerError::Parse { path: path.to_path_buf(), message: format!("invalid JSON: {e}") })
}

/// `"<s>"` or `{"content": "<s>", ...}` or null.
fn token_text(v: Option<&Value>, path: &Path, key: &str) -> Result<Option<String>> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(m)) => match m.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(bad(path, format!("`{key}` object has no string `content`"))),
        },
        Some(other) => Err(bad(path, format!("`{key}` must be a string or an object, got {other}"))),
    }
}

fn bad(path: &Path, message: String) -> TokenizerError {
    TokenizerError::Parse { path: path.to_path_buf(), message }
}

fn template_from_config(v: &Value, path: &Path) -> Result<Option<String>> {
    match v.get("chat_template") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(list)) => {
            let named = |name: &str| {
                list.iter()
                    .find_map(|e| (e.get("name")?.as_str()? == name).then(|| e.get("template")?.as_str().map(str::to_string)).flatten())
            };
            let first = || list.iter().find_map(|e| e.get("template")?.as_str().map(str::to_string));
            Ok(named("default").or_else(first))
        }
        Some(_) => Err(bad(path, "`chat_template` must be a string or a list".into())),
    }
}

fn ids_of(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(|x| x.as_u64().map(|x| x as u32)).collect(),
        _ => Vec::new(),
    }
}

impl Tokenizer {
    /// Load `tokenizer.json` (+ optional `tokenizer_config.json`, `chat_template.jinja`,
    /// `chat_template.json`, `generation_config.json`) from a Hugging Face model folder.
    ///
    /// BOS/EOS come from tokenizer_config; when it is absent, BOS is what the
    /// post-processor prepends and EOS the first id of generation_config's
    /// `eos_token_id` (else a well-known EOS spelling among the special tokens).
    pub fn from_hf_dir(dir: &Path) -> Result<Tokenizer> {
        let tj: PathBuf = dir.join("tokenizer.json");
        let bytes = match std::fs::read(&tj) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TokenizerError::MissingFile { path: tj, hint: "a Hugging Face model folder needs tokenizer.json" })
            }
            Err(source) => return Err(TokenizerError::Io { path: tj, source }),
        };
        let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| bad(&tj, format!("not a valid tokenizer.json: {e}")))?;

        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = read_json(&cfg_path)?;
        let gen_path = dir.join("generation_config.json");
        let gen = read_json(&gen_path)?;

        let mut facts = SpecialFacts::default();
        let mut template_src: Option<(String, PathBuf)> = None;
        if let Some(cfg) = &cfg {
            if !cfg.is_object() {
                return Err(bad(&cfg_path, "expected a JSON object".into()));
            }
            facts.bos_token = token_text(cfg.get("bos_token"), &cfg_path, "bos_token")?;
            facts.eos_token = token_text(cfg.get("eos_token"), &cfg_path, "eos_token")?;
            facts.add_bos_override = cfg.get("add_bos_token").and_then(Value::as_bool);
            if let Some(t) = template_from_config(cfg, &cfg_path)? {
                template_src = Some((t, cfg_path.clone()));
            }
        }
        let ct_json_path = dir.join("chat_template.json");
        if let Some(v) = read_json(&ct_json_path)? {
            if let Some(t) = template_from_config(&v, &ct_json_path)? {
                template_src = Some((t, ct_json_path));
            }
        }
        let jinja_path = dir.join("chat_template.jinja");
        if let Some(t) = read_optional(&jinja_path)? {
            template_src = Some((t, jinja_path));
        }

        let gen_eos = gen.as_ref().map(|g| ids_of(g.get("eos_token_id"))).unwrap_or_default();
        if facts.bos_token.is_none() {
            facts.bos_token = gen
                .as_ref()
                .and_then(|g| ids_of(g.get("bos_token_id")).first().copied())
                .and_then(|id| inner.id_to_token(id))
                .or_else(|| guess_bos(&inner));
        }
        if facts.eos_token.is_none() {
            facts.eos_token = gen_eos.first().and_then(|&id| inner.id_to_token(id)).or_else(|| {
                ["</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>"]
                    .iter()
                    .find(|t| inner.get_added_vocabulary().is_special_token(t))
                    .map(|t| t.to_string())
            });
        }
        facts.extra_stop_ids = gen_eos;

        let chat_template = match template_src {
            Some((src, path)) => Some(ChatTemplate::new(&src).map_err(|e| bad(&path, e.to_string()))?),
            None => None,
        };
        Tokenizer::from_parts(inner, facts, chat_template)
    }
}
