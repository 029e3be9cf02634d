//! The scheduler: one engine thread owns the model's running sequences, the
//! KV pool and the session store; HTTP handlers talk to it over channels.
//!
//! ```text
//!  handlers --Job--> [waiting queue] --admit--> [active batch] --step--> Model::forward
//!     ^                (session busy,             every decoding seq: 1 token
//!     |                 batch full)               + at most ONE prefill chunk (round-robin)
//!     +---- Event (Started, Text, Finished | Failed) per request, over its own channel
//! ```
//! Each step runs every decoding sequence's next token and one prompt chunk
//! (at most `prefill_chunk` tokens) of one prefilling sequence in a single
//! forward call, so weights are read once per step and a new request's first
//! token never waits for another request's whole answer. Prefills take turns
//! round-robin, so a long prompt cannot starve a short one.
//!
//! Admission is by the KV budget: a chunk runs only if its blocks can be
//! reserved (idle sessions are evicted LRU first); a request that cannot make
//! progress while nothing else runs fails with 503. A request whose receiver
//! is dropped (client gone) is cancelled before the next step; the tokens it
//! computed stay cached in its session.
//!
//! Invariant: a request's tokens do not depend on what else is in the batch
//! (batched forward = alone, tested in `crates/model/tests/chunking.rs`; the
//! server's concurrency test checks the end-to-end consequence).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use engram_engine::{Decoding, FinishReason, SamplingParams};
use engram_kv::{KvPool, SeqKv, BLOCK_TOKENS};
use engram_model::{Logits, Model, SeqStep};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

use crate::error::ApiError;
use crate::metrics::Metrics;
use engram_context::{PendingRestore, SessionStore};

/// Scheduler limits.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most prompt tokens prefilled per step.
    pub prefill_chunk: usize,
    /// Most sequences in the batch at once.
    pub max_batch: usize,
    /// Most requests queued or running before new ones get 429.
    pub max_pending: usize,
    /// Most idle sessions kept in RAM.
    pub max_sessions: usize,
    /// Where sessions persist across restarts (`None`: RAM only).
    pub disk: Option<DiskConfig>,
}

/// The disk tier of the session store.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    pub dir: std::path::PathBuf,
    pub budget_bytes: u64,
    pub policy: engram_kv::EvictionPolicy,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig { prefill_chunk: 256, max_batch: 16, max_pending: 256, max_sessions: 256, disk: None }
    }
}

/// One generation request.
#[derive(Clone)]
pub struct Job {
    /// Sessions never cross this key.
    pub tenant: String,
    /// A named session, or `None` to match by characters against the tenant's sessions.
    pub session: Option<String>,
    /// The prompt text (rendered chat or raw completion), matched by
    /// characters; `None` for prompts sent as token ids.
    pub text: Option<String>,
    /// How `text` is tokenized cold (true: the model's BOS rule for raw prompts).
    pub add_special: bool,
    /// The prompt tokenized whole (used for validation; the session store
    /// may reuse a cached tokenization of the common part instead).
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// Pin the tenant's sessions on disk (a named agent's): never evicted by
    /// the disk policy, removed only when the agent is deleted.
    pub pinned: bool,
}

/// What a request hears back, in order: `Started`, any number of `Text`,
/// then `Finished` — or a single `Failed` before `Started`.
#[derive(Debug)]
pub enum Event {
    Started {
        session_id: String,
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    Text(String),
    /// `stop_string`: the text was cut at a stop string (not a stop token).
    Finished {
        finish: FinishReason,
        completion_tokens: usize,
        stop_string: bool,
    },
    Failed(ApiError),
}

enum Command {
    Submit(Job, UnboundedSender<Event>, Instant),
    /// Drop the idle sessions of a tenant key.
    Forget(String),
}

/// A cheap, cloneable handle to the engine thread. The thread exits when the
/// last handle is dropped and the running requests have finished.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    pending: Arc<AtomicUsize>,
    max_pending: usize,
    pub metrics: Arc<Metrics>,
}

