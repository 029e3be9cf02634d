//! [`DualStream`]'s summaries when the summarizer is the engine's own model: the policy never
//! runs the model; a user whose live facts pass the cap gets two low-priority background jobs
//! that the engine runs as sequences of its batch, within its background share of each step, so
//! a busy server still condenses streams (a summarizer model of its own runs on the idle hook
//! instead, `policy/summary.rs`).
//!
//! ```text
//!  facts past the cap ─▶ Low job: the summarizer's prompt, greedy, at most the target tokens,
//!                        ended by a blank line
//!  its text           ─▶ Summary (the main model's segment tokens) ─▶ Low job: the new stream
//!                        (base + summary) prefilled beside the old one, forked from it as far as
//!                        their tokens agree
//!  prefilled          ─▶ swap: the new stream replaces the old whole; threads move onto it at
//!                        their next admission (a running turn keeps the view it started with)
//!  facts or anchors change mid-flight ─▶ the result is dropped and a summary of the new facts
//!                                        queued (never a summary of stale facts)
//! ```
//! Until the swap every thread attends the old stream: a turn admitted mid-summary answers
//! exactly as if no summary were running.
//!
//! Invariant: a summary swapped in condenses exactly the user's live facts at the swap, and the
//! new stream is swapped in only wholly prefilled, its KV what a prefill of its tokens computes
//! (the engine's step, `crates/dual/tests/it/summary_sched.rs`).

use std::time::Instant;

use engram_kv::SeqKv;
use engram_policy::{BackgroundDone, BackgroundJob, BackgroundPriority, Checkout, MatchKind, OwnerKey};

use super::{DualStream, Summary};
use crate::summarize::{summary_job, SUMMARY_SESSION};
use crate::PersistentStream;

/// What a summary job in flight is for.
pub(super) struct SummaryTicket {
    pub user: String,
    /// The facts it condenses (the user's live facts when it was queued).
    covers: Vec<u64>,
    queued: Instant,
    phase: Phase,
}

enum Phase {
    /// The summarizer's prompt runs.
    Generating,
    /// The new stream (without its KV, which the job holds) and the generation of the old one
    /// it was staged from.
    Prefilling { summary: Summary, stream: PersistentStream, from: u64, generating_us: u64 },
}

impl DualStream {
    /// Whether summaries run as the engine's background jobs (the summarizer is the engine's
    /// own model).
    pub(super) fn summaries_in_engine(&self) -> bool {
        self.summarizer.as_ref().is_some_and(|s| s.runs_in_engine(&self.model))
    }

    /// Queues `user`'s summary for the engine when one is due and none is in flight. A prompt
    /// that cannot be summarized is logged and the stream stays over its cap.
    pub(super) fn queue_summary(&mut self, user: &str) {
        if !self.summaries_in_engine() {
            return;
        }
        let Some(summarizer) = self.summarizer.as_ref() else { return };
        let Some(u) = self.users.get_mut(user) else { return };
        if !u.summary_due || u.engine_summary.is_some() {
            return;
        }
        let texts: Vec<String> = u.facts.iter().map(|f| f.text.clone()).collect();
        let prompt = match summarizer.prompt_tokens(&texts) {
            Ok(p) => p,
            Err(e) => {
                u.summary_due = false;
                tracing::warn!("{user:?}: the persistent stream is over its cap and could not be summarized: {e}");
                return;
            }
        };
        self.next_job += 1;
        let tag = self.next_job;
        u.engine_summary = Some(tag);
        self.background.push_back(summary_job(OwnerKey::parse(user), tag, prompt, summarizer.target_tokens(), &self.pool));
        let covers = u.facts.iter().map(|f| f.id).collect();
        self.summary_jobs.insert(tag, SummaryTicket { user: user.to_string(), covers, queued: Instant::now(), phase: Phase::Generating });
    }

