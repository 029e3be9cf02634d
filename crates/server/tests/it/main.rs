//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

#[path = "../common/mod.rs"]
mod common;

mod agents;
mod api_errors;
mod count_tokens;
mod discovery;
mod dual;
mod dual_masked;
mod dual_persist;
mod dual_routes;
mod embeddings;
mod facts;
mod fleet;
mod fuzz_bodies;
mod limits;
mod long_context;
mod ollama;
mod rag;
mod rag_blend;
mod rag_idle;
mod server;
mod structured;
mod template_kwargs;
mod tenants;
mod tools;
