//! engram-gguf (placeholder while the crate is being written)
