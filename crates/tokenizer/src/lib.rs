//! engram-tokenizer (placeholder while the crate is being written)
