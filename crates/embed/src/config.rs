//! What a sentence-transformers folder declares: `modules.json` (which
//! modules run, in order), the Transformer module's `config.json` (the BERT
//! shape) and `sentence_bert_config.json` (truncation, lower-casing), the
//! Pooling module's `config.json`, and whether a Normalize module follows.
//!
//! Invariant: a [`Layout`] is only built from a folder whose every field was
//! checked; anything this crate cannot run (a Dense module, CLS+mean pooling
//! concatenated, another activation) is an `Unsupported` error, never a
//! silently different embedding.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;

use crate::error::{config_err, io_err, unsupported, EmbedError, Result};

/// The BERT encoder's shape, mirroring Hugging Face's `config.json`.
#[derive(Clone, Debug, Deserialize)]
pub struct BertConfig {
    #[serde(default)]
    pub model_type: Option<String>,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}

impl BertConfig {
    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    fn validate(&self, path: &Path) -> Result<()> {
        if let Some(t) = &self.model_type {
            if t != "bert" {
                return Err(unsupported(path, format!("model_type \"{t}\" (this encoder runs \"bert\")")));
            }
        }
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if v == 0 || v > 1 << 20 {
                return Err(config_err(path, field, format!("{v} is out of range")));
            }
        }
        #[allow(clippy::manual_is_multiple_of)] // is_multiple_of needs Rust 1.87; MSRV is 1.80
        if self.hidden_size % self.num_attention_heads != 0 {
            return Err(config_err(
                path,
                "num_attention_heads",
                format!("hidden_size {} is not a multiple of {}", self.hidden_size, self.num_attention_heads),
            ));
        }
        if self.hidden_act != "gelu" {
            return Err(unsupported(path, format!("hidden_act \"{}\" (only BERT's exact \"gelu\")", self.hidden_act)));
        }
        if let Some(p) = &self.position_embedding_type {
            if p != "absolute" {
                return Err(unsupported(path, format!("position_embedding_type \"{p}\" (only \"absolute\")")));
            }
        }
        if !(self.layer_norm_eps > 0.0 && self.layer_norm_eps < 1.0) {
            return Err(config_err(path, "layer_norm_eps", format!("{} is out of range", self.layer_norm_eps)));
        }
        Ok(())
    }
}

/// How token vectors become one sentence vector (`1_Pooling/config.json`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolingMode {
    /// The `[CLS]` token's vector.
    Cls,
    /// The mean over the sentence's tokens (special tokens included, as
    /// sentence-transformers does: its attention mask covers them).
    Mean,
    /// The element-wise maximum over the tokens.
    Max,
    /// The sum over the tokens divided by the square root of their number.
    MeanSqrtLen,
}

#[derive(Deserialize)]
struct PoolingFile {
    word_embedding_dimension: usize,
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
    #[serde(default)]
    pooling_mode_weightedmean_tokens: bool,
    #[serde(default)]
    pooling_mode_lasttoken: bool,
}

#[derive(Deserialize)]
struct ModuleEntry {
    #[serde(default)]
    path: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Deserialize, Default)]
struct SentenceBertFile {
    #[serde(default)]
    max_seq_length: Option<usize>,
    #[serde(default)]
    do_lower_case: bool,
}

/// Everything a folder declares, checked.
#[derive(Clone, Debug)]
pub struct Layout {
    /// The folder holding `config.json`, `model.safetensors`, `tokenizer.json`.
    pub transformer_dir: PathBuf,
    pub bert: BertConfig,
    pub pooling: PoolingMode,
    /// A Normalize module follows pooling: vectors have unit L2 norm.
    pub normalize: bool,
    /// Tokens per text after truncation, `[CLS]` and `[SEP]` included.
    pub max_seq_length: usize,
    /// sentence-transformers lower-cases texts before tokenizing.
    pub lowercase: bool,
}

/// Reads and deserializes one JSON file; missing and malformed files are
/// errors naming the file.
pub(crate) fn read_json<T: DeserializeOwned>(path: &Path) -> Result<T> {
    let bytes = std::fs::read(path).map_err(|e| io_err(path, e))?;
    serde_json::from_slice(&bytes).map_err(|e| EmbedError::Json { path: path.to_path_buf(), reason: e.to_string() })
}

