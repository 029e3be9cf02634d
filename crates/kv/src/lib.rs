//! engram-kv (placeholder while the crate is being written)
