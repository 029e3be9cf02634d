//! Admission: waiting jobs join the batch (a named session's jobs one at a time), matched
//! against the session store, when their prompt fits beside the running prefills; room for a
//! step's tokens is made through the one RAM eviction path. Between accounts it is fair: the
//! next job comes from the account with the fewest sequences in the batch (in order within
//! it), and no account holds more than `max_active_per_tenant` of the batch's slots.
//!
//! Invariant: two prefills never hold parts of a budget that fits only one of them (the
//! second waits instead), so requests that fit the budget alone all complete, one after
//! another, rather than fail. One account saturating the server never holds the last
//! `max_batch - max_active_per_tenant` slots, so another account's request joins the
//! batch at the next step whenever its prompt fits the KV budget.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use engram_kv::{KvView, BLOCK_TOKENS};
use engram_policy::{AdmitRequest, Readiness};

use super::{Engine, Event, Job, JobError, JobErrorKind, Seq, SeqCacheSlot};
use crate::decoding::Decoding;

impl Engine<'_> {
    /// Moves waiting requests into the batch, fairly between accounts, skipping those whose
    /// named session is in use (so one session's requests run in order).
    pub(super) fn admit(&mut self) {
        self.expire_waiting();
        while self.active.len() < self.config.max_batch {
            let Some(i) = self.next_to_admit() else { break };
            let (job, _, _) = &self.waiting[i];
            // A policy that holds long prompts outside pool blocks (a sparse cache) says what
            // it charges instead.
            let need = self
                .policy
                .admission_bytes(&job.owner, job.prompt.len(), job.long_context_after)
                .unwrap_or_else(|| self.pool.bytes_for(job.prompt.len()));
            if need > self.pool.budget() {
                let (job, tx, _) = self.waiting.remove(i).expect("index in range");
                self.pending.fetch_sub(1, Relaxed);
                tx.send(Event::Failed(JobError::new(
                    JobErrorKind::BadRequest,
                    format!(
                        "the prompt ({} tokens) needs {need} bytes of KV cache, more than the whole budget of {} bytes",
                        job.prompt.len(),
                        self.pool.budget()
                    ),
                )));
                continue;
            }
            if !self.fits_beside_running(need) {
                // It waits, and so does everything behind it: a large prompt is not overtaken
                // for ever by smaller ones.
                break;
            }
            if self.prepare(i) == Readiness::AfterBackground {
                // The policy queued the forward work the request needs: it waits behind it.
                self.pull_background();
                let (job, _, _) = &self.waiting[i];
                if !self.waits_on_background(&job.owner, job.session.as_deref()) {
                    if self.background_queue_full() {
                        // Its work may still be in the policy's hands, behind a full queue:
                        // it is prepared again at the next pass.
                        break;
                    }
                    let (_, tx, _) = self.waiting.remove(i).expect("index in range");
                    self.pending.fetch_sub(1, Relaxed);
                    tx.send(Event::Failed(JobError::new(
                        JobErrorKind::Internal,
                        "the context policy deferred the request to background work it did not queue",
                    )));
                }
                continue;
            }
            let (job, tx, submitted) = self.waiting.remove(i).expect("index in range");
            let _span = tracing::debug_span!("admit", owner = %job.owner, prompt_tokens = job.prompt.len()).entered();
            let owner = job.owner.clone();
            if job.pinned {
                self.policy.pin_owner(&owner);
            }
            let c = match self.policy.admit(&admit_request(&job, &self.model.tokenizer)) {
                Ok(c) => c,
                Err(e) => {
                    // The policy's own words: a prompt it cannot tokenize or embed, a thread it
                    // cannot open, a persistent stream whose prefill failed.
                    self.pending.fetch_sub(1, Relaxed);
                    tx.send(Event::Failed(JobError::new(JobErrorKind::BadRequest, format!("admitting the request: {e}"))));
                    continue;
                }
            };
            // Restored from disk with its checksum still running: keep the job to
            // admit it again, matched anew, should the file prove corrupt.
            let retry = c.restore.is_some().then(|| job.clone());
            // The cache holds c.tokens[..reused]; the last prompt token is always
            // recomputed, since its logits start generation.
            let prompt = c.tokens;
            let cached_len = c.reused.min(prompt.len().saturating_sub(1));
            let mut kv = match c.cache {
                Some(own) if c.spans.is_empty() && c.own_first.is_none() && c.restore.is_none() => SeqCacheSlot::Own(own),
                Some(_) => {
                    self.pending.fetch_sub(1, Relaxed);
                    tx.send(Event::Failed(JobError::new(
                        JobErrorKind::Internal,
                        "the context policy handed a cache of its own together with spans or a restore",
                    )));
                    continue;
                }
                None => SeqCacheSlot::Paged(KvView::new(c.spans, c.kv).starting_at(c.own_first)),
            };
            if !kv.truncate(cached_len) {
                self.pending.fetch_sub(1, Relaxed);
                tx.send(Event::Failed(JobError::new(
                    JobErrorKind::Internal,
                    "the context policy handed a cache holding more tokens than it reuses, which it cannot drop",
                )));
                continue;
            }
            let repair = match super::repair::checked(c.repair, &kv, c.restore.is_some(), cached_len) {
                Ok(r) => r,
                Err(e) => {
                    self.pending.fetch_sub(1, Relaxed);
                    tx.send(Event::Failed(JobError::new(JobErrorKind::Internal, e)));
                    continue;
                }
            };
            let context = kv.own_first_position() + prompt.len();
            if prompt.is_empty() || context >= self.model.config.max_positions {
                self.pending.fetch_sub(1, Relaxed);
                let spans = kv.own_first_position();
                let with = if spans > 0 { format!(" after {spans} positions of attached context") } else { String::new() };
                tx.send(Event::Failed(JobError::new(
                    JobErrorKind::BadRequest,
                    format!("the prompt has {} tokens{with}; the model's context is {}", prompt.len(), self.model.config.max_positions),
                )));
                continue;
            }
            if kv
                .view()
                .is_some_and(|v| v.own_first_position() > 0 && (0..cached_len).any(|s| v.own().position(s) != v.own_first_position() + s))
            {
                self.pending.fetch_sub(1, Relaxed);
                tx.send(Event::Failed(JobError::new(
                    JobErrorKind::Internal,
                    "the context policy attached spans before a cache whose tokens are not placed after them",
                )));
                continue;
            }
            let m = &self.metrics;
            m.count_match(c.kind.name());
            if cached_len > 0 {
                m.cache_hits.fetch_add(1, Relaxed);
                m.tokens_reused.fetch_add(cached_len as u64, Relaxed);
            } else {
                m.cache_misses.fetch_add(1, Relaxed);
            }
            if c.restore.is_none() {
                tx.send(Event::Started { session_id: c.session_id.clone(), prompt_tokens: prompt.len(), cached_tokens: cached_len });
            }
            let text_base = job.text.as_ref().map_or(0, |t| t.len());
            let out = Decoding::new(&self.model.tokenizer, &prompt, &job.params, text_base);
            self.next_id += 1;
            let start = Seq::start(self.next_id, job.owner, c.session_id, tx, prompt, cached_len, kv, out, submitted);
            self.active.push(Seq {
                prompt_text: job.text,
                prompt_ends: c.token_ends,
                restore: c.restore.zip(retry),
                lookup: c.lookup,
                match_kind: c.kind.name(),
                repair,
                ..start
            });
        }
    }

    /// The policy's [`engram_policy::ContextPolicy::prepare`] of the waiting job `i`.
    fn prepare(&mut self, i: usize) -> Readiness {
        let (job, _, _) = &self.waiting[i];
        self.policy.prepare(&admit_request(job, &self.model.tokenizer))
    }

    /// Whether background work holds `owner`'s requests (on `session`, or all of them), queued
    /// or running.
    fn waits_on_background(&self, owner: &engram_policy::OwnerKey, session: Option<&str>) -> bool {
        let holds =
            |o: &engram_policy::OwnerKey, sid: &str, whole_owner: bool| o == owner && (whole_owner || session.is_some_and(|s| s == sid));
        self.active
            .iter()
            .any(|a| a.background.as_ref().is_some_and(|b| b.priority.blocks()) && holds(&a.owner, &a.session_id, a.holds_owner()))
            || self.background_queue.iter().any(|j| {
                j.priority.blocks() && holds(&j.owner, &j.start.session_id, j.priority == engram_policy::BackgroundPriority::BlockingOwner)
            })
    }

    /// The waiting job to admit next: among those whose named session is not in use and whose
    /// account is under its share of the batch, the first of the account with the fewest
    /// sequences in the batch.
    fn next_to_admit(&self) -> Option<usize> {
        let cap = self.config.active_per_tenant();
        let mut running: HashMap<&str, usize> = HashMap::new();
        // Named sessions in use: by a running sequence, or by an earlier waiting job (which
        // goes first, so one session's requests run in order).
        let mut in_use: HashSet<(&str, &str)> = HashSet::new();
        // Owners whose every request waits: on background work that all their sessions attend.
        let mut held: HashSet<&str> = HashSet::new();
        for a in &self.active {
            // Low-priority background work holds no account's share of the batch.
            if !a.is_low_background() {
                *running.entry(a.owner.tenant()).or_default() += 1;
            }
            in_use.insert((a.owner.as_str(), a.session_id.as_str()));
            if a.holds_owner() {
                held.insert(a.owner.as_str());
            }
        }
        // Work a request waits on that is queued but not started yet holds as if it ran.
        for j in self.background_queue.iter().filter(|j| j.priority.blocks()) {
            in_use.insert((j.owner.as_str(), j.start.session_id.as_str()));
            if j.priority == engram_policy::BackgroundPriority::BlockingOwner {
                held.insert(j.owner.as_str());
            }
        }
        let mut best: Option<(usize, usize)> = None;
        for (i, (job, _, _)) in self.waiting.iter().enumerate() {
            let busy =
                held.contains(job.owner.as_str()) || job.session.as_deref().is_some_and(|sid| !in_use.insert((job.owner.as_str(), sid)));
            let n = running.get(job.owner.tenant()).copied().unwrap_or(0);
            if busy || n >= cap {
                continue;
            }
            match best {
                Some((fewest, _)) if fewest <= n => {}
                _ => best = Some((n, i)),
            }
        }
        best.map(|(_, i)| i)
    }

    /// Whether a prompt of `need` bytes fits now beside what the running sequences still need
    /// (the rest of each prefill, and a block of decoding room each), after making room if
    /// the pool is short. With nothing running it always may try (the step fails it if even
    /// then it cannot progress).
    fn fits_beside_running(&mut self, need: usize) -> bool {
        if self.active.is_empty() {
            return true;
        }
        // An own cache charges its RAM as it grows (its reservations make room for it).
        let running: usize = self
            .active
            .iter()
            .filter(|s| !s.kv.is_own())
            .map(|s| self.pool.bytes_for(s.prompt.len().saturating_sub(s.tokens.len()) + BLOCK_TOKENS))
            .sum();
        let want = running + need;
        self.pool.budget().saturating_sub(self.pool.used()) >= want || self.policy.make_room(want)
    }

    /// Fails the waiting requests that have waited longer than `admission_wait` while others
    /// ran (503 with `Retry-After` at the server). With nothing running, nothing is expired:
    /// the head of the queue is admitted next.
    fn expire_waiting(&mut self) {
        if self.active.is_empty() {
            return;
        }
        let limit = self.config.admission_wait;
        let now = Instant::now();
        let (expired, keep): (std::collections::VecDeque<_>, _) =
            std::mem::take(&mut self.waiting).into_iter().partition(|(_, _, submitted)| now.duration_since(*submitted) > limit);
        self.waiting = keep;
        for (_, tx, _) in expired {
            self.pending.fetch_sub(1, Relaxed);
            tx.send(Event::Failed(JobError::new(
                JobErrorKind::Unavailable,
                format!("no room in the KV cache or the batch within {} s; retry later", limit.as_secs_f64()),
            )));
        }
    }

    /// Reserves room for `n` tokens in sequence `at`, making room first if the pool is short
    /// (`SessionStore::make_room`: idle prefix blocks, then idle sessions, only as much as
    /// the reservation can take — its new blocks, a copied partial block, a recent window).
    pub(super) fn reserve(&mut self, at: usize, n: usize) -> bool {
        match self.active[at].kv.try_reserve(n) {
            Ok(()) => true,
            Err(None) => false,
            Err(Some(short)) => {
                self.policy.make_room(short);
                self.active[at].kv.try_reserve(n).is_ok()
            }
        }
    }
}

/// What the policy is asked about `job` (its `prepare` and `admit`).
fn admit_request<'a>(job: &'a Job, tok: &'a engram_tokenizer::Tokenizer) -> AdmitRequest<'a> {
    AdmitRequest {
        owner: &job.owner,
        session: job.session.as_deref(),
        text: job.text.as_deref(),
        add_special: job.add_special,
        tokens: &job.prompt,
        tok,
        long_context_after: job.long_context_after,
    }
}