/// Which module of `modules.json` a type name is (the last path segment of
/// e.g. `sentence_transformers.models.Pooling`).
fn module_kind(kind: &str) -> &str {
    kind.rsplit('.').next().unwrap_or(kind)
}

/// Reads the folder `dir` of a sentence-transformers model.
pub fn read(dir: &Path) -> Result<Layout> {
    if !dir.is_dir() {
        let why = if dir.exists() { "not a folder (expected a sentence-transformers folder)" } else { "no such folder" };
        return Err(io_err(dir, std::io::Error::new(std::io::ErrorKind::NotFound, why)));
    }
    let modules_path = dir.join("modules.json");
    if !modules_path.is_file() {
        return Err(EmbedError::Unsupported {
            path: dir.to_path_buf(),
            what: "no modules.json: not a sentence-transformers folder".into(),
        });
    }
    let modules: Vec<ModuleEntry> = read_json(&modules_path)?;
    let mut transformer = None;
    let mut pooling = None;
    let mut normalize = false;
    for (i, m) in modules.iter().enumerate() {
        match module_kind(&m.kind) {
            "Transformer" if i == 0 => transformer = Some(dir.join(&m.path)),
            "Pooling" if i == 1 => pooling = Some(dir.join(&m.path)),
            "Normalize" if i == 2 && pooling.is_some() => normalize = true,
            _ => {
                return Err(unsupported(
                    &modules_path,
                    format!("module {i} of type \"{}\" (this encoder runs Transformer, Pooling, then optionally Normalize)", m.kind),
                ))
            }
        }
    }
    let (Some(transformer_dir), Some(pooling_dir)) = (transformer, pooling) else {
        return Err(unsupported(&modules_path, "a Transformer module followed by a Pooling module is required"));
    };

    let config_path = transformer_dir.join("config.json");
    let bert: BertConfig = read_json(&config_path)?;
    bert.validate(&config_path)?;

    let pooling_path = pooling_dir.join("config.json");
    let p: PoolingFile = read_json(&pooling_path)?;
    if p.word_embedding_dimension != bert.hidden_size {
        return Err(config_err(
            &pooling_path,
            "word_embedding_dimension",
            format!("{} but the transformer's hidden_size is {}", p.word_embedding_dimension, bert.hidden_size),
        ));
    }
    if p.pooling_mode_weightedmean_tokens || p.pooling_mode_lasttoken {
        return Err(unsupported(&pooling_path, "weighted-mean and last-token pooling"));
    }
    let modes = [
        (p.pooling_mode_cls_token, PoolingMode::Cls),
        (p.pooling_mode_mean_tokens, PoolingMode::Mean),
        (p.pooling_mode_max_tokens, PoolingMode::Max),
        (p.pooling_mode_mean_sqrt_len_tokens, PoolingMode::MeanSqrtLen),
    ];
    let on: Vec<PoolingMode> = modes.iter().filter(|(b, _)| *b).map(|(_, m)| *m).collect();
    let pooling = match on.as_slice() {
        [m] => *m,
        [] => return Err(config_err(&pooling_path, "pooling_mode_mean_tokens", "no pooling mode is enabled")),
        _ => return Err(unsupported(&pooling_path, format!("several pooling modes concatenated ({on:?})"))),
    };

    let sb_path = transformer_dir.join("sentence_bert_config.json");
    let sb: SentenceBertFile = if sb_path.is_file() { read_json(&sb_path)? } else { SentenceBertFile::default() };
    let max_seq_length = match sb.max_seq_length {
        Some(n) if n < 2 => return Err(config_err(&sb_path, "max_seq_length", format!("{n}: must leave room for [CLS] and [SEP]"))),
        // Position embeddings bound the length whatever the file says.
        Some(n) => n.min(bert.max_position_embeddings),
        None => bert.max_position_embeddings,
    };
    Ok(Layout { transformer_dir, bert, pooling, normalize, max_seq_length, lowercase: sb.do_lower_case })
}
