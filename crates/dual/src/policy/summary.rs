//! [`DualStream`]'s summaries written by a summarizer model of its own, on the idle hook (with
//! the engine's own model the summary is the engine's background job,
//! `policy/summary_in_engine.rs`): a user whose live facts pass the cap gets a summary in
//! flight on the summarizer's own engine, advanced a few engine steps per idle slice and stopped
//! at the first step boundary once a job is submitted ([`IdleInterrupt`]), keeping its progress.
//! The policy never runs the main model: the new stream is the main engine's work, as for a
//! summary the engine wrote.
//!
//! ```text
//!  facts past the cap ─▶ writing (idle hook): the summarizer's prompt in chunks, then decode
//!                        steps, on the summarizer's engine
//!  its text           ─▶ DualStream::summary_written: the new stream (base + summary) prefilled
//!                        by the main engine beside the old one (a Low job) ─▶ swap
//!  at the session's start (nothing of the stream computed) ─▶ written to its end before the
//!                        stream's first prefill, which is then of the summarized stream
//!  facts or anchors change mid-flight ─▶ the summary in flight is dropped and started again
//!                                        over the new facts (never a summary of stale facts)
//! ```
//! Until the swap every thread attends the old stream (with the new fact appended): a turn
//! admitted mid-summary answers exactly as if no summary were running.
//!
//! Invariant: a summary stopped and resumed any number of times writes the text one
//! uninterrupted run writes, bit for bit (the same forward calls in the same order), and the
//! swap happens only once the new stream is wholly prefilled (`crates/dual/tests/it/summary_job.rs`,
//! `summary_sched.rs`).

use std::time::Instant;

use super::{DualStream, Summary};
use crate::summarize::SummaryJob;
use engram_policy::IdleInterrupt;

/// Default most steps a summary advances per idle slice: the slice then returns to the engine,
/// which reads its commands (a fact change) before the next one.
pub(super) const IDLE_STEPS: usize = 8;

/// A summary being written for one user by a summarizer model of its own.
pub(crate) struct InFlight {
    /// The facts it summarizes (all the user's live facts when it started).
    covers: Vec<u64>,
    job: SummaryJob,
    /// Microseconds spent generating so far (summed over slices).
    generating_us: u64,
}

impl DualStream {
    /// Sets the most steps (a prefill chunk of the summarizer's prompt, or one decode step) a
    /// summary advances per idle slice (at least 1; default 8).
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
        // Users whose new stream is with the engine wait for it; none of the idle hook's work.
        let writing = |u: &super::User| u.summary_due && u.engine_summary.is_none();
        let mut due: Vec<(bool, &String)> = self.users.iter().filter(|(_, u)| writing(u)).map(|(k, u)| (u.job.is_none(), k)).collect();
        due.sort();
        if let Some(user) = due.first().map(|(_, k)| (*k).clone()) {
            self.advance_summary(&user, self.idle_steps, interrupt);
        }
        self.users.values().any(writing)
    }

    /// The summary due at the session's start (a summarizer model of its own; nothing of the
    /// stream computed yet), written here to its end, resumed if the idle hook began it, so the
    /// first turn attends the summarized stream. Later (a fact appended to a stream already
    /// attended) turns go on over the old stream and the idle hook summarizes.
    pub(super) fn summarize_at_start(&mut self, user: &str) {
        let due = self.users.get(user).is_some_and(|u| u.summary_due && u.engine_summary.is_none() && u.stream.prefilled_len() == 0);
        if due && !self.summaries_in_engine() {
            self.advance_summary(user, usize::MAX, &IdleInterrupt::never());
        }
    }

    /// Advances `user`'s summary (started if due and not in flight) by at most `max_steps`
    /// steps of the summarizer's engine, stopping before a step once `interrupt` is requested;
    /// once its text is written, the new stream goes to the engine ([`DualStream::summary_written`]).
    /// A failure is logged and leaves the stream as it was (no summary due).
    pub(super) fn advance_summary(&mut self, user: &str, max_steps: usize, interrupt: &IdleInterrupt) {
        if self.summaries_in_engine() {
            return;
        }
        let (Some(summarizer), Some(u)) = (&self.summarizer, self.users.get_mut(user)) else { return };
        if !u.summary_due || u.engine_summary.is_some() {
            // Not due, or its new stream is with the engine already.
            return;
        }
        let mut job = match u.job.take() {
            Some(job) => job,
            None => {
                let texts: Vec<String> = u.facts.iter().map(|f| f.text.clone()).collect();
                match summarizer.start(&texts) {
                    Ok(j) => InFlight { covers: u.facts.iter().map(|f| f.id).collect(), job: j, generating_us: 0 },
                    Err(e) => {
                        u.summary_due = false;
                        tracing::warn!("{user:?}: the persistent stream is over its cap and could not be summarized: {e}");
                        return;
                    }
                }
            }
        };
        self.stats.summary_slices += 1;
        let t = Instant::now();
        let result = summarizer.advance(&mut job.job, max_steps, interrupt);
        job.generating_us += t.elapsed().as_micros() as u64;
        match result {
            Ok(Some((_, tokens))) => {
                self.next_summary += 1;
                let summary = Summary { id: self.next_summary, covers: job.covers, tokens };
                self.summary_written(user, summary, job.generating_us);
            }
            Ok(None) => {
                if interrupt.requested() {
                    self.stats.summary_slices_interrupted += 1;
                }
                u.job = Some(job);
            }
            Err(e) => {
                u.summary_due = false;
                tracing::warn!("{user:?}: the persistent stream is over its cap and could not be summarized: {e}");
            }
        }
    }
}
