//! Background sequences: forward work the context policy asks for
//! ([`engram_policy::ContextPolicy::next_background`]) runs as sequences of the batch, through
//! the same admission checks, step, sampling (greedy) and fault containment as requests, and
//! ends in [`engram_policy::ContextPolicy::background_done`] instead of a client's events.
//!
//! ```text
//!  every pass: next_background() ─► a Seq with `background` set (no client, no `pending` count)
//!  each step:  Blocking jobs run as requests do (BlockingOwner: holding every request of
//!              its owner, not only its session's; hidden slots masked for its tokens); Low jobs, while requests run, take rows
//!              only from a credit of `background_share` × the requests' rows of each step,
//!              and prefill at most `background_chunk` tokens a step even alone (a request
//!              arriving then waits for that chunk, not a whole prompt)
//!  end:        background_done(tokens + KV + text | error)
//! ```
//!
//! Invariant: a background job computes what a request with its checkout and greedy sampling
//! computes (same step, same kernels: batched = alone), and ends exactly once; while requests
//! run, Low jobs take at most `background_share` of the rows (plus one row of rounding), so a
//! busy server still makes progress on them at a bounded cost to requests.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use engram_kv::KvView;
use engram_model::KeyMask;

use super::SeqCacheSlot;
use engram_policy::{BackgroundDone, BackgroundJob, BackgroundOutput, BackgroundPriority};

use super::{Engine, Event, EventSink, Seq};
use crate::decoding::Decoding;
use crate::sampling::SamplingParams;

/// Most Low background sequences in the batch at once (Blocking ones are always taken while
/// the batch has a slot).
const MAX_LOW_BACKGROUND: usize = 2;

/// Most jobs taken from the policy and not yet started.
const MAX_QUEUED: usize = 16;

/// What marks a sequence as background work, and how it ends.
pub(super) struct BackgroundSeq {
    pub tag: u64,
    pub priority: BackgroundPriority,
    /// Nothing is sampled: the sequence ends when its prompt is prefilled.
    pub prefill_only: bool,
    /// Own slots its tokens do not attend ([`BackgroundJob::hidden`]).
    pub hidden: Vec<std::ops::Range<usize>>,
    /// Steps it sat out while requests ran ([`BackgroundOutput::held_steps`]).
    pub held_steps: u64,
}

/// The event sink of a background sequence: nobody listens (the result goes to the policy).
struct NoClient;

impl EventSink for NoClient {
    fn send(&self, _event: Event) -> bool {
        true
    }
    fn is_closed(&self) -> bool {
        false
    }
}

impl Seq<'_> {
    /// Low-priority background work (sits out steps beyond the background share).
    pub(super) fn is_low_background(&self) -> bool {
        self.background.as_ref().is_some_and(|b| b.priority == BackgroundPriority::Low)
    }

    /// Background work every request of its owner waits on.
    pub(super) fn holds_owner(&self) -> bool {
        self.background.as_ref().is_some_and(|b| b.priority == BackgroundPriority::BlockingOwner)
    }

    /// This step's mask for a background sequence with hidden slots (`None`: no such slots,
    /// no input this step, or none of them hidden from this step's rows).
    pub(super) fn hidden_mask(&self) -> Option<KeyMask> {
        let b = self.background.as_ref().filter(|b| !b.hidden.is_empty() && !self.input.is_empty())?;
        // Background jobs hold paged KV (their checkout's cache); an own cache has no spans.
        let span_keys = self.kv.view().map_or(0, KvView::span_keys);
        KeyMask::hiding(&b.hidden, span_keys, self.tokens.len(), self.input.len())
    }
}

