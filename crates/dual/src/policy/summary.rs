//! [`DualStream`]'s summaries on the idle hook, for a summarizer model of its own (the engine
//! runs only its model; with the engine's model summaries are its background jobs,
//! `policy/summary_in_engine.rs`) ("generation continues from the old stream, then the new one is
//! swapped in atomically"): a user whose live facts pass the cap gets a summary in flight, advanced a few steps per idle slice and stopped at the
//! first step boundary once a job is submitted ([`IdleInterrupt`]), keeping its progress.
//!
//! ```text
//!  facts past the cap ─▶ generating: the summarizer's prompt in chunks, then decode steps
//!                     ─▶ prefilling: the new stream (base + summary) beside the old one, in chunks
//!                     ─▶ swap: the new stream replaces the old whole; threads move onto it at
//!                        their next admission (a running turn keeps the view it started with)
//!  facts or anchors change mid-flight ─▶ the summary in flight is dropped and started again
//!                                        over the new facts (never a summary of stale facts)
//! ```
//! Until the swap every thread attends the old stream (with the new fact appended): a turn
//! admitted mid-summary answers exactly as if no summary were running.
//!
//! Invariant: a summary stopped and resumed any number of times swaps in the stream one
//! uninterrupted run swaps in, bit for bit (the same forward calls in the same order), and the
//! swap happens only once the new stream is wholly prefilled (`crates/dual/tests/it/summary_job.rs`,
//! `summary_sched.rs`).

use std::time::Instant;

use crate::PersistentStream;

use super::{DualStream, Summary};
use crate::summarize::{SummaryJob, SUMMARY_PREFILL_CHUNK};
use engram_policy::IdleInterrupt;

/// Default most steps a summary advances per idle slice: the slice then returns to the engine,
/// which reads its commands (a fact change) before the next one.
pub(super) const IDLE_STEPS: usize = 8;

/// A summary in flight for one user.
pub(crate) struct InFlight {
    /// The facts it summarizes (all the user's live facts when it started).
    covers: Vec<u64>,
    phase: Phase,
    /// Microseconds spent generating and prefilling so far.
    generating_us: u64,
    prefill_us: u64,
}

enum Phase {
    /// The summarizer runs.
    Generating(SummaryJob),
    /// The new stream, prefilled beside the old one (whose generation it was staged from).
    Prefilling { summary: Summary, stream: PersistentStream, from: u64 },
}

/// How a call left the summary.
enum Outcome {
    Pending,
    Ready,
    Failed(String),
}

impl DualStream {
    /// Sets the most steps (a prefill chunk of the summarizer's prompt or of the new stream, or
    /// one decode step) a summary advances per idle slice (at least 1; default 8).
    pub fn with_idle_steps(mut self, steps: usize) -> DualStream {
        self.idle_steps = steps.max(1);
        self
    }

    /// Whether a summary of `user`'s facts is due or in flight (not yet swapped in).
    pub fn summary_pending(&self, user: &str) -> bool {
        self.users.get(user).is_some_and(|u| u.summary_due)
    }

    /// Drops `user`'s summary in flight (its facts or anchors just changed); the refresh that
    /// follows makes a new one due if the stream is still over its cap.
    pub(super) fn restart_summary(&mut self, user: &str) {
        let Some(u) = self.users.get_mut(user) else { return };
        // An engine job's result is dropped when it arrives (its tag is no longer the user's).
        if u.job.take().is_some() | u.engine_summary.take().is_some() {
            self.stats.summaries_restarted += 1;
        }
    }

    /// One idle slice of summaries: the one in flight, else the first due (by user name).
    /// Returns whether any summary is still due.
    pub(super) fn idle_summaries(&mut self, interrupt: &IdleInterrupt) -> bool {
        if self.summaries_in_engine() {
            // The engine runs them as background jobs: nothing for the idle hook.
            return false;
        }
        let mut due: Vec<(bool, &String)> = self.users.iter().filter(|(_, u)| u.summary_due).map(|(k, u)| (u.job.is_none(), k)).collect();
        due.sort();
        if let Some(user) = due.first().map(|(_, k)| (*k).clone()) {
            self.advance_summary(&user, self.idle_steps, interrupt);
        }
        self.users.values().any(|u| u.summary_due)
    }

