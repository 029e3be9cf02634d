//! engram-model (placeholder while the crate is being written)