impl Engine<'_> {
    /// Takes the policy's background jobs into the engine's queue, then into the batch while it
    /// has slots: Blocking ones first, Low ones up to [`MAX_LOW_BACKGROUND`] at a time. A job
    /// whose start cannot run (an empty prompt, past the context) ends at once with its error.
    pub(super) fn pull_background(&mut self) {
        while self.background_queue.len() < MAX_QUEUED {
            match self.policy.next_background() {
                Some(job) => self.background_queue.push_back(job),
                None => break,
            }
        }
        while self.active.len() < self.config.max_batch {
            let low = self.active.iter().filter(|s| s.is_low_background()).count();
            let next = self
                .background_queue
                .iter()
                .position(|j| j.priority.blocks())
                .or_else(|| (low < MAX_LOW_BACKGROUND && !self.background_queue.is_empty()).then_some(0));
            let Some(i) = next else { break };
            let job = self.background_queue.remove(i).expect("index in range");
            let params = SamplingParams { max_tokens: job.max_tokens, stop: job.stop.clone(), ..SamplingParams::default() };
            if let Err(e) = self.start_background_with(job, params) {
                tracing::warn!("background work not started: {e}");
            }
        }
    }

    /// Whether the engine's queue of background jobs takes no more from the policy this pass.
    pub(super) fn background_queue_full(&self) -> bool {
        self.background_queue.len() >= MAX_QUEUED
    }

    /// Ends the queued (not started) background jobs of `owner` with an error.
    pub(super) fn drop_queued_background(&mut self, owner: &engram_policy::OwnerKey) {
        let (gone, keep): (std::collections::VecDeque<_>, _) =
            std::mem::take(&mut self.background_queue).into_iter().partition(|j| &j.owner == owner);
        self.background_queue = keep;
        for j in gone {
            self.metrics.background_jobs.fetch_add(1, Relaxed);
            self.metrics.background_failed.fetch_add(1, Relaxed);
            self.policy.background_done(BackgroundDone { owner: j.owner, tag: j.tag, outcome: Err("its owner was forgotten".into()) });
        }
    }

    /// Starts `job` as a sequence of the batch sampling with `params` (a policy's jobs: greedy,
    /// the job's `max_tokens` and `stop`; `max_tokens` 0 prefills only).
    pub(super) fn start_background_with(&mut self, job: BackgroundJob, params: SamplingParams) -> Result<(), String> {
        let BackgroundJob { owner, tag, start, max_tokens, stop: _, priority, hidden } = job;
        let fail = |policy: &mut Box<dyn engram_policy::ContextPolicy>, metrics: &crate::Metrics, e: String| {
            metrics.background_jobs.fetch_add(1, Relaxed);
            metrics.background_failed.fetch_add(1, Relaxed);
            policy.background_done(BackgroundDone { owner: owner.clone(), tag, outcome: Err(e.clone()) });
            Err(e)
        };
        if start.restore.is_some() {
            return fail(&mut self.policy, &self.metrics, "a background job cannot start from an unverified restore".into());
        }
        if start.cache.is_some() {
            return fail(&mut self.policy, &self.metrics, "a background job runs on paged KV, not on a policy's own cache".into());
        }
        let prompt = start.tokens;
        let cached = start.reused.min(prompt.len().saturating_sub(1));
        let mut kv = KvView::new(start.spans, start.kv).starting_at(start.own_first);
        kv.own_mut().truncate(cached);
        let kv = SeqCacheSlot::Paged(kv);
        let repair = match super::repair::checked(start.repair, &kv, false, cached) {
            Ok(r) => r,
            Err(e) => return fail(&mut self.policy, &self.metrics, e.into()),
        };
        if prompt.is_empty() || kv.own_first_position() + prompt.len() >= self.model.config.max_positions {
            return fail(
                &mut self.policy,
                &self.metrics,
                format!(
                    "{} tokens after {} positions do not fit the model's context of {}",
                    prompt.len(),
                    kv.own_first_position(),
                    self.model.config.max_positions
                ),
            );
        }
        let out = Decoding::new(&self.model.tokenizer, &prompt, &params, 0);
        self.next_id += 1;
        let start = Seq::start(self.next_id, owner, start.session_id, Box::new(NoClient), prompt, cached, kv, out, Instant::now());
        let background = Some(BackgroundSeq { tag, priority, prefill_only: max_tokens == 0, hidden, held_steps: 0 });
        self.active.push(Seq { background, repair, ..start });
        Ok(())
    }

    /// Hands a background sequence's end to the policy: its tokens, KV and text, or why not.
    pub(super) fn finish_background(&mut self, s: Seq<'_>, outcome: Result<(), String>) {
        let b = s.background.as_ref().expect("a background sequence");
        let tag = b.tag;
        self.metrics.background_jobs.fetch_add(1, Relaxed);
        let outcome = match outcome {
            Ok(()) if s.forgotten => Err("its owner was forgotten".to_string()),
            Ok(()) => {
                let held_steps = b.held_steps;
                let (kv, _) = s.kv.into_retired(&self.pool, s.tokens.len());
                Ok(BackgroundOutput {
                    text: s.out.decoded().to_string(),
                    generated: s.out.generated().to_vec(),
                    tokens: s.tokens,
                    kv,
                    held_steps,
                })
            }
            Err(e) => Err(e),
        };
        if outcome.is_err() {
            self.metrics.background_failed.fetch_add(1, Relaxed);
        }
        self.policy.background_done(BackgroundDone { owner: s.owner, tag, outcome });
        self.idle_work = true;
    }

    /// Which sequences sit out this step: Low background ones beyond the share's credit while
    /// requests run (none when only background work runs). Also caps a Low prefill chunk
    /// ([`Engine::background_chunk`]).
    pub(super) fn plan_background(&mut self) -> Vec<bool> {
        let foreground = |s: &Seq<'_>| !s.is_low_background();
        self.background_chunk = None;
        if !self.active.iter().any(|s| s.is_low_background()) || !self.active.iter().any(foreground) {
            return vec![false; self.active.len()];
        }
        // The requests' rows this step: a token per decoder, and their prefill chunks (at most
        // `prefill_chunk` tokens in all).
        let decoders = self.active.iter().filter(|s| foreground(s) && s.next.is_some()).count();
        let prompt_left: usize =
            self.active.iter().filter(|s| foreground(s) && s.prefilling()).map(|s| s.prompt.len() - s.tokens.len()).sum();
        let chunk = prompt_left.min(self.config.prefill_chunk.max(1));
        let share = self.config.background_share.clamp(0.0, 1.0) as f64;
        let cap = self.config.prefill_chunk.max(1) as f64;
        self.background_credit = (self.background_credit + share * (decoders + chunk) as f64).min(cap);
        let mut hold = vec![false; self.active.len()];
        for (i, s) in self.active.iter().enumerate().filter(|(_, s)| s.is_low_background()) {
            if s.next.is_some() && self.background_credit >= 1.0 {
                self.background_credit -= 1.0;
            } else if s.next.is_none() && s.prefilling() && self.background_credit >= 1.0 && self.background_chunk.is_none() {
                // Charged when the chunk is chosen (`step.rs`), at most the credit's rows.
                self.background_chunk = Some(self.background_credit as usize);
            } else {
                hold[i] = true;
            }
        }
        for (s, _) in self.active.iter_mut().zip(&hold).filter(|(_, h)| **h) {
            if let Some(b) = s.background.as_mut() {
                b.held_steps += 1;
            }
        }
        hold
    }
}
