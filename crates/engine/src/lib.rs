//! engram-engine (placeholder while the crate is being written)
