//! A user's persistent stream prefilled by the engine: when the user's anchors or facts change
//! through the policy's messages (a chat turn sends them before its request), the tokens the
//! stream does not hold yet become a background job that every request of the user waits on
//! (`BlockingOwner`: all its threads attend the stream), its tombstoned segments hidden from
//! the new tokens as [`crate::PersistentStream::prefill`] hides them.
//!
//! ```text
//!  refresh (anchors/facts changed) ─► marked; when the engine next asks for work (every message
//!                                     of its pass applied): the stream's file restored if any,
//!                                     the tokens past its KV a BlockingOwner job (the KV so far
//!                                     forked as its start)
//!  a state entry set meanwhile     ─► deferred until the job ends (it is computed over the stream)
//!  done  ─► the stream's KV replaced by the job's, the file written, deferred entries set
//!  changed again meanwhile ─► the result dropped (the change queued a job of its own)
//! ```
//! An admission that still finds the stream short (no message came first) asks for the same
//! job through [`engram_policy::ContextPolicy::prepare`] and waits on it; after a failed job
//! the admission fails with its error, and the next request queues the prefill again. The
//! policy never runs the model itself.
//!
//! Invariant: a job's KV replaces the stream's only while the stream is still the generation
//! the job started from and still short of it, so the stream's KV always holds its tokens at
//! their positions, each attending only the live tokens before it (`crates/dual/tests/it/facts.rs`).

use engram_engine::SchedulerConfig;
use engram_kv::SeqKv;
use engram_policy::{BackgroundDone, BackgroundJob, BackgroundPriority, Checkout, MatchKind, OwnerKey};

use super::DualStream;

/// The session a stream's job names (it holds every session of its owner anyway).
const STREAM_SESSION: &str = "";

/// What a stream job in flight is for.
pub(super) struct StreamJob {
    pub user: String,
    /// The stream's generation it prefills.
    generation: u64,
}

impl DualStream {
    /// Queues the prefill of `user`'s stream for the engine when it holds tokens its KV does not
    /// (after restoring what its file holds), replacing a queued job of an older generation.
    pub(super) fn queue_stream_prefill(&mut self, user: &str) {
        // A summary due at the session's start changes the stream before anything of it is
        // computed: written first, so the prefill is of the summarized stream.
        self.summarize_at_start(user);
        self.restore_stream(user);
        let Some(u) = self.users.get_mut(user) else { return };
        let (have, len, generation) = (u.stream.prefilled_len(), u.stream.len(), u.stream.generation());
        if u.stream_job.is_some_and(|(_, g)| g == generation) {
            return;
        }
        if len == 0 || have >= len {
            // Nothing to compute (the file held it all): a job of an older generation is moot.
            self.drop_stream_job(user);
            return;
        }
        // A job for an older generation: never run if still queued, else its result dropped.
        self.cancel_stream_job(user);
        self.stream_failures.remove(user);
        let Some(u) = self.users.get_mut(user) else { return };
        let kv = u.stream.partial_kv().map_or_else(|| SeqKv::new(&self.pool), |kv| kv.fork(have));
        let tokens = u.stream.tokens();
        let n = tokens.len();
        self.next_job += 1;
        let tag = self.next_job;
        u.stream_job = Some((tag, generation));
        self.background.push_back(BackgroundJob {
            owner: OwnerKey::parse(user),
            tag,
            start: Checkout::own(STREAM_SESSION.into(), MatchKind::Prefix, tokens, vec![0; n], have, kv),
            max_tokens: 0,
            stop: Vec::new(),
            priority: BackgroundPriority::BlockingOwner,
            hidden: u.stream.masked_ranges(),
        });
        self.stream_jobs.insert(tag, StreamJob { user: user.to_string(), generation });
    }

