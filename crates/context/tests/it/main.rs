//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

#[path = "../common/mod.rs"]
mod common;

mod families;
mod remote;
mod sessions;
mod sliding;
mod tenants;
