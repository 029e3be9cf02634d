// Shared helpers for the integration tests (included with `mod common;`).
#![allow(dead_code)]

use engram_tokenizer::*;
use std::path::Path;
use std::sync::OnceLock;

/// The fixture tokenizer (trained once per test binary).
pub fn fixture() -> &'static tokenizers::Tokenizer {
    static FIX: OnceLock<tokenizers::Tokenizer> = OnceLock::new();
    FIX.get_or_init(|| train_bpe(FIXTURE_CORPUS, 2048, &FIXTURE_SPECIAL_TOKENS).unwrap())
}

pub fn fixture_json() -> &'static str {
    static J: OnceLock<String> = OnceLock::new();
    J.get_or_init(|| fixture().to_string(false).unwrap())
}

pub const CHATML: &str = include_str!("../data/chatml.jinja");
pub const LLAMA3: &str = include_str!("../data/llama3.jinja");
pub const LLAMA2: &str = include_str!("../data/llama2.jinja");
pub const BLOCKS: &str = include_str!("../data/blocks.jinja");

/// Write a HF-style folder with the fixture tokenizer and the given extra files.
pub fn write_dir(dir: &Path, files: &[(&str, &str)]) {
    std::fs::write(dir.join("tokenizer.json"), fixture_json()).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// Small deterministic PRNG (xorshift64*).
pub struct Rng(pub u64);
impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

pub const SAMPLES: &[&str] = &[
    "Hello world",
    "The KV cache keeps keys and values — per layer, per head.",
    "  leading spaces and trailing  ",
    "café au lait, naïve résumé",
    "日本語のテキスト",
    "emoji 🚀🔥✅ and flags 🇫🇷",
    "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
    "line one\n\nline three\r\n\ttabbed",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "numbers 1234567 and 3.14159",
    "",
];

/// A small hand-made SentencePiece-style (GGUF "llama") vocabulary.
/// Ids: 0 <unk>, 1 <s>, 2 </s>, 3..=258 <0x00>..<0xFF>, then pieces.
pub fn spm_vocab() -> GgufVocab {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    let mut scores = vec![0.0f32, 0.0, 0.0];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    // base characters, then merged pieces with decreasing scores (= merge rank)
    let base = ["▁", "h", "e", "l", "o", "w", "r", "d", ",", "a", "t", "c", "é"];
    for p in base {
        tokens.push(p.into());
        types.push(1);
        scores.push(-100.0);
    }
    let merged =
        ["▁h", "he", "ll", "lo", "▁he", "llo", "▁hello", "▁w", "or", "▁wor", "ld", "▁world", "at", "▁c", "▁cat", "▁▁", "▁▁▁▁", "ca", "▁ca"];
    for (i, p) in merged.iter().enumerate() {
        tokens.push(p.to_string());
        types.push(1);
        scores.push(-(i as f32) - 1.0);
    }
    tokens.push("<tag>".into()); // user-defined
    types.push(4);
    scores.push(0.0);
    tokens.push("[UNUSED0]".into()); // unused padding entry
    types.push(5);
    scores.push(0.0);
    GgufVocab {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        ..Default::default()
    }
}

pub mod gguf_meta;
pub mod goldens;

/// Whether CI runs these tests (`CI=true`): there a missing reference input is a failure.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// llama.cpp's source tree (`ENGRAM_LLAMA_CPP_SRC`, e.g. the `vendor/llama.cpp` folder of
/// llama-cpp-python's sdist), or `None` after printing a SKIPPED line; a panic under
/// `CI=true`, because CI fetches it.
pub fn llama_cpp_src(test: &str) -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("ENGRAM_LLAMA_CPP_SRC").map(std::path::PathBuf::from);
    match dir {
        Some(d) if d.join("models").is_dir() => Some(d),
        other => {
            let msg = format!(
                "{test}: ENGRAM_LLAMA_CPP_SRC {} (set it to llama.cpp's source tree, the one with models/ggml-vocab-*.gguf)",
                match other {
                    Some(d) => format!("= {} has no models/ folder", d.display()),
                    None => "is not set".to_string(),
                }
            );
            if in_ci() {
                panic!("{msg}; .ci/run fetches it");
            }
            eprintln!("SKIPPED: {msg}");
            None
        }
    }
}
