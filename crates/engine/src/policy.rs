//! The context-policy seam: what a job reuses, what is kept, evicted and persisted, decided
//! outside the scheduler. The scheduler calls a [`ContextPolicy`] at admission
//! ([`ContextPolicy::admit`]), before growing a sequence ([`ContextPolicy::make_room`]),
//! at retirement ([`ContextPolicy::retire`]) and, when no job is waiting or running, for
//! background work in slices ([`ContextPolicy::idle_slice`]).
//!
//! The default policy is [`SessionStore`]: sessions matched by characters (EXACT / EXTEND /
//! DIVERGE), the shared prefix index, persistence to the disk tier, one RAM eviction path.
//!
//! Invariant: a checkout's cache holds exactly `tokens[..reused]` (what the policy promises
//! the scheduler); a policy builds caches only through `engram-kv`.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use engram_context::{Checkout, PendingRestore, SessionStore};
use engram_kv::SeqKv;
use engram_tokenizer::Tokenizer;

/// What idle work asks between its own small steps (a decode step, a prefill chunk, a file):
/// whether a job was submitted since the idle hook began. When it says yes, the work stops at
/// that step boundary, keeps what it finished (or drops the unfinished rest whole) and returns,
/// so the job waits for at most one step of it, not a whole slice.
///
/// Invariant: [`IdleInterrupt::requested`] only reads counters (one relaxed load each); it
/// never blocks and never changes what the work computes, only where it stops.
#[derive(Clone, Debug, Default)]
pub struct IdleInterrupt {
    counters: Vec<Arc<AtomicUsize>>,
}

impl IdleInterrupt {
    /// Never requested (benches and tools that run idle work alone).
    pub fn never() -> IdleInterrupt {
        IdleInterrupt::default()
    }

    /// Requested while `submitted` (jobs submitted and not yet finished; the engine's
    /// `pending` count, which is 0 whenever the idle hook starts) is above zero.
    pub fn on_submitted(submitted: Arc<AtomicUsize>) -> IdleInterrupt {
        IdleInterrupt { counters: vec![submitted] }
    }

    /// Also requested while `waiters` is above zero (e.g. request handlers waiting for a lock
    /// the idle work holds, counted by the policy that owns the lock).
    pub fn or_while(mut self, waiters: Arc<AtomicUsize>) -> IdleInterrupt {
        self.counters.push(waiters);
        self
    }

    /// Whether someone waits for the engine: stop at the next step boundary.
    pub fn requested(&self) -> bool {
        self.counters.iter().any(|c| c.load(Relaxed) > 0)
    }
}

/// A sequence handed back at retirement.
pub struct Retired {
    pub owner: String,
    pub session_id: String,
    /// The prompt text plus the decoded text (empty for prompts sent as token ids).
    pub text: String,
    /// Exactly what `kv` holds.
    pub tokens: Vec<u32>,
    /// Per token, where its text ends in `text` (zeros for id prompts).
    pub token_ends: Vec<usize>,
    pub kv: SeqKv,
    /// The last token sampled but never fed, when generation stopped at its length or was
    /// cancelled (not after a stop token or string): a policy that keeps the turn for a later
    /// request must put it first in that request's context (`text` already holds its text).
    pub unfed: Option<u32>,
}

/// Gauges a policy reports (the server's `/metrics`).
#[derive(Clone, Copy, Debug, Default)]
pub struct PolicyStats {
    pub sessions_idle: u64,
    pub sessions_on_disk: u64,
    pub sessions_restored: u64,
    pub disk_bytes_used: u64,
    /// Whole turns evicted and turn views masked, since start (dual-stream contexts).
    pub turns_evicted: u64,
    pub turns_masked: u64,
    /// Persistent streams summarized and compacted, since start (dual-stream contexts).
    pub summaries: u64,
    pub compactions: u64,
}

