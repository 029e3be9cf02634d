//! # engram-python — Engram in-process from Python
//!
//! The compiled half of the `engram` package (`python/engram/` is the rest: the type stubs and
//! `engram.compat`, llama-cpp-python's API over this one). It runs the same engine and policy
//! stack as `engram serve` — `engram_engine::EngineHandle` started with what
//! `engram_stack::build` makes, agents in the server's registry — on a model loaded in the
//! Python process, with no HTTP in between.
//!
//! ```text
//!  Python threads ──(GIL released while waiting)──► EngineHandle ──► engine thread
//!  Engine / Agent / Session / ChatStream               (core.rs)      (batches every job)
//! ```
//! Main types: [`engine::Engine`], [`agent::Agent`], [`agent::Session`],
//! [`stream::ChatStream`], [`rag::Rag`]; [`errors::EngramError`].
//!
//! Architecture invariant: this crate adds no engine, policy or cache of its own; it turns
//! Python calls into engine jobs and the engine's events into OpenAI-shaped Python objects.

mod agent;
mod convert;
mod core;
mod engine;
mod errors;
mod job;
mod rag;
mod request;
mod response;
mod stream;

use pyo3::prelude::*;

/// The `engram._engram` extension module.
#[pymodule]
fn _engram(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<engine::Engine>()?;
    m.add_class::<agent::Agent>()?;
    m.add_class::<agent::Session>()?;
    m.add_class::<stream::ChatStream>()?;
    m.add_class::<rag::Rag>()?;
    m.add_function(wrap_pyfunction!(rag::synth_corpus, m)?)?;
    m.add("EngramError", m.py().get_type::<errors::EngramError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
