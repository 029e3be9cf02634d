//! Errors of the KV store.

/// Errors raised by the KV store.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum KvError {
    /// Holding the requested tokens would exceed the pool's RAM budget.
    #[error("KV cache budget exhausted: need {needed} more bytes, {used} of {budget} bytes in use")]
    OutOfMemory { needed: usize, used: usize, budget: usize },
    /// Asked for a format this build does not know.
    #[error("unknown KV format \"{0}\" (expected f32, f16, q8 or q4)")]
    UnknownFormat(String),
    /// The format cannot store this model's heads.
    #[error("KV format {format} cannot store heads of dimension {head_dim} (needs an even head dimension)")]
    UnsupportedShape { format: &'static str, head_dim: usize },
    /// Bytes handed to the pool do not form whole blocks of its layout.
    #[error("mapped KV data: {0}")]
    BadMapping(String),
    /// The rows asked for are in blocks whose sliding layers were released (`sliding.rs`):
    /// they cannot be read, copied or moved; recompute them instead.
    #[error("KV rows from slot {slot} on are in a block whose sliding layers were released")]
    Released { slot: usize },
}