    /// Forgets `user`'s stream job once the stream is complete without it (an admission
    /// prefilled it, or its file held it): a queued job is never run, a running one's result is
    /// dropped, and the state entries deferred for it are set now.
    pub(super) fn drop_stream_job(&mut self, user: &str) {
        self.streams_changed.remove(user);
        self.cancel_stream_job(user);
        for (thread, tokens) in self.deferred_states.remove(user).unwrap_or_default() {
            if let Err(e) = self.set_state(user, &thread, tokens) {
                tracing::warn!("the state entry of thread {thread:?} of {user:?} is not set: {e}");
            }
        }
    }

    /// Forgets `user`'s stream job in flight, if any: a queued one is never run, a running
    /// one's result is dropped when it arrives (its tag is no longer the user's).
    fn cancel_stream_job(&mut self, user: &str) {
        if let Some((tag, _)) = self.users.get_mut(user).and_then(|u| u.stream_job.take()) {
            self.background.retain(|j| j.tag != tag);
            self.stream_jobs.remove(&tag);
        }
    }

    /// Queues `user`'s stream prefill and runs that job on this thread through the engine's
    /// step, handing its end to [`DualStream::stream_done`] (a caller driving the policy without
    /// an engine: [`DualStream::admit_tokens`]).
    pub(super) fn run_stream_job_here(&mut self, user: &str) {
        self.streams_changed.remove(user);
        self.queue_stream_prefill(user);
        let Some((tag, _)) = self.users.get(user).and_then(|u| u.stream_job) else { return };
        let Some(i) = self.background.iter().position(|j| j.tag == tag) else { return };
        let job = self.background.remove(i).expect("index in range");
        let config = SchedulerConfig::default();
        let run = engram_engine::run_alone(&self.model, self.pool.clone(), config, job, None, &mut || false);
        let done =
            run.map(|r| r.done).unwrap_or_else(|| BackgroundDone { owner: OwnerKey::parse(user), tag, outcome: Err("stopped".into()) });
        if let Err(done) = self.stream_done(done) {
            tracing::warn!("a stream job's end was not a stream job's (tag {})", done.tag);
        }
    }

    /// Whether `user`'s stream waits for the engine's prefill (queued, or to be queued when the
    /// engine next asks for work).
    pub(super) fn stream_job_pending(&self, user: &str) -> bool {
        self.users
            .get(user)
            .is_some_and(|u| u.stream_job.is_some() || (self.streams_changed.contains(user) && u.stream.prefilled_len() < u.stream.len()))
    }

    /// A stream job ended: its KV put in place if still wanted, then the user's deferred state
    /// entries set. `Err(done)` hands back a job that is not a stream's.
    pub(super) fn stream_done(&mut self, done: BackgroundDone) -> Result<(), BackgroundDone> {
        let Some(job) = self.stream_jobs.remove(&done.tag) else { return Err(done) };
        let user = job.user;
        let Some(u) = self.users.get_mut(&user) else { return Ok(()) };
        if u.stream_job.map(|(tag, _)| tag) != Some(done.tag) {
            return Ok(());
        }
        u.stream_job = None;
        match done.outcome {
            Ok(out) if u.stream.generation() == job.generation && u.stream.prefilled_len() < u.stream.len() => {
                match u.stream.set_prefilled(out.kv) {
                    Ok(()) => {
                        self.stats.anchors_prefilled += 1;
                        self.save_stream(&user);
                    }
                    Err(e) => {
                        tracing::warn!("{user:?}: the persistent stream's prefill is not used: {e}");
                        self.stream_failures.insert(user.clone(), e);
                    }
                }
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!("{user:?}: the persistent stream was not prefilled: {e}");
                self.stream_failures.insert(user.clone(), e);
            }
        }
        let deferred: Vec<(String, Vec<u32>)> = self.deferred_states.remove(&user).unwrap_or_default();
        for (thread, tokens) in deferred {
            if let Err(e) = self.set_state(&user, &thread, tokens) {
                tracing::warn!("the state entry of thread {thread:?} of {user:?} is not set: {e}");
            }
        }
        Ok(())
    }
}
