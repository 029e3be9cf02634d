//! # engram-engine — generation
//!
//! Turns a model and a KV store into text: sampling ([`Sampler`]), stop
//! strings that never leak a partial match into a stream ([`StopMatcher`]),
//! and the scheduler whose step is the one decode loop — batched, with chunked prefill of
//! bounded peak memory — run on an engine thread ([`EngineHandle`]) or, for one sequence on
//! the caller's thread, by [`LoneSequence`] (a cold generation is a fresh one);
//! [`Decoding`] is the one place a sampled token is accepted (stop tokens, stop strings,
//! limits), for the CLI and the server alike;
//! [`PooledEncoder`] is the loaded LLM as an `engram_embed::TextEncoder` (mean of its
//! final-normed hidden states), the fallback where no sentence encoder is installed.
//!
//! Architecture invariant: the engine owns sequences and their caches; the
//! model stays immutable and shared, the KV store stays ignorant of text.

pub mod blend;
mod decoding;
pub mod draft_model;
mod error;
mod generation;
pub mod grammar;
mod handle;
pub mod logprobs;
pub mod metrics;
pub mod pooled;
mod rng;
mod sampling;
pub mod scheduler;
pub mod speculate;
mod stop;

pub use blend::{blend, BlendReport, DEFAULT_BLEND_RATIO};
pub use decoding::{push_token_end, Accepted, Decoding, FinishReason};
pub use draft_model::{DraftModel, DraftState};
/// The context-policy seam (`engram-policy`), re-exported for the engine's callers.
pub use engram_policy::{
    AdmitRequest, BackgroundDone, BackgroundJob, BackgroundOutput, BackgroundPriority, Checkout, ContextPolicy, ControlError, ControlReply,
    IdleInterrupt, MatchKind, OwnerKey, OwnerKind, PendingRestore, PolicyControl, PolicyGauge, PolicyLayer, PolicyStats, Readiness, Repair,
    Retired,
};
pub use error::EngineError;
pub use generation::{Generation, Timings};
pub use grammar::{Grammar, GrammarCompiler, GrammarState};
pub use handle::{EngineHandle, SubmitError};
pub use logprobs::TokenLogprob;
pub use metrics::Metrics;
pub use pooled::PooledEncoder;
pub use rng::Rng;
pub use sampling::{argmax, Sampler, SamplingParams};
pub use scheduler::{
    drain_background, generate_on_cache, run_alone, run_engine, AloneRun, Command, DraftBudget, Event, EventSink, Job, JobError,
    JobErrorKind, LoneSequence, SchedulerConfig, Stepped, SteppedJob, DEFAULT_PREFILL_CHUNK,
};
pub use speculate::{DraftTree, PromptLookup};
pub use stop::StopMatcher;