impl EngineHandle {
    /// Starts the engine thread.
    pub fn start(
        model: Arc<Model>,
        pool: KvPool,
        config: SchedulerConfig,
        metrics: Arc<Metrics>,
    ) -> (EngineHandle, std::thread::JoinHandle<()>) {
        let (tx, rx) = mpsc::channel();
        let pending = Arc::new(AtomicUsize::new(0));
        let handle = EngineHandle { tx, pending: pending.clone(), max_pending: config.max_pending, metrics: metrics.clone() };
        let thread = std::thread::Builder::new()
            .name("engram-engine".into())
            .spawn(move || Engine::new(&model, pool, config, metrics, pending).run(rx))
            .expect("spawning the engine thread");
        (handle, thread)
    }

    /// Queues a request; its events arrive on the returned receiver. Dropping
    /// the receiver cancels the request.
    pub fn submit(&self, job: Job) -> Result<UnboundedReceiver<Event>, ApiError> {
        if self.pending.fetch_add(1, Relaxed) >= self.max_pending {
            self.pending.fetch_sub(1, Relaxed);
            return Err(ApiError::overloaded(format!("{} requests are already queued or running; retry later", self.max_pending)));
        }
        let (tx, rx) = unbounded_channel();
        if self.tx.send(Command::Submit(job, tx, Instant::now())).is_err() {
            self.pending.fetch_sub(1, Relaxed);
            return Err(ApiError::unavailable("the engine is shutting down"));
        }
        Ok(rx)
    }

    /// Drops the idle sessions of a tenant key.
    pub fn forget(&self, tenant: String) {
        let _ = self.tx.send(Command::Forget(tenant));
    }
}

/// What a request whose owner was forgotten (a deleted agent) before it ran gets.
fn owner_gone() -> Event {
    Event::Failed(ApiError::not_found("the owner of this request was deleted before it ran"))
}

/// A request in the batch.
struct Seq<'m> {
    id: u64,
    tenant: String,
    session_id: String,
    events: UnboundedSender<Event>,
    /// The prompt text, if the request had one (sessions are matched by it).
    prompt_text: Option<String>,
    /// Byte end of each prompt token's text in `prompt_text` (the generated
    /// tokens' follow in `out`, in `prompt_text + out.decoded()`).
    prompt_ends: Vec<usize>,
    prompt: Vec<u32>,
    /// Exactly what `kv` holds.
    tokens: Vec<u32>,
    kv: SeqKv,
    /// This step's input.
    input: Vec<u32>,
    /// The sampled token to feed next (decoding); `None` while prefilling.
    next: Option<u32>,
    /// Sampling, detokenizing and stopping (shared with the CLI's `Generator`).
    out: Decoding<'m>,
    submitted: Instant,
    last_token: Option<Instant>,
    /// A session restored from disk whose checksum is still running, and the
    /// job to admit again if it fails: the sequence prefills on the restored
    /// cache and waits for the check (and only then reports `Started`) before
    /// its first token.
    restore: Option<(PendingRestore, Job)>,
    /// Prompt tokens taken from the cache at admission, and how they matched.
    cached: usize,
    match_kind: &'static str,
    /// Its owner was forgotten while it ran: its cache is dropped, not checked in.
    forgotten: bool,
}

impl Seq<'_> {
    fn prefilling(&self) -> bool {
        self.next.is_none() && self.tokens.len() < self.prompt.len()
    }
}

struct Engine<'m> {
    model: &'m Model,
    pool: KvPool,
    config: SchedulerConfig,
    metrics: Arc<Metrics>,
    pending: Arc<AtomicUsize>,
    sessions: SessionStore,
    waiting: VecDeque<(Job, UnboundedSender<Event>, Instant)>,
    active: Vec<Seq<'m>>,
    next_id: u64,
    /// Id of the sequence that got the last prefill chunk (round-robin).
    last_prefill: u64,
}

