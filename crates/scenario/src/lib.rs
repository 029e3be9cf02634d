//! Multi-agent scenarios (multi-agent serving with per-agent caches): agents talk in phases described in YAML, and each
//! agent's KV cache is its working memory — every phase extends what the agent already
//! computed instead of prefilling the conversation again.
//!
//! - [`spec`]: the file format ([`Scenario`], [`AgentSpec`], [`PhaseSpec`]);
//!   [`validate`]: checking it, each problem with its line ([`load`]).
//! - [`template`]: `${phase.messages[agent]}` resolved from an agent's point of view.
//! - [`memory`]: an agent's append-only conversation (why each prompt EXTENDs its cache).
//! - [`runner`]: phases and rounds ([`run`]) over a [`Backend`]: [`EngineBackend`] (the
//!   scheduler in this process) or [`HttpBackend`] (a server's `/v1/agents`).
//! - [`no_reuse`]: the policy that computes every prompt whole (the baseline).
//!
//! Invariant (tested in `tests/it/scenarios.rs`): from an agent's second turn on, its cache
//! covers its whole previous prompt and answer; an agent's prompts hold no message of a
//! phase it did not take part in; the transcript equals a run that reuses nothing.

pub mod backend;
pub mod engine_backend;
pub mod http_backend;
mod lines;
pub mod memory;
pub mod no_reuse;
pub mod runner;
pub mod spec;
pub mod template;
pub mod validate;

pub use backend::{AgentKey, Backend, Turn, TurnOutcome};
pub use engine_backend::{EngineBackend, EngineOptions};
pub use http_backend::HttpBackend;
pub use runner::{run, Message, PhaseReport, Progress, Report, RunOptions, TurnFigures};
pub use spec::{AgentSpec, Lifecycle, PhaseSpec, Scenario};
pub use validate::{load, Problem, Problems};
