//! Counters of the remote tier, shared by its reader (the engine thread) and its writer thread,
//! read by `/metrics` as `engram_remote_*`.
//!
//! Invariant: counters only grow; `connected` says whether the last attempt through any link
//! reached the store.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

#[derive(Default)]
struct Counters {
    lookups: AtomicU64,
    hits: AtomicU64,
    tokens_restored: AtomicU64,
    read_errors: AtomicU64,
    bad_values: AtomicU64,
    bytes_read: AtomicU64,
    writes: AtomicU64,
    write_errors: AtomicU64,
    writes_dropped: AtomicU64,
    bytes_written: AtomicU64,
    runs_skipped: AtomicU64,
    connected: AtomicBool,
}

/// A handle to the tier's counters (clones share them).
#[derive(Clone, Default)]
pub struct Stats(Arc<Counters>);

/// The counters at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteStats {
    /// Lookups made on a local miss (sessions, prefix chains, records).
    pub lookups: u64,
    /// Lookups that found something usable.
    pub hits: u64,
    /// Tokens of KV restored from the tier.
    pub tokens_restored: u64,
    /// Reads that failed (store down, timed out, refused) or were skipped during a backoff.
    pub read_errors: u64,
    /// Values that failed a check (checksum, fingerprint, owner, tokens): treated as misses.
    pub bad_values: u64,
    /// Bytes of values read.
    pub bytes_read: u64,
    /// Writes completed (a session's runs and manifest, a record, a deletion).
    pub writes: u64,
    /// Writes that failed at the store.
    pub write_errors: u64,
    /// Writes dropped before reaching the store (queue full, shed to free RAM, backoff).
    pub writes_dropped: u64,
    /// Bytes of values written.
    pub bytes_written: u64,
    /// Runs not written because the store already held them.
    pub runs_skipped: u64,
    /// Whether the last attempt through any link reached the store.
    pub connected: bool,
}

impl Stats {
    pub(crate) fn connected(&self, up: bool) {
        self.0.connected.store(up, Relaxed);
    }
    pub(crate) fn lookup(&self) {
        self.0.lookups.fetch_add(1, Relaxed);
    }
    pub(crate) fn hit(&self, tokens: usize) {
        self.0.hits.fetch_add(1, Relaxed);
        self.0.tokens_restored.fetch_add(tokens as u64, Relaxed);
    }
    pub(crate) fn read_error(&self) {
        self.0.read_errors.fetch_add(1, Relaxed);
    }
    pub(crate) fn bad_value(&self) {
        self.0.bad_values.fetch_add(1, Relaxed);
    }
    pub(crate) fn read_bytes(&self, n: usize) {
        self.0.bytes_read.fetch_add(n as u64, Relaxed);
    }
    pub(crate) fn wrote(&self, bytes: usize) {
        self.0.writes.fetch_add(1, Relaxed);
        self.0.bytes_written.fetch_add(bytes as u64, Relaxed);
    }
    pub(crate) fn write_error(&self) {
        self.0.write_errors.fetch_add(1, Relaxed);
    }
    pub(crate) fn dropped(&self, n: usize) {
        self.0.writes_dropped.fetch_add(n as u64, Relaxed);
    }
    pub(crate) fn runs_skipped(&self, n: usize) {
        self.0.runs_skipped.fetch_add(n as u64, Relaxed);
    }

    /// The counters now.
    pub fn snapshot(&self) -> RemoteStats {
        let c = &self.0;
        RemoteStats {
            lookups: c.lookups.load(Relaxed),
            hits: c.hits.load(Relaxed),
            tokens_restored: c.tokens_restored.load(Relaxed),
            read_errors: c.read_errors.load(Relaxed),
            bad_values: c.bad_values.load(Relaxed),
            bytes_read: c.bytes_read.load(Relaxed),
            writes: c.writes.load(Relaxed),
            write_errors: c.write_errors.load(Relaxed),
            writes_dropped: c.writes_dropped.load(Relaxed),
            bytes_written: c.bytes_written.load(Relaxed),
            runs_skipped: c.runs_skipped.load(Relaxed),
            connected: c.connected.load(Relaxed),
        }
    }
}
