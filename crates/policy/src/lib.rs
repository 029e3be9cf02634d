//! # engram-policy — the context-policy seam
//!
//! What the engine asks of whatever decides what a sequence reuses, keeps, evicts and persists,
//! in types that belong to no policy:
//!
//! - [`ContextPolicy`]: admission ([`AdmitRequest`] → [`Readiness`], then [`Checkout`]), room in the KV budget,
//!   restores to settle ([`PendingRestore`]), retirement ([`Retired`]), owners pinned and
//!   forgotten ([`OwnerKey`]), gauges ([`PolicyStats`]), background work in slices
//!   ([`IdleInterrupt`]), forward work run by the engine for the policy ([`BackgroundJob`],
//!   [`BackgroundDone`]) and policy-specific control ([`PolicyControl`]).
//! - [`PolicyLayer`]: how a wrapper policy composes — it names its inner policy and overrides
//!   only what it changes; every other method forwards by default.
//! - [`testing`]: a recording policy and [`testing::exercise_every_method`], with which each
//!   wrapper's test proves that every seam method reaches its inner policy.
//!
//! Architecture invariant: this crate knows no policy. It depends only on the KV store (the
//! caches a checkout hands over) and the tokenizer (what `admit` tokenizes with); the engine,
//! every policy and the server depend on it, never the other way round. A policy's own
//! messages (a dual-stream user's facts, say) are that policy's types, carried opaquely by
//! [`PolicyControl`].

mod background;
mod checkout;
mod control;
mod idle;
mod layer;
mod owner;
mod restore;
mod seam;
mod stats;
pub mod testing;

pub use background::{BackgroundDone, BackgroundJob, BackgroundOutput, BackgroundPriority};
pub use checkout::{AdmitRequest, Checkout, MatchKind, Readiness, Repair, Retired};
pub use control::{ControlError, ControlReply, PolicyControl};
pub use idle::IdleInterrupt;
pub use layer::PolicyLayer;
pub use owner::{OwnerKey, OwnerKind};
pub use restore::PendingRestore;
pub use seam::ContextPolicy;
pub use stats::{GaugeKind, PolicyGauge, PolicyStats};
