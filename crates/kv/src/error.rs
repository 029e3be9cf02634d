//! Errors of the KV store.

/// Errors raised by the KV store.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum KvError {
    /// Holding the requested tokens would exceed the pool's RAM budget.
    #[error("KV cache budget exhausted: need {needed} more bytes, {used} of {budget} bytes in use")]
    OutOfMemory { needed: usize, used: usize, budget: usize },
    /// Asked for a format this build does not know.
    #[error("unknown KV format \"{0}\" (expected f32 or f16)")]
    UnknownFormat(String),
}