    /// Advances `user`'s summary (started if due and not in flight) by at most `max_steps`
    /// steps, stopping before a step once `interrupt` is requested; swaps the new stream in when
    /// it is ready. A failure is logged and leaves the stream as it was (no summary due).
    pub(super) fn advance_summary(&mut self, user: &str, max_steps: usize, interrupt: &IdleInterrupt) {
        if self.summaries_in_engine() {
            return;
        }
        let (Some(summarizer), Some(u)) = (&self.summarizer, self.users.get_mut(user)) else { return };
        if !u.summary_due {
            return;
        }
        let mut job = match u.job.take() {
            Some(job) => job,
            None => {
                let texts: Vec<String> = u.facts.iter().map(|f| f.text.clone()).collect();
                match summarizer.start(&texts) {
                    Ok(j) => InFlight {
                        covers: u.facts.iter().map(|f| f.id).collect(),
                        phase: Phase::Generating(j),
                        generating_us: 0,
                        prefill_us: 0,
                    },
                    Err(e) => {
                        u.summary_due = false;
                        tracing::warn!("{user:?}: the persistent stream is over its cap and could not be summarized: {e}");
                        return;
                    }
                }
            }
        };
        self.stats.summary_slices += 1;
        let mut steps = 0;
        let outcome = loop {
            if steps >= max_steps || interrupt.requested() {
                break Outcome::Pending;
            }
            let t = Instant::now();
            match &mut job.phase {
                Phase::Generating(j) => {
                    let before = j.steps();
                    let result = summarizer.advance(j, max_steps - steps, interrupt);
                    let made = j.steps() - before;
                    steps += made;
                    job.generating_us += t.elapsed().as_micros() as u64;
                    match result {
                        Ok(Some((_, tokens))) => {
                            self.next_summary += 1;
                            let summary = Summary { id: self.next_summary, covers: job.covers.clone(), tokens };
                            let stream = u.stream.staged(u.wanted_with(Some(&summary)));
                            job.phase = Phase::Prefilling { summary, stream, from: u.stream.generation() };
                        }
                        Ok(None) if made == 0 => break Outcome::Pending,
                        Ok(None) => {}
                        Err(e) => break Outcome::Failed(e),
                    }
                }
                Phase::Prefilling { stream, .. } => {
                    let result = stream.prefill_some(&self.model, &self.pool, SUMMARY_PREFILL_CHUNK);
                    job.prefill_us += t.elapsed().as_micros() as u64;
                    steps += 1;
                    match result {
                        Ok(_) if stream.kv().is_some() => break Outcome::Ready,
                        Ok(_) => {}
                        Err(e) => break Outcome::Failed(e),
                    }
                }
            }
        };
        match outcome {
            Outcome::Pending => {
                if interrupt.requested() {
                    self.stats.summary_slices_interrupted += 1;
                }
                u.job = Some(job);
            }
            Outcome::Failed(e) => {
                u.summary_due = false;
                tracing::warn!("{user:?}: the persistent stream is over its cap and could not be summarized: {e}");
            }
            Outcome::Ready => {
                let Phase::Prefilling { summary, stream, from } = job.phase else { unreachable!("ready only when prefilled") };
                if from != u.stream.generation() {
                    // Changed under it (never expected: every change drops the job): start again.
                    self.stats.summaries_restarted += 1;
                    return;
                }
                let t = Instant::now();
                u.summary = Some(summary);
                u.stream = stream;
                u.summary_due = false;
                self.stats.summaries += 1;
                self.stats.last_summary_us = job.generating_us;
                self.stats.last_summary_prefill_us = job.prefill_us;
                self.stats.last_swap_us = t.elapsed().as_micros() as u64;
                self.save_stream(user);
            }
        }
    }
}
