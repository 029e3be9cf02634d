//! engram-kernels (placeholder while the crate is being written)
