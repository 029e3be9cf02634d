//! `Model`: a loaded model — config, weights, tokenizer, fingerprint — with
//! immutable weights (`&self` everywhere), so any number of sequences and
//! threads can share it.

use std::path::Path;

use engram_tokenizer::Tokenizer;

use crate::config::ModelConfig;
use crate::error::Result;
use crate::load;
use crate::weights::ModelWeights;

/// A stable 64-bit identity of a model: weights' layout, metadata, a sample of
/// every tensor's bytes, the tokenizer, chat template and RoPE settings. Two
/// processes loading the same files get the same value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub u64);

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// FNV-1a, 64-bit. NOTE: hand-written because it is ten lines and must never
/// change between versions (fingerprints are persisted); std's hasher may.
pub fn fnv1a64(seed: u64, bytes: &[u8]) -> u64 {
    let mut h = seed ^ 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// A loaded Llama-family model.
pub struct Model {
    pub config: ModelConfig,
    pub weights: ModelWeights,
    pub tokenizer: Tokenizer,
    pub fingerprint: Fingerprint,
    /// `gguf:<path>` or `hf:<path>`.
    pub source: String,
    /// How the attention tiles multiply; private so that it never disagrees with the
    /// fingerprint ([`Model::with_attention`] changes both).
    attention: AttentionPrecision,
    /// The fingerprint as loaded (exact attention).
    loaded_fingerprint: Fingerprint,
}

pub use engram_kernels::flash::Precision as AttentionPrecision;

impl Model {
    /// Loads a GGUF file or a Hugging Face folder.
    pub fn load(path: &Path) -> Result<Model> {
        let l = load::load(path)?;
        let mut h = fnv1a64(0, &l.identity);
        h = fnv1a64(h, format!("{:?}", l.config).as_bytes());
        if let Some(t) = l.tokenizer.chat_template() {
            h = fnv1a64(h, t.source().as_bytes());
        }
        h = fnv1a64(h, l.tokenizer.inner().to_string(false).unwrap_or_default().as_bytes());
        Ok(Model {
            config: l.config,
            weights: l.weights,
            tokenizer: l.tokenizer,
            fingerprint: Fingerprint(h),
            source: l.source,
            attention: AttentionPrecision::Exact,
            loaded_fingerprint: Fingerprint(h),
        })
    }

    /// The model computing attention at `precision`. Invariant: a model's caches are only
    /// reused by a model with the same fingerprint, so anything but `Exact` changes it (a cache
    /// computed with bf16 attention is not one an exact run would compute); `Exact` keeps the
    /// loaded fingerprint, so existing caches stay valid.
    pub fn with_attention(mut self, precision: AttentionPrecision) -> Model {
        self.set_attention(precision);
        self
    }

    /// The attention precision this model runs ([`Model::with_attention`]); `Exact` unless chosen.
    pub fn attention(&self) -> AttentionPrecision {
        self.attention
    }

    /// [`Model::with_attention`] in place.
    pub fn set_attention(&mut self, precision: AttentionPrecision) {
        let base = self.loaded_fingerprint;
        self.fingerprint = match precision {
            AttentionPrecision::Exact => base,
            p => Fingerprint(fnv1a64(base.0, format!("attention={}", p.name()).as_bytes())),
        };
        self.attention = precision;
    }

    /// A one-line description for logs: architecture, size, format.
    pub fn describe(&self) -> String {
        let c = &self.config;
        format!(
            "{} {} layers, hidden {}, {} heads ({} kv), vocab {}, weights {} ({:.1} MiB), {}",
            c.arch.name(),
            c.num_layers,
            c.hidden,
            c.num_heads,
            c.num_kv_heads,
            c.vocab,
            self.weights.main_dtype().name(),
            self.weights.num_bytes() as f64 / (1 << 20) as f64,
            self.source
        )
    }
}
