//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

#[path = "../common/mod.rs"]
mod common;

mod chat;
mod gguf;
mod hf;
mod hf_gguf_parity;
mod llama_cpp_pre;
mod llama_cpp_vocabs;
mod stream;
mod train;
