//! KV storage formats, chosen per load (`--kv-format`).
//!
//! `f32` is bit-exact and `f16` rounds each value once: both keep invariant 1
//! (exact reuse). `q8` and `q4` are approximations, opt-in and measured
//! (`engram bench cache`, `engram bench fidelity`): symmetric groups of 32
//! elements along each token-head row with an f16 scale — ggml's Q8_0 / Q4_0
//! blocks — for keys and values alike, plus a recent window: a sequence's
//! partial last block is also kept in f16 and attended from there
//! (`recent_window.rs`), so the newest up to 31 tokens are read at full precision.
//!
//! NOTE: the choice, measured on pycode-7m (`engram bench fidelity`, two
//! Python files, 512 tokens prefilled then 512 scored one at a time, mean KL
//! against f32 KV): q4 without the window 7.8e-3 / 9.6e-3; with it (shipped)
//! 3.4e-3 / 3.7e-3 at the same 0.28x of f16; KIVI's per-channel keys on top,
//! symmetric (same bytes) 2.0e-3 / 2.6e-3 but top-1 agreement mixed (0.967 vs
//! 0.977, 0.979 vs 0.961); asymmetric KIVI 0.9e-3 / 1.3e-3 but 0.31x of f16,
//! over the 0.3x budget. Per-channel groups also need a whole block before
//! they can be quantized, so every block would be re-encoded when it fills,
//! is truncated or is copied; the window gives most of the gain without that.

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
    /// 8-bit groups: 1.06 bytes per element (plus the f16 recent window).
    Q8,
    /// 4-bit groups: 0.56 bytes per element, 0.28x f16 (plus the f16 recent window).
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