/// Decides what each sequence reuses and what is kept. See the module doc.
pub trait ContextPolicy: Send {
    /// What `owner` reuses for a prompt given as `text` (matched by characters; `add_special`
    /// is how it tokenizes cold) or, with `text` `None`, as the token ids `prompt`.
    fn admit(
        &mut self,
        owner: &str,
        session: Option<&str>,
        text: Option<&str>,
        add_special: bool,
        prompt: &[u32],
        tok: &Tokenizer,
    ) -> Result<Checkout, String>;

    /// `owner`'s saved state is pinned on disk (a named agent's).
    fn pin_owner(&mut self, owner: &str);

    /// Frees RAM until `bytes` more fit the KV budget; whether they do.
    fn make_room(&mut self, bytes: usize) -> bool;

    /// Waits for a restored file's checksum; true if it is sound (see [`Checkout::restore`]).
    fn verify_restore(&mut self, restore: PendingRestore) -> bool;

    /// Keeps (or drops) a finished sequence.
    fn retire(&mut self, retired: Retired);

    /// Drops everything kept for `owner`, in RAM and on disk.
    fn forget_owner(&mut self, owner: &str);

    /// Gauges for metrics.
    fn stats(&self) -> PolicyStats;
    /// Sets `owner`'s persistent stream (a system prompt and facts, as tokens) for policies
    /// that keep one (dual-stream contexts); others ignore it.
    fn set_anchors(&mut self, _owner: &str, _tokens: Vec<u32>) {}

    /// Sets `owner`'s live facts, in order, for policies that keep a persistent stream: a
    /// fact no longer listed is tombstoned, a new one appended; others ignore it.
    fn set_facts(&mut self, _owner: &str, _facts: Vec<crate::dual::FactSegment>) {}

    /// Sets the state entry of `owner`'s `thread` (a pinned entry replaced in place: the
    /// dual-stream hybrid mode, `DualStream::set_state`); empty `tokens` removes it. Policies
    /// without threads refuse.
    fn set_state(&mut self, _owner: &str, _thread: &str, _tokens: Vec<u32>) -> Result<(), String> {
        Err("state entries need dual-stream contexts (--context dual)".into())
    }

    /// Runs one slice of background work (precomputing a likely next prompt, compacting,
    /// prefetching) while nothing waits: short enough that a job arriving meanwhile waits at
    /// most this one slice, and a long slice checks `interrupt` between its own steps and
    /// returns early when it is requested. Returns whether more work remains. The default has
    /// none.
    fn idle_slice(&mut self, _interrupt: &IdleInterrupt) -> bool {
        false
    }
}

impl ContextPolicy for SessionStore {
    fn admit(
        &mut self,
        owner: &str,
        session: Option<&str>,
        text: Option<&str>,
        add_special: bool,
        prompt: &[u32],
        tok: &Tokenizer,
    ) -> Result<Checkout, String> {
        match text {
            Some(text) => self.checkout(owner, session, text, add_special, tok).map_err(|e| e.to_string()),
            None => Ok(self.checkout_tokens(owner, session, prompt)),
        }
    }

    fn pin_owner(&mut self, owner: &str) {
        SessionStore::pin_owner(self, owner)
    }

    fn make_room(&mut self, bytes: usize) -> bool {
        SessionStore::make_room(self, bytes)
    }

    fn verify_restore(&mut self, restore: PendingRestore) -> bool {
        SessionStore::verify_restore(self, restore)
    }

    fn retire(&mut self, r: Retired) {
        self.checkin(&r.owner, &r.session_id, r.text, r.tokens, r.token_ends, r.kv)
    }

    fn forget_owner(&mut self, owner: &str) {
        SessionStore::forget_owner(self, owner)
    }

    fn stats(&self) -> PolicyStats {
        PolicyStats {
            sessions_idle: self.len() as u64,
            sessions_on_disk: self.on_disk_count() as u64,
            sessions_restored: self.restored_count(),
            disk_bytes_used: self.disk_used_bytes(),
            ..PolicyStats::default()
        }
    }
}
