//! A thread's state entry (the hybrid mode, the dual-stream design's fitness-app case: state
//! that changes often, kept out of the append-only persistent stream): a pinned entry first in
//! the thread's ring, right after the anchors, replaced in place on each update.
//!
//! ```text
//!  set_state(user, thread, tokens) ─► a Blocking job for the engine: prefill `tokens` at the
//!                                     ring's first turn position over the anchors alone
//!  (the engine holds the thread's next request until the job ends)
//!  state_done ─► the entry put first in the ring (or replaced in place); the turns after it
//!                moved to follow its new length, not recomputed
//! ```
//!
//! Invariant: only the engine runs the model; a state entry's KV is what a prefill of its
//! tokens over the anchors computes, and only the newest entry set for a thread is kept (an
//! older job's result is dropped). A job computed over anchors the thread has since left
//! (its stream changed) is computed again over the new ones, never kept stale.

use engram_kv::SeqKv;
use engram_policy::{BackgroundDone, BackgroundJob, BackgroundPriority, Checkout, MatchKind, OwnerKey};

use super::DualStream;

/// What a state entry's job is for.
pub(super) struct StateJob {
    pub user: String,
    pub thread: String,
    /// The thread's stream generation and the position the entry was computed at.
    generation: u64,
    at: usize,
    tokens: Vec<u32>,
}

impl DualStream {
    /// Sets the state entry of `user`'s `thread`: a pinned entry first in the thread's ring,
    /// right after the anchors, replaced in place on each update — only its own tokens
    /// prefilled (by the engine, before the thread's next request), attending the anchors
    /// alone; the turns after it moved to follow its new length, not recomputed (their KV keeps
    /// what they attended when computed: the old state) — never evicted, never masked, counted
    /// in the ring's capacity (turns past it are evicted, oldest first, never the newest).
    /// Empty `tokens` removes it at once. Errors (the thread's ring unchanged): the model's
    /// context; a failure of the prefill itself is logged when the engine reports it, and the
    /// previous entry stays.
    pub fn set_state(&mut self, user: &str, thread: &str, tokens: Vec<u32>) -> Result<(), String> {
        if self.stream_job_pending(user) {
            // Computed over the stream the engine is prefilling: set once it is (an earlier
            // entry for the same thread is replaced, as a newer set replaces an older one).
            let deferred = self.deferred_states.entry(user.to_string()).or_default();
            deferred.retain(|(t, _)| t != thread);
            deferred.push((thread.to_string(), tokens));
            return Ok(());
        }
        let max_positions = self.model.config.max_positions;
        self.thread(user, thread)?;
        // A ring just restored from disk: its files are checked here, not beside a prefill.
        if let Some(p) = self.unsettled.take() {
            if !self.settle_ring(p) {
                self.thread(user, thread)?;
            }
        }
        let t = self.threads.get_mut(&(user.to_string(), thread.to_string())).expect("opened above");
        if t.pending.is_some() {
            t.state_while_pending = Some(tokens.clone());
        }
        if tokens.is_empty() {
            t.state_job = None;
            if let Some(id) = t.state.take() {
                t.ring.remove(id).map_err(|e| format!("removing the state entry: {e}"))?;
                self.save_ring(user, thread);
            }
            return Ok(());
        }
        let at = t.ring.persistent_len();
        if at + tokens.len() + t.ring.ephemeral_len() >= max_positions {
            return Err(format!("a state entry of {} tokens does not fit the model's context of {max_positions}", tokens.len()));
        }
        self.next_job += 1;
        let tag = self.next_job;
        t.state_job = Some(tag);
        let n = tokens.len();
        let mut start = Checkout::own(thread.to_string(), MatchKind::Miss, tokens.clone(), vec![0; n], 0, SeqKv::new(&self.pool));
        start.spans = t.ring.anchor_spans();
        start.own_first = Some(at);
        self.background.push_back(BackgroundJob {
            owner: OwnerKey::parse(user),
            tag,
            start,
            max_tokens: 0,
            stop: Vec::new(),
            priority: BackgroundPriority::Blocking,
            hidden: Vec::new(),
        });
        let generation = t.generation;
        self.state_jobs.insert(tag, StateJob { user: user.to_string(), thread: thread.to_string(), generation, at, tokens });
        Ok(())
    }

    /// A state entry's prefill ended: the newest one for its thread joins the ring.
    pub(super) fn state_done(&mut self, done: BackgroundDone) {
        let Some(job) = self.state_jobs.remove(&done.tag) else { return };
        let key = (job.user.clone(), job.thread.clone());
        let Some(t) = self.threads.get_mut(&key) else { return };
        if t.state_job != Some(done.tag) {
            return;
        }
        t.state_job = None;
        let out = match done.outcome {
            Ok(out) => out,
            Err(e) => {
                tracing::warn!("the state entry of thread {:?} of {:?} is not set: {e}", job.thread, job.user);
                return;
            }
        };
        if t.generation != job.generation || t.ring.persistent_len() != job.at {
            // The thread moved onto a new stream meanwhile: computed again over its anchors.
            if let Err(e) = self.set_state(&job.user, &job.thread, job.tokens) {
                tracing::warn!("the state entry of thread {:?} of {:?} is not set: {e}", job.thread, job.user);
            }
            return;
        }
        let n = job.tokens.len() as u64;
        let placed = match t.state {
            Some(id) => t.ring.replace(id, job.tokens, out.kv).map(Option::unwrap_or_default),
            None => t.ring.push_front_pinned(job.tokens, out.kv).map(|(id, evicted)| {
                t.state = Some(id);
                evicted
            }),
        };
        match placed {
            Ok(evicted) => {
                self.stats.turns_evicted += evicted.len() as u64;
                self.stats.states_set += 1;
                self.stats.state_tokens_prefilled += n;
                self.save_ring(&job.user, &job.thread);
            }
            Err(e) => tracing::warn!("the state entry of thread {:?} of {:?} is not set: {e}", job.thread, job.user),
        }
    }
}
