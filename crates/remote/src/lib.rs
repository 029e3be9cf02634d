//! # engram-remote — the remote KV tier
//!
//! A tier under RAM and disk that a fleet of Engram servers shares: Redis (or Valkey, which
//! speaks the same protocol). A replica that has not seen a conversation finds its KV here
//! instead of prefilling it again.
//!
//! - [`RemoteTier`]: the shared handle — connection links with timeouts and backoff, plain or
//!   TLS (`rediss://`, rustls; `link.rs`), run values over plain TCP read by a lean reader
//!   (`bulk.rs`), the write-behind thread (`writer.rs`), tenants'
//!   records (an agent's definition, with a tombstone once deleted), stamped records that any
//!   replica may overwrite, newest stamp winning (a user's facts, a thread's state entry;
//!   `stamped.rs`), counters ([`RemoteStats`], shown as `engram_remote_*`).
//! - [`RemoteKv`]: the tier for one model's caches — sessions saved as content-addressed runs
//!   of blocks plus a manifest, restored on a local miss with a few pipelined `MGET`s;
//!   prefix chains found by the same run keys.
//! - [`keys`]: the key scheme (per tenant, per model, per chain) and the ACL pattern of a
//!   tenant.
//! - [`testing`]: a throwaway `redis-server` for this crate's tests and its users'.
//!
//! Invariants: a value is used only after every check a disk entry passes (checksum,
//! fingerprint, owner, tokens) — one that fails is a miss, counted, never a wrong answer;
//! nothing on a request's path writes to the store; every read is bounded by the timeout,
//! and a store that is down costs each lookup only a clock check until its backoff passes.
//! The store bounds itself (`maxmemory` with an LRU/LFU policy): a key it evicted is a miss.

mod bulk;
mod config;
pub mod keys;
mod link;
mod links;
mod manifest;
mod stamped;
mod stats;
pub mod testing;
mod tier;
mod writer;

pub use config::{RemoteConfig, DEFAULT_MAX_QUEUED, DEFAULT_RUN_TOKENS, DEFAULT_TIMEOUT};
pub use keys::tenant_key_pattern;
pub use link::{LinkError, BACKOFF_MAX, BACKOFF_MIN};
pub use manifest::Manifest;
pub use stamped::{next_stamp, StampedRecord};
pub use stats::RemoteStats;
pub use tier::{common_prefix, redact, RecordState, RemoteKv, RemoteTier};
