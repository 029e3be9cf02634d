//! One step: at most one sequence's repair of reused KV first (`repair.rs`), then every
//! decoding sequence's next token (with its tree of drafts when it speculates) plus prefill
//! chunks of at most `prefill_chunk` prompt tokens in all (round-robin), in a single forward
//! call; then sampling (walking the drafts, `speculate.rs`) and streaming per sequence.
//!
//! Invariant: a panic in the forward pass or in a sequence's sampling is contained to the
//! step: the sequences it computed fail with an Internal "engine fault" error and their
//! caches are dropped (never checked in); the engine thread goes on serving.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use engram_kv::BLOCK_TOKENS;
use engram_model::{KeyMask, Logits, SeqStep};

use super::{owner_gone, DraftBudget, Engine, Event, JobError, JobErrorKind, Seq};
use crate::decoding::FinishReason;
use crate::speculate::DraftTree;

/// Plain decoding steps after a rejected one-draft tree, before drafting again.
const DRAFT_COOLDOWN_STEPS: usize = 8;

impl Engine<'_> {
    pub(super) fn step(&mut self) {
        let _span = tracing::debug_span!("step", sequences = self.active.len()).entered();
        // A checkout's reused KV repaired first (one sequence a step): its prefill follows.
        self.repair_next();
        // Decoders first: each needs room for one token, or for its tree of drafts.
        // Rows planned so far: one per decoder, then each tree's drafts as they are chosen.
        let mut planned = 0;
        for s in self.active.iter_mut().filter(|s| s.next.is_some()) {
            s.draft_cooldown = s.draft_cooldown.saturating_sub(1);
            planned += 1;
        }
        let mut i = 0;
        while i < self.active.len() {
            if let Some(tree) = self.draft_for(i, planned).filter(|t| self.reserve(i, t.len())) {
                planned += tree.len() - 1;
                self.active[i].draft = Some(tree);
                i += 1;
                continue;
            }
            if self.active[i].next.is_some() && !self.reserve(i, 1) {
                // NOTE: no preemption yet; a sequence that cannot grow ends as if
                // it hit its length limit, keeping what it has.
                let rest = self.active[i].out.flush();
                if !rest.is_empty() {
                    self.active[i].events.send(Event::Text(rest));
                }
                self.retire(i, Ok(FinishReason::Length));
                continue;
            }
            i += 1;
        }
        // Low-priority background work sits out what the share does not cover.
        let hold = self.plan_background();
        // Prefill chunks within a budget of `prefill_chunk` prompt tokens a step, shared
        // round-robin by sequence id: several short prompts go in one step, a long one takes
        // what is left (one prompt's chunk only, without `pack_prompts`). Requests' prefills
        // (and work they wait on) come before low-priority background ones, which prefill
        // only in a step without a request's chunk, one at most.
        let mut cands: Vec<usize> =
            (0..self.active.len()).filter(|&i| self.active[i].prefilling() && !hold[i] && self.active[i].repair.is_none()).collect();
        let split = cands.iter().position(|&i| self.active[i].id > self.last_prefill).unwrap_or(0);
        cands.rotate_left(split);
        cands.sort_by_key(|&i| self.active[i].is_low_background());
        let mut chosen: Vec<(usize, usize)> = Vec::new();
        let mut budget = self.config.prefill_chunk.max(1);
        for &c in &cands {
            let s = &self.active[c];
            let low = s.is_low_background();
            if budget == 0 || (low && !chosen.is_empty()) {
                break;
            }
            let mut n = (s.prompt.len() - s.tokens.len()).min(budget);
            if low {
                n = n.min(self.config.background_chunk.max(1));
            }
            if let Some(cap) = self.background_chunk.filter(|_| low) {
                n = n.min(cap.max(1));
            }
            if self.reserve(c, n) {
                if low && self.background_chunk.is_some() {
                    self.background_credit -= n as f64;
                }
                chosen.push((c, n));
                budget -= n;
                if low || !self.config.pack_prompts {
                    break;
                }
            }
        }
        let decoding = self.active.iter().any(|s| s.next.is_some());
        if chosen.is_empty() && !decoding {
            if let Some(&c) = cands.first() {
                // Nothing runs that could ever free memory: this one cannot fit now.
                let e = JobError::new(
                    JobErrorKind::Unavailable,
                    format!("KV cache budget exhausted ({} of {} bytes in use); retry later", self.pool.used(), self.pool.budget()),
                );
                self.retire(c, Err(e));
            }
            return;
        }
        // The round-robin goes on after the last sequence served.
        let chunk_of = chosen.last().map(|&(c, _)| self.active[c].id);
        let mut want = Vec::with_capacity(self.active.len());
        for (i, s) in self.active.iter_mut().enumerate() {
            s.input.clear();
            if hold[i] {
                want.push(Logits::None);
            } else if let Some(tree) = &s.draft {
                s.input.extend_from_slice(tree.tokens());
                want.push(Logits::All);
            } else if let Some(t) = s.next {
                s.input.push(t);
                want.push(Logits::Last);
            } else if let Some(&(_, n)) = chosen.iter().find(|&&(c, _)| c == i) {
                let at = s.tokens.len();
                s.input.extend_from_slice(&s.prompt[at..at + n]);
                let prefill_only = s.background.as_ref().is_some_and(|b| b.prefill_only);
                want.push(if at + n == s.prompt.len() && !prefill_only { Logits::Last } else { Logits::None });
            } else {
                want.push(Logits::None);
            }
        }
        if let Some(id) = chunk_of {
            self.last_prefill = id;
        }
        let mut who = Vec::new();
        let mut steps = Vec::new();
        // Explicit positions for sequences whose view has spans before their own tokens, and
        // for trees of drafts (by depth); a tree's rows also get its mask.
        let positions: Vec<Option<Vec<u32>>> = self
            .active
            .iter()
            .map(|s| match &s.draft {
                Some(tree) => {
                    let root = s.kv.step_positions(s.tokens.len(), 1).map_or(s.tokens.len() as u32, |p| p[0]);
                    Some(tree.depths().iter().map(|d| root + d).collect())
                }
                None => s.kv.step_positions(s.tokens.len(), s.input.len()),
            })
            .collect();
        // A background job's hidden slots (it never drafts: greedy, no speculation).
        let masks: Vec<Option<KeyMask>> = self
            .active
            .iter()
            .map(|s| match &s.draft {
                Some(tree) => Some(tree.key_mask(s.kv.num_keys())),
                None => s.hidden_mask(),
            })
            .collect();
        // The grammar masks of this step's single draws, computed beside the forward pass.
        let mut ahead = Vec::new();
        for ((i, s), (positions, mask)) in self.active.iter_mut().enumerate().zip(positions.iter().zip(&masks)) {
            if s.input.is_empty() {
                continue;
            }
            let Seq { input, tokens, kv, out, draft, .. } = s;
            if draft.is_none() && want[i] == Logits::Last && out.masks_next_draw() {
                ahead.push(out);
            }
            let (tokens, first_pos, positions) = (input.as_slice(), tokens.len(), positions.as_deref());
            steps.push(SeqStep { tokens, first_pos, positions, key_mask: mask.as_ref(), kv: kv.as_kv_cache(), logits: want[i] });
            who.push(i);
        }
        if steps.is_empty() {
            return;
        }
        // A panic in the forward pass (a kernel, a cache write) fails this step's sequences,
        // not the engine thread: every other request, queued or to come, goes on.
        // Span fields are evaluated only when the span is enabled: no cost on the hot path otherwise.
        let rows = steps.iter().map(|s| s.tokens.len()).sum::<usize>();
        let forward = tracing::debug_span!("forward", sequences = steps.len(), rows).entered();
        let model = self.model;
        let (result, secs) = std::thread::scope(|scope| {
            // A mask that panics here is computed again (and its panic contained) at the draw.
            let masks = (!ahead.is_empty()).then(|| scope.spawn(move || ahead.into_iter().for_each(|d| d.prepare_mask())));
            let t0 = Instant::now();
            let result = catch_unwind(AssertUnwindSafe(|| model.forward(&mut steps)));
            let secs = t0.elapsed().as_secs_f64();
            if let Some(m) = masks {
                let _ = m.join();
            }
            (result, secs)
        });
        drop(forward);
        // Decode steps only: a prompt chunk's rows skip the output head that every tree row pays.
        if matches!(result, Ok(Ok(_))) && chosen.is_empty() {
            self.step_costs.observe(rows, secs);
        }
        drop(steps);
        self.metrics.steps.fetch_add(1, Relaxed);
        let outs = match result {
            Ok(Ok(o)) => o,
            Err(panic) => {
                let message = self.fault(&*panic, "the forward pass");
                for &i in who.iter().rev() {
                    self.retire_faulted(i, &message);
                }
                return;
            }
            Ok(Err(e)) => {
                tracing::error!("forward failed: {e}");
                for &i in who.iter().rev() {
                    let s = &mut self.active[i];
                    let keep = s.tokens.len();
                    s.kv.truncate(keep);
                    self.retire(i, Err(JobError::new(JobErrorKind::Internal, format!("model error: {e}"))));
                }
                return;
            }
        };
        // Process in reverse so retiring (removal) keeps earlier indices valid.
        for (&i, mut logits) in who.iter().zip(outs).rev() {
            let s = &mut self.active[i];
            if s.background.is_some() {
                self.metrics.background_rows.fetch_add(s.input.len() as u64, Relaxed);
            } else if s.next.is_none() {
                self.metrics.tokens_computed.fetch_add(s.input.len() as u64, Relaxed);
            }
            let input = std::mem::take(&mut s.input);
            let draft = s.draft.take();
            let was_prefill = s.next.is_none() && draft.is_none();
            match draft {
                // The root is fed; its drafts join `tokens` as the walk accepts them.
                Some(_) => s.tokens.push(input[0]),
                None => s.tokens.extend_from_slice(&input),
            }
            s.input = input;
            if was_prefill && s.tokens.len() == s.prompt.len() {
                // The prompt is in: an own cache prepares for decoding (a sparse index).
                s.kv.prefilled();
            }
            if s.background.as_ref().is_some_and(|b| b.prefill_only) && s.tokens.len() == s.prompt.len() {
                // A prefill asked for by the policy: done once its prompt is in.
                self.retire(i, Ok(FinishReason::Stop));
                continue;
            }
            if logits.is_empty() {
                continue;
            }
            if self.active[i].restore.is_some() && !self.settle_restore(i) {
                continue;
            }
            // Sampling and detokenizing are contained per sequence: one that panics fails alone.
            let sampled = catch_unwind(AssertUnwindSafe(|| match &draft {
                Some(tree) => self.verify(i, &mut logits, tree),
                None => self.sample(i, &mut logits),
            }));
            match sampled {
                Ok(Some(outcome)) => self.retire(i, outcome),
                Ok(None) => {}
                Err(panic) => {
                    let message = self.fault(&*panic, "sampling");
                    self.retire_faulted(i, &message);
                }
            }
        }
    }

    /// Counts and logs a panic caught in `stage` of a step; returns its message.
    pub(super) fn fault(&self, panic: &(dyn Any + Send), stage: &str) -> String {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into());
        self.metrics.step_faults.fetch_add(1, Relaxed);
        tracing::error!("engine fault in {stage}: {message}; its sequences fail, the engine goes on");
        message
    }

    /// Ends sequence `at` after a panic in its step: it fails with an Internal "engine fault"
    /// error and its cache is dropped, never checked in. NOTE: the panic may have left the
    /// sequence half-updated (`kv` written for tokens not in `tokens`, a reservation unused,
    /// `out` mid-token), so nothing of it is trusted; its blocks go back to the pool on drop.
    pub(super) fn retire_faulted(&mut self, at: usize, message: &str) {
        // A pending restore is still settled: the file's verdict does not depend on this step
        // (a sound file's session joins the store as read from disk; a corrupt one is deleted).
        if let Some((p, _)) = self.active[at].restore.take() {
            if !self.policy.verify_restore(p) {
                self.metrics.restores_failed.fetch_add(1, Relaxed);
            }
        }
        let s = self.active.remove(at);
        if s.background.is_some() {
            // Nothing of it is trusted: its KV is dropped, the policy hears the fault.
            let (owner, tag) = (s.owner.clone(), s.background.as_ref().map_or(0, |b| b.tag));
            drop(s);
            self.metrics.background_jobs.fetch_add(1, Relaxed);
            self.metrics.background_failed.fetch_add(1, Relaxed);
            self.policy.background_done(engram_policy::BackgroundDone { owner, tag, outcome: Err(format!("engine fault: {message}")) });
            self.idle_work = true;
            return;
        }
        self.pending.fetch_sub(1, Relaxed);
        s.events.send(Event::Failed(JobError::new(JobErrorKind::Internal, format!("engine fault: {message}"))));
        if s.forgotten {
            self.policy.forget_owner(&s.owner);
        }
        self.idle_work = true;
    }

    /// Waits for the checksum of the session sequence `at` was restored from.
    /// True: the file was sound; reports `Started`. False: it was corrupt (now
    /// deleted), and so may be the tokens and text matched against it: the
    /// sequence is dropped with what it computed and its job admitted again
    /// first, as if it had just arrived (it is matched anew, without the file).
    fn settle_restore(&mut self, at: usize) -> bool {
        let Some((p, job)) = self.active[at].restore.take() else { return true };
        if self.policy.verify_restore(p) {
            let s = &self.active[at];
            s.events.send(Event::Started { session_id: s.session_id.clone(), prompt_tokens: s.prompt.len(), cached_tokens: s.cached });
            return true;
        }
        let s = self.active.remove(at);
        let m = &self.metrics;
        m.restores_failed.fetch_add(1, Relaxed);
        // Admitted again below, the job is counted again: take back this admission's counts.
        m.uncount_match(s.match_kind);
        m.tokens_reused.fetch_sub(s.cached as u64, Relaxed);
        if s.cached > 0 {
            m.cache_hits.fetch_sub(1, Relaxed);
        } else {
            m.cache_misses.fetch_sub(1, Relaxed);
        }
        if s.forgotten {
            self.pending.fetch_sub(1, Relaxed);
            s.events.send(owner_gone());
        } else {
            self.waiting.push_front((job, s.events, s.submitted));
        }
        false
    }

    /// This step's tree of drafts for sequence `at`, when it decodes, speculates (its request
    /// or the engine says so) and prompt lookup found any. The tree fits the context, the
    /// tokens the request may still produce, with a quantized format the recent window's
    /// block (so the kept path reads its f16 rows exactly as decoding one by one would), and
    /// the draft budget for a step already holding `rows` rows (this sequence's next token
    /// among them).
    fn draft_for(&mut self, at: usize, rows: usize) -> Option<DraftTree> {
        let s = &self.active[at];
        let next = s.next?;
        if s.background.is_some() {
            return None;
        }
        // NOTE: a grammar-bound sequence speculates too: `verify` samples node by node, each
        // draw masked by the grammar after the path so far, so a draft the grammar rejects is
        // never the token drawn and never accepted (the matcher only consumes drawn tokens).
        let lookup = match s.out.params().speculate {
            Some(false) => return None,
            Some(true) => self.config.speculation.unwrap_or_default(),
            None => self.config.speculation?,
        };
        if s.draft_cooldown > 0 || !s.kv.allows_drafts() {
            return None;
        }
        let len = s.tokens.len();
        let mut budget = self.model.config.max_positions.saturating_sub(len + 2).min(s.draft_cap);
        budget = budget.min(s.out.params().max_tokens.saturating_sub(s.out.generated().len()));
        if self.pool.has_window() {
            budget = budget.min((BLOCK_TOKENS - 2).saturating_sub(len % BLOCK_TOKENS));
        }
        if self.config.draft_budget == DraftBudget::Measured {
            let draft_ratio = self.config.draft_model.as_ref().map_or(0.0, |d| d.cost_ratio());
            budget = self.step_costs.best_drafts(rows, s.acceptance.rate(), budget, draft_ratio);
        }
        if budget == 0 {
            return None;
        }
        let tree = match self.config.draft_model.clone() {
            Some(dm) => {
                let s = &mut self.active[at];
                let tree = dm.draft(&mut s.drafter, &s.tokens, next, budget);
                if let Some(secs) = s.drafter.as_ref().and_then(|d| d.step_secs()) {
                    self.step_costs.observe_drafting(secs);
                }
                tree
            }
            // The view's tokens before the sequence's own (a dual-stream thread's earlier
            // turns), searched as one context with them.
            None if s.lookup.is_empty() => lookup.draft(&s.tokens, next, budget),
            None => {
                let context: Vec<u32> = s.lookup.iter().chain(&s.tokens).copied().collect();
                lookup.draft(&context, next, budget)
            }
        };
        (!tree.is_empty()).then_some(tree)
    }

    /// Walks sequence `at`'s verified tree: samples the root's row, and while the token is a
    /// child's, that child's row; the first token no child holds is the next to feed. Keeps
    /// the accepted path's KV (the rest of the tree is dropped whole) and returns the outcome
    /// if the sequence is done. `logits` holds one row per node.
    fn verify(&mut self, at: usize, logits: &mut [f32], tree: &DraftTree) -> Option<Result<FinishReason, JobError>> {
        let vocab = logits.len() / tree.len();
        let base = self.active[at].tokens.len() - 1;
        let (mut node, mut kept) = (0, vec![base]);
        let outcome = loop {
            if let Some(outcome) = self.sample(at, &mut logits[node * vocab..(node + 1) * vocab]) {
                break Some(outcome);
            }
            let s = &mut self.active[at];
            let t = s.next.expect("a sequence that goes on has a next token");
            let Some(child) = tree.child(node, t) else { break None };
            // Accepted: the token's KV is the child's row; it is fed already.
            node = child;
            kept.push(base + child);
            s.tokens.push(t);
            s.next = None;
        };
        let s = &mut self.active[at];
        s.kv.paged_mut().expect("drafts run on paged KV only").keep_slots(base, &kept);
        // A tree costs more rows in the step than its accepted tokens save when most of it is
        // rejected: grow the next one while drafts are accepted, shrink it while they are not,
        // and after a tree of one draft is rejected decode plainly for a while.
        let accepted = kept.len() - 1;
        // Rejected: the walk stopped where the tree offered drafts (not at a leaf, not at the end).
        s.acceptance.observe(accepted, outcome.is_none() && !tree.is_leaf(node));
        let max = match &self.config.draft_model {
            Some(dm) => dm.max_drafts,
            None => self.config.speculation.unwrap_or_default().max_drafts,
        };
        if accepted > 0 {
            s.draft_cap = (s.draft_cap * 2).min(max).max(accepted + 1);
        } else if s.draft_cap <= 1 {
            s.draft_cooldown = DRAFT_COOLDOWN_STEPS;
        } else {
            s.draft_cap /= 2;
        }
        self.metrics.draft_tokens.fetch_add(tree.len() as u64 - 1, Relaxed);
        self.metrics.draft_tokens_accepted.fetch_add(accepted as u64, Relaxed);
        outcome
    }

    /// Samples sequence `at`'s next token and streams its text; returns the
    /// outcome if the sequence is done.
    fn sample(&mut self, at: usize, logits: &mut [f32]) -> Option<Result<FinishReason, JobError>> {
        let ctx = self.model.config.max_positions;
        let m = self.metrics.clone();
        let s = &mut self.active[at];
        let t = tracing::trace_span!("sample", seq = s.id).in_scope(|| s.out.sample(logits));
        let now = Instant::now();
        // Requests' latency and token counts only; background work has its own counters.
        if s.background.is_none() {
            match s.last_token {
                None => m.ttft.observe(now.duration_since(s.submitted).as_secs_f64()),
                Some(prev) => m.inter_token.observe(now.duration_since(prev).as_secs_f64()),
            }
            m.tokens_generated.fetch_add(1, Relaxed);
        }
        s.last_token = Some(now);
        s.next = None;
        if let Some(lp) = s.out.take_logprob() {
            if !s.events.send(Event::Logprob(lp)) {
                return Some(Ok(FinishReason::Cancelled));
            }
        }
        let step = match s.out.accept(t, s.tokens.len() + 1 < ctx) {
            Ok(step) => step,
            Err(e) => return Some(Err(JobError::new(JobErrorKind::Internal, format!("decoding: {e}")))),
        };
        if !step.release.is_empty() && !s.events.send(Event::Text(step.release)) {
            return Some(Ok(FinishReason::Cancelled));
        }
        if let Some(finish) = step.done {
            return Some(Ok(finish));
        }
        s.next = Some(t);
        None
    }
}
