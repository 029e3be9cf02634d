//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

#[path = "../common/mod.rs"]
mod common;

mod clusters;
mod exact;
mod heap;
mod long;
mod long_saves;
mod offload;
mod own_cache;
mod persist;
mod snapshot;
mod stream;
