//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

#[path = "../common/mod.rs"]
mod common;

mod arch_golden;
mod bad_files;
mod chunking;
mod formats;
mod golden;
mod gpt_oss;
mod hidden;
mod moe;
mod quant_types;
mod resident;