    /// A summary's text is written (`generating_us` spent on it, here or by a summarizer
    /// model of its own on the idle hook): a stream nothing of which is computed yet takes it at
    /// once (its prefill is then the stream's own, `policy/stream_job.rs`); otherwise the new
    /// stream is prefilled by the engine beside the old one, a Low job, and swapped in when it
    /// is done ([`DualStream::summary_done`]).
    pub(super) fn summary_written(&mut self, user: &str, summary: Summary, generating_us: u64) {
        let Some(u) = self.users.get_mut(user) else { return };
        if u.stream.prefilled_len() == 0 {
            let t = Instant::now();
            u.stream = u.stream.staged(u.wanted_with(Some(&summary)));
            u.summary = Some(summary);
            u.summary_due = false;
            self.stats.summaries += 1;
            self.stats.last_summary_us = generating_us;
            self.stats.last_summary_prefill_us = 0;
            self.stats.last_swap_us = t.elapsed().as_micros() as u64;
            self.streams_changed.insert(user.to_string());
            return;
        }
        let covers = summary.covers.clone();
        let mut stream = u.stream.staged(u.wanted_with(Some(&summary)));
        let kv = stream.take_kv().unwrap_or_else(|| SeqKv::new(&self.pool));
        let tokens = stream.tokens();
        let (n, reused) = (tokens.len(), kv.len());
        self.next_job += 1;
        let tag = self.next_job;
        u.engine_summary = Some(tag);
        let from = u.stream.generation();
        self.background.push_back(BackgroundJob {
            owner: OwnerKey::parse(user),
            tag,
            start: Checkout::own(SUMMARY_SESSION.into(), MatchKind::Prefix, tokens, vec![0; n], reused, kv),
            max_tokens: 0,
            stop: Vec::new(),
            priority: BackgroundPriority::Low,
            hidden: Vec::new(),
        });
        let phase = Phase::Prefilling { summary, stream, from, generating_us };
        self.summary_jobs.insert(tag, SummaryTicket { user: user.to_string(), covers, queued: Instant::now(), phase });
    }

    /// A summary job ended: the next phase queued, or the new stream swapped in. `Err(done)`
    /// hands back a job that is not a summary's.
    pub(super) fn summary_done(&mut self, done: BackgroundDone) -> Result<(), BackgroundDone> {
        let Some(ticket) = self.summary_jobs.remove(&done.tag) else { return Err(done) };
        let user = ticket.user;
        let Some(u) = self.users.get_mut(&user) else { return Ok(()) };
        if u.engine_summary != Some(done.tag) {
            // Dropped mid-flight (the facts or anchors changed): a newer one is queued.
            return Ok(());
        }
        u.engine_summary = None;
        let failed = |u: &mut super::User, e: String| {
            u.summary_due = false;
            tracing::warn!("{user:?}: the persistent stream is over its cap and could not be summarized: {e}");
        };
        let out = match done.outcome {
            Ok(out) => out,
            Err(e) => {
                failed(u, e);
                return Ok(());
            }
        };
        match ticket.phase {
            Phase::Generating => {
                let generating_us = ticket.queued.elapsed().as_micros() as u64;
                let segment = self.summarizer.as_ref().map(|s| s.segment(&out.text));
                let tokens = match segment {
                    Some(Ok((_, tokens))) => tokens,
                    Some(Err(e)) => return Ok(failed(u, e)),
                    None => return Ok(failed(u, "the summarizer is gone".into())),
                };
                self.next_summary += 1;
                let summary = Summary { id: self.next_summary, covers: ticket.covers.clone(), tokens };
                self.summary_written(&user, summary, generating_us);
            }
            Phase::Prefilling { summary, mut stream, from, generating_us } => {
                if from != u.stream.generation() {
                    // Changed under it (never expected: every change drops the job): again.
                    self.stats.summaries_restarted += 1;
                    self.queue_summary(&user);
                    return Ok(());
                }
                if let Err(e) = stream.set_prefilled(out.kv) {
                    return Ok(failed(u, e));
                }
                let t = Instant::now();
                u.summary = Some(summary);
                u.stream = stream;
                u.summary_due = false;
                self.stats.summaries += 1;
                self.stats.last_summary_us = generating_us;
                self.stats.last_summary_prefill_us = ticket.queued.elapsed().as_micros() as u64;
                self.stats.last_swap_us = t.elapsed().as_micros() as u64;
                self.save_stream(&user);
            }
        }
        Ok(())
    }
}
