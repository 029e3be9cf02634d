//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

#[path = "../common/mod.rs"]
mod common;

mod bank;
mod blend;
mod chunk;
mod chunk_files;
mod chunk_jobs;
mod idle;
mod idle_budget;
mod idle_jobs;
mod idle_llm;
mod idle_preempt;
mod parse;
mod pipeline;
mod policy_layer;
mod qa;
mod synth;
mod tree_files;
