//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod background;
mod blend;
mod deferred;
mod draft_model;
mod faults;
mod grammar;
mod idle;
mod pooled;
mod reuse;
mod scheduler;
mod speculation;
mod stepped;
mod stops;
mod view_policy;
