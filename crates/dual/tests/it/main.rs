//! The crate's integration tests, one module per concern, linked as one binary
//! (a binary per file would link the whole dependency tree once per file).

#[path = "../common/mod.rs"]
mod common;

mod dual;
mod dual_files;
mod dual_persist;
mod dual_restore;
mod dual_speculation;
mod facts;
mod hybrid;
mod masked_budget;
mod masked_disk;
mod masked_pressure;
mod ring_fuzz;
mod ring_model;
mod stored_facts;
mod stream_job;
mod summary_in_engine;
mod summary_job;
mod summary_sched;
