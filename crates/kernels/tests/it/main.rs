//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

#[path = "../common/mod.rs"]
mod common;

mod dispatch;
mod exact;
mod flash;
mod forced;
mod formats;
mod golden;
mod matmul;
mod prop;
mod repack;
mod repack_k;
mod vnni_k;
