//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

mod bench_speed_cli;
mod chat;
mod chat_dual;
mod convert;
mod generate_sparse;
mod rag_rm;
mod scenario;
mod serve_long_context;
