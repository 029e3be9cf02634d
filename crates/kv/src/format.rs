//! KV storage formats, chosen per load (`--kv-format`).
//!
//! `f32` is bit-exact and `f16` rounds each value once: both keep invariant 1
//! (exact reuse). `q8` and `q4` are approximations, opt-in and measured
//! (`engram bench cache`): symmetric groups of 32 elements along each
//! token-head row with an f16 scale — ggml's Q8_0 / Q4_0 blocks — for keys
//! and values alike.
//!
//! NOTE: KIVI quantizes keys per channel because a few key channels carry
//! outliers. Per-channel groups need a block's worth of tokens before they
//! can be quantized, which fights appending token by token and sharing
//! partial blocks; we chose per-token groups and measure the error instead.

use std::str::FromStr;

use engram_model::KvElem;

use crate::error::KvError;

/// How keys and values are stored in blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvFormat {
    /// 4 bytes per element; reuse is bit-identical to recomputation.
    F32,
    /// 2 bytes per element; the default, as in llama.cpp.
    #[default]
    F16,
    /// 8-bit groups: 1.06 bytes per element.
    Q8,
    /// 4-bit groups: 0.56 bytes per element (0.28x f16).
    Q4,
}

impl KvFormat {
    /// All formats.
    pub const ALL: [KvFormat; 4] = [KvFormat::F32, KvFormat::F16, KvFormat::Q8, KvFormat::Q4];

    /// Canonical name, as accepted by `--kv-format`.
    pub fn name(self) -> &'static str {
        match self {
            KvFormat::F32 => "f32",
            KvFormat::F16 => "f16",
            KvFormat::Q8 => "q8",
            KvFormat::Q4 => "q4",
        }
    }

    /// True for formats whose reuse equals recomputation (up to one f16 rounding).
    pub fn is_exact(self) -> bool {
        matches!(self, KvFormat::F32 | KvFormat::F16)
    }

    /// The row encoding for heads of `head_dim`: groups of 32 where the head
    /// divides into them, else one group per head.
    pub fn elem(self, head_dim: usize) -> KvElem {
        let group = if head_dim % 32 == 0 { 32 } else { head_dim };
        match self {
            KvFormat::F32 => KvElem::F32,
            KvFormat::F16 => KvElem::F16,
            KvFormat::Q8 => KvElem::Q8 { group },
            KvFormat::Q4 => KvElem::Q4 { group },
        }
    }
}

impl std::fmt::Display for KvFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvFormat {
    type Err = KvError;
    fn from_str(s: &str) -> Result<Self, KvError> {
        KvFormat::ALL.into_iter().find(|f| f.name() == s).ok_or_else(|| KvError::UnknownFormat(s.to_string()))
    }
}
