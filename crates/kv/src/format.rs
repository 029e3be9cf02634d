//! KV storage formats. Both are exact enough for invariant 1: `f32` is
//! bit-exact, `f16` rounds each stored value once.

use std::str::FromStr;

use crate::error::KvError;

/// How keys and values are stored in blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvFormat {
    /// 4 bytes per element; reuse is bit-identical to recomputation.
    F32,
    /// 2 bytes per element; the default, as in llama.cpp.
    #[default]
    F16,
}

impl KvFormat {
    /// Bytes per stored element.
    pub fn elem_bytes(self) -> usize {
        match self {
            KvFormat::F32 => 4,
            KvFormat::F16 => 2,
        }
    }
    /// Canonical name, as accepted by `--kv-format`.
    pub fn name(self) -> &'static str {
        match self {
            KvFormat::F32 => "f32",
            KvFormat::F16 => "f16",
        }
    }
}

impl FromStr for KvFormat {
    type Err = KvError;
    fn from_str(s: &str) -> Result<Self, KvError> {
        match s {
            "f32" => Ok(KvFormat::F32),
            "f16" => Ok(KvFormat::F16),
            other => Err(KvError::UnknownFormat(other.to_string())),
        }
    }
}
