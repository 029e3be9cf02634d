//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

#[path = "../common/mod.rs"]
mod common;

mod admission;
mod blend;
mod draft_model;
mod dual;
mod dual_files;
mod dual_persist;
mod dual_restore;
mod dual_speculation;
mod facts;
mod faults;
mod hybrid;
mod idle;
mod pooled;
mod reuse;
mod scheduler;
mod speculation;
mod stops;
mod summary_job;
mod summary_sched;
mod view_policy;