impl<'m> Engine<'m> {
    fn new(model: &'m Model, pool: KvPool, config: SchedulerConfig, metrics: Arc<Metrics>, pending: Arc<AtomicUsize>) -> Self {
        metrics.kv_bytes_budget.store(pool.budget() as u64, Relaxed);
        let mut sessions = SessionStore::new(pool.clone(), model.fingerprint).with_max_sessions(config.max_sessions);
        if let Some(d) = &config.disk {
            let fp = engram_kv::cache_fingerprint(model.fingerprint, pool.format());
            match engram_context::PersistedSessions::open(&d.dir, d.budget_bytes, d.policy, fp) {
                Ok(p) => {
                    sessions = sessions.with_disk(p, model.config.vocab);
                    tracing::info!("{} persisted sessions found in {}", sessions.on_disk_count(), d.dir.display());
                }
                Err(e) => tracing::warn!("sessions will not persist: {e}"),
            }
        }
        Engine {
            model,
            pool,
            config,
            metrics,
            pending,
            sessions,
            waiting: VecDeque::new(),
            active: Vec::new(),
            next_id: 0,
            last_prefill: 0,
        }
    }

    fn run(mut self, rx: Receiver<Command>) {
        let mut open = true;
        loop {
            if self.active.is_empty() && self.waiting.is_empty() {
                if !open {
                    break;
                }
                match rx.recv() {
                    Ok(c) => self.command(c),
                    Err(_) => break,
                }
            }
            loop {
                match rx.try_recv() {
                    Ok(c) => self.command(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => {
                        open = false;
                        break;
                    }
                }
            }
            self.cancel_gone();
            self.admit();
            self.step();
            self.refresh_gauges();
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Submit(job, tx, t) => self.waiting.push_back((job, tx, t)),
            Command::Forget(tenant) => self.forget(&tenant),
        }
    }

    fn refresh_gauges(&self) {
        let m = &self.metrics;
        m.kv_bytes_used.store(self.pool.used() as u64, Relaxed);
        m.sessions_idle.store(self.sessions.len() as u64, Relaxed);
        m.sessions_on_disk.store(self.sessions.on_disk_count() as u64, Relaxed);
        m.sessions_restored.store(self.sessions.restored_count(), Relaxed);
        m.disk_bytes_used.store(self.sessions.disk_used_bytes(), Relaxed);
        m.sequences_running.store(self.active.len() as u64, Relaxed);
        m.requests_waiting.store(self.waiting.len() as u64, Relaxed);
    }

    /// Drops everything cached for `tenant`: its sessions (RAM and disk), the
    /// caches of its running sequences once they end, and its queued requests,
    /// which fail (their owner is gone).
    fn forget(&mut self, tenant: &str) {
        self.sessions.forget_owner(tenant);
        for s in self.active.iter_mut().filter(|s| s.tenant == tenant) {
            s.forgotten = true;
        }
        let (gone, keep): (VecDeque<_>, VecDeque<_>) =
            std::mem::take(&mut self.waiting).into_iter().partition(|(job, ..)| job.tenant == tenant);
        self.waiting = keep;
        for (_, events, _) in gone {
            self.pending.fetch_sub(1, Relaxed);
            let _ = events.send(owner_gone());
        }
    }

    /// Ends a sequence: reports, and returns its cache to the session store.
    fn retire(&mut self, at: usize, outcome: Result<FinishReason, ApiError>) {
        // Ended before its first token (cancelled, failed): what it computed on
        // an unverified restore is kept only if the file proves sound.
        if let Some((p, _)) = self.active[at].restore.take() {
            if !self.sessions.verify_restore(p) {
                self.metrics.restores_failed.fetch_add(1, Relaxed);
                self.active[at].tokens.clear();
            }
        }
        let s = self.active.remove(at);
        self.pending.fetch_sub(1, Relaxed);
        match outcome {
            Ok(finish) => {
                if finish == FinishReason::Cancelled {
                    self.metrics.cancelled.fetch_add(1, Relaxed);
                }
                let _ = s.events.send(Event::Finished {
                    finish,
                    completion_tokens: s.out.generated().len(),
                    stop_string: s.out.stopped_by_string(),
                });
            }
            Err(e) => {
                let _ = s.events.send(Event::Failed(e));
            }
        }
        if s.forgotten {
            // Also drops what a restore verified after the owner was forgotten
            // (it joined the store then) and deletes its file again.
            self.sessions.forget_owner(&s.tenant);
            return;
        }
        let mut kv = s.kv;
        // Drop blocks reserved past the end (a failed or unused reservation).
        kv.truncate(s.tokens.len());
        let n = s.tokens.len();
        match s.prompt_text {
            Some(p) => {
                let mut ends = s.prompt_ends;
                ends.extend_from_slice(s.out.token_ends());
                ends.truncate(n);
                let text = p + s.out.decoded();
                self.sessions.checkin(&s.tenant, &s.session_id, text, s.tokens, ends, kv);
            }
            None => self.sessions.checkin(&s.tenant, &s.session_id, String::new(), s.tokens, vec![0; n], kv),
        }
    }

    fn cancel_gone(&mut self) {
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].events.is_closed() {
                self.retire(i, Ok(FinishReason::Cancelled));
            } else {
                i += 1;
            }
        }
        let before = self.waiting.len();
        self.waiting.retain(|(_, tx, _)| !tx.is_closed());
        let gone = before - self.waiting.len();
        self.pending.fetch_sub(gone, Relaxed);
        self.metrics.cancelled.fetch_add(gone as u64, Relaxed);
    }

    /// Moves waiting requests into the batch, in order, skipping those whose
    /// named session is in use (so one session's requests run in order).
    fn admit(&mut self) {
        let mut i = 0;
        while i < self.waiting.len() && self.active.len() < self.config.max_batch {
            let (job, _, _) = &self.waiting[i];
            let busy = job.session.as_ref().is_some_and(|sid| {
                self.active.iter().any(|a| a.tenant == job.tenant && &a.session_id == sid)
                    || self.waiting.iter().take(i).any(|(w, _, _)| w.tenant == job.tenant && w.session.as_ref() == Some(sid))
            });
            if busy {
                i += 1;
                continue;
            }
            let (job, tx, submitted) = self.waiting.remove(i).expect("index in range");
            // Whole blocks, plus the f16 recent window quantized formats keep beside them.
            let window = if self.pool.has_window() { self.pool.tail_bytes() } else { 0 };
            let need = job.prompt.len().div_ceil(BLOCK_TOKENS) * self.pool.block_bytes() + window;
            if need > self.pool.budget() {
                self.pending.fetch_sub(1, Relaxed);
                let _ = tx.send(Event::Failed(ApiError::unavailable(format!(
                    "the prompt needs {need} bytes of KV cache; the budget is {} bytes",
                    self.pool.budget()
                ))));
                continue;
            }
            if job.pinned {
                self.sessions.pin_owner(&job.tenant);
            }
            let tok = &self.model.tokenizer;
            let c = match &job.text {
                Some(text) => match self.sessions.checkout(&job.tenant, job.session.as_deref(), text, job.add_special, tok) {
                    Ok(c) => c,
                    Err(e) => {
                        self.pending.fetch_sub(1, Relaxed);
                        let _ = tx.send(Event::Failed(ApiError::bad_request(format!("tokenizing the prompt: {e}"))));
                        continue;
                    }
                },
                None => self.sessions.checkout_tokens(&job.tenant, job.session.as_deref(), &job.prompt),
            };
            // Restored from disk with its checksum still running: keep the job to
            // admit it again, matched anew, should the file prove corrupt.
            let retry = c.restore.is_some().then(|| job.clone());
            // The cache holds c.tokens[..reused]; the last prompt token is always
            // recomputed, since its logits start generation.
            let prompt = c.tokens;
            let cached_len = c.reused.min(prompt.len().saturating_sub(1));
            let mut kv = c.kv;
            kv.truncate(cached_len);
            if prompt.is_empty() || prompt.len() >= self.model.config.max_positions {
                self.pending.fetch_sub(1, Relaxed);
                let _ = tx.send(Event::Failed(ApiError::bad_request(format!(
                    "the prompt has {} tokens; the model's context is {}",
                    prompt.len(),
                    self.model.config.max_positions
                ))));
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
                let _ =
                    tx.send(Event::Started { session_id: c.session_id.clone(), prompt_tokens: prompt.len(), cached_tokens: cached_len });
            }
            let text_base = job.text.as_ref().map_or(0, |t| t.len());
            let out = Decoding::new(&self.model.tokenizer, &prompt, &job.params, text_base);
            self.next_id += 1;
            self.active.push(Seq {
                id: self.next_id,
                tenant: job.tenant,
                session_id: c.session_id,
                events: tx,
                prompt_text: job.text,
                prompt_ends: c.token_ends,
                out,
                tokens: prompt[..cached_len].to_vec(),
                prompt,
                kv,
                input: Vec::new(),
                next: None,
                submitted,
                last_token: None,
                restore: c.restore.zip(retry),
                cached: cached_len,
                match_kind: c.kind.name(),
                forgotten: false,
            });
        }
    }

    /// Reserves room for `n` tokens in sequence `at`, making room first if the pool is short
    /// (`SessionStore::make_room`: idle prefix blocks, then idle sessions, only as much as
    /// the reservation can take — its new blocks, a copied partial block, a recent window).
    fn reserve(&mut self, at: usize, n: usize) -> bool {
        if self.active[at].kv.reserve(n).is_ok() {
            return true;
        }
        let most = (n.div_ceil(BLOCK_TOKENS) + 1) * self.pool.block_bytes() + self.pool.tail_bytes();
        self.sessions.make_room(most) && self.active[at].kv.reserve(n).is_ok()
    }

    fn step(&mut self) {
        // Decoders first: each needs room for one token.
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].next.is_some() && !self.reserve(i, 1) {
                // NOTE: no preemption yet; a sequence that cannot grow ends as if
                // it hit its length limit, keeping what it has.
                let rest = self.active[i].out.flush();
                if !rest.is_empty() {
                    let _ = self.active[i].events.send(Event::Text(rest));
                }
                self.retire(i, Ok(FinishReason::Length));
                continue;
            }
            i += 1;
        }
        // One prefill chunk, round-robin by sequence id.
        let mut cands: Vec<usize> = (0..self.active.len()).filter(|&i| self.active[i].prefilling()).collect();
        let split = cands.iter().position(|&i| self.active[i].id > self.last_prefill).unwrap_or(0);
        cands.rotate_left(split);
        let mut chosen = None;
        for &c in &cands {
            let s = &self.active[c];
            let n = (s.prompt.len() - s.tokens.len()).min(self.config.prefill_chunk.max(1));
            if self.reserve(c, n) {
                chosen = Some((c, n));
                break;
            }
        }
        let decoding = self.active.iter().any(|s| s.next.is_some());
        if chosen.is_none() && !decoding {
            if let Some(&c) = cands.first() {
                // Nothing runs that could ever free memory: this one cannot fit now.
                let e = ApiError::unavailable(format!(
                    "KV cache budget exhausted ({} of {} bytes in use); retry later",
                    self.pool.used(),
                    self.pool.budget()
                ));
                self.retire(c, Err(e));
            }
            return;
        }
        let chunk_of = chosen.map(|(c, _)| self.active[c].id);
        let mut want = Vec::with_capacity(self.active.len());
        for (i, s) in self.active.iter_mut().enumerate() {
            s.input.clear();
            if let Some(t) = s.next {
                s.input.push(t);
                want.push(Logits::Last);
            } else if let Some((c, n)) = chosen.filter(|&(c, _)| c == i) {
                let at = s.tokens.len();
                s.input.extend_from_slice(&s.prompt[at..at + n]);
                want.push(if at + n == s.prompt.len() { Logits::Last } else { Logits::None });
                let _ = c;
            } else {
                want.push(Logits::None);
            }
        }
        if let Some(id) = chunk_of {
            self.last_prefill = id;
        }
        let mut who = Vec::new();
        let mut steps = Vec::new();
        for (i, s) in self.active.iter_mut().enumerate() {
            if s.input.is_empty() {
                continue;
            }
            let Seq { input, tokens, kv, .. } = s;
            steps.push(SeqStep { tokens: input.as_slice(), first_pos: tokens.len(), positions: None, key_mask: None, kv, logits: want[i] });
            who.push(i);
        }
        if steps.is_empty() {
            return;
        }
        let result = self.model.forward(&mut steps);
        drop(steps);
        self.metrics.steps.fetch_add(1, Relaxed);
        let outs = match result {
            Ok(o) => o,
            Err(e) => {
                tracing::error!("forward failed: {e}");
                for &i in who.iter().rev() {
                    let s = &mut self.active[i];
                    let keep = s.tokens.len();
                    s.kv.truncate(keep);
                    self.retire(i, Err(ApiError::internal(format!("model error: {e}"))));
                }
                return;
            }
        };
        // Process in reverse so retiring (removal) keeps earlier indices valid.
        for (&i, mut logits) in who.iter().zip(outs).rev() {
            let s = &mut self.active[i];
            if s.next.is_none() {
                self.metrics.tokens_computed.fetch_add(s.input.len() as u64, Relaxed);
            }
            let input = std::mem::take(&mut s.input);
            s.tokens.extend_from_slice(&input);
            s.input = input;
            if logits.is_empty() {
                continue;
            }
            if self.active[i].restore.is_some() && !self.settle_restore(i) {
                continue;
            }
            if let Some(outcome) = self.sample(i, &mut logits) {
                self.retire(i, outcome);
            }
        }
    }

    /// Waits for the checksum of the session sequence `at` was restored from.
    /// True: the file was sound; reports `Started`. False: it was corrupt (now
    /// deleted), and so may be the tokens and text matched against it: the
    /// sequence is dropped with what it computed and its job admitted again
    /// first, as if it had just arrived (it is matched anew, without the file).
    fn settle_restore(&mut self, at: usize) -> bool {
        let Some((p, job)) = self.active[at].restore.take() else { return true };
        if self.sessions.verify_restore(p) {
            let s = &self.active[at];
            let _ =
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
            let _ = s.events.send(owner_gone());
        } else {
            self.waiting.push_front((job, s.events, s.submitted));
        }
        false
    }

    /// Samples sequence `at`'s next token and streams its text; returns the
    /// outcome if the sequence is done.
    fn sample(&mut self, at: usize, logits: &mut [f32]) -> Option<Result<FinishReason, ApiError>> {
        let ctx = self.model.config.max_positions;
        let m = self.metrics.clone();
        let s = &mut self.active[at];
        let t = s.out.sample(logits);
        let now = Instant::now();
        match s.last_token {
            None => m.ttft.observe(now.duration_since(s.submitted).as_secs_f64()),
            Some(prev) => m.inter_token.observe(now.duration_since(prev).as_secs_f64()),
        }
        s.last_token = Some(now);
        m.tokens_generated.fetch_add(1, Relaxed);
        s.next = None;
        let step = match s.out.accept(t, s.tokens.len() + 1 < ctx) {
            Ok(step) => step,
            Err(e) => return Some(Err(ApiError::internal(format!("detokenizing: {e}")))),
        };
        if !step.release.is_empty() && s.events.send(Event::Text(step.release)).is_err() {
            return Some(Ok(FinishReason::Cancelled));
        }
        if let Some(finish) = step.done {
            return Some(Ok(finish));
        }
        s.next = Some(t);
        None
    }
}
