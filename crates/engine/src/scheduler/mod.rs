//! The scheduler: one engine thread owns the model's running sequences, the
//! KV pool and the session store; callers (the HTTP server, a test) talk to it
//! over channels. It knows neither HTTP nor async runtimes: events go out
//! through an [`EventSink`], failures are [`JobError`]s.
//!
//! ```text
//!  handlers --Job--> [waiting queue] --admit--> [active batch] --step--> Model::forward
//!     ^                (session busy,             every decoding seq: 1 token
//!     |                 batch full)               + prompt chunks, ≤ prefill_chunk tokens in all
//!     +---- Event (Started, Text, Finished | Failed) per request, over its own channel
//! ```
//! Each step runs every decoding sequence's next token and prompt chunks of the
//! prefilling sequences, at most `prefill_chunk` prompt tokens in all, in a single
//! forward call, so weights are read once per step and a new request's first
//! token never waits for another request's whole answer. Prompts share that budget
//! round-robin: several short ones go in one step (they then decode together, with
//! no later prefill inside their token gaps), a long one takes what is left, and it
//! cannot starve a short one. With `pack_prompts` off a step carries one prompt's chunk.
//!
//! Admission is by the KV budget: a request joins the batch only when its prompt's blocks fit
//! beside what the running prefills still need (room is made first through the policy's
//! `make_room`, the one RAM eviction path: idle prefix blocks, then idle sessions, offloaded
//! to disk); until then it waits, in order, for at most `admission_wait`
//! ([`JobErrorKind::Unavailable`] after). A prompt that could never fit the budget fails at
//! once ([`JobErrorKind::BadRequest`], naming the bytes); a chunk runs only if its blocks can
//! be reserved, and a request that cannot make progress while nothing else runs fails. A request whose sink is closed (client gone)
//! is cancelled before the next step; the tokens it
//! computed stay cached in its session.
//!
//! Invariant: a request's tokens do not depend on what else is in the batch
//! (batched forward = alone, tested in `crates/model/tests/it/chunking.rs`; the
//! server's concurrency test checks the end-to-end consequence).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Instant;

use engram_kv::KvPool;
use engram_model::Model;
use engram_policy::{BackgroundJob, ContextPolicy, IdleInterrupt, OwnerKey, PendingRestore, PolicyControl, Retired};

use crate::decoding::Decoding;
use crate::decoding::FinishReason;
use crate::draft_model::{DraftModel, DraftState};
use crate::metrics::Metrics;
use crate::sampling::SamplingParams;
use crate::speculate::{DraftTree, PromptLookup};

mod admit;
mod alone;
mod background;
mod cache;
mod draft_budget;
mod lone;
mod repair;
mod step;
mod stepped;

pub use alone::{run_alone, AloneRun};
use cache::SeqCacheSlot;
use draft_budget::{Acceptance, StepCosts};
pub use lone::{generate_on_cache, LoneSequence};
pub use stepped::{Stepped, SteppedJob};

/// Scheduler limits.
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Most prompt tokens prefilled per step, over all the prompts the step carries.
    pub prefill_chunk: usize,
    /// Whether several prompts share a step's `prefill_chunk` (true, the default: prompts that
    /// arrive together are prefilled together and then decode together, without later prefill
    /// steps inside their token gaps; each waits for the whole step) or one prompt's chunk a
    /// step (false: the first of them answers sooner, the sessions already decoding stall for
    /// each later prompt). `docs/benchmarks.md` measures both.
    pub pack_prompts: bool,
    /// Most sequences in the batch at once.
    pub max_batch: usize,
    /// Most requests queued or running before new ones get 429.
    pub max_pending: usize,
    /// Speculative decoding with prompt lookup for every request that does not say otherwise
    /// (`None`: off unless a request asks; `speculate.rs`).
    pub speculation: Option<PromptLookup>,
    /// A draft model that drafts instead of prompt lookup wherever speculation is on
    /// (`draft_model.rs`); `None`: prompt lookup.
    pub draft_model: Option<Arc<DraftModel>>,
    /// How many drafts a speculating sequence's tree may hold (`draft_budget.rs`).
    pub draft_budget: DraftBudget,
    /// How long a request may wait for KV memory (or a batch slot) before it fails with
    /// [`JobErrorKind::Unavailable`] (the server's 503 with `Retry-After`).
    pub admission_wait: std::time::Duration,
    /// Most of the batch's slots one account ([`account`]) holds at once; `None`:
    /// `max_batch` less a quarter of it (at least one slot), so another account's request
    /// always finds a free slot at the next step ([`SchedulerConfig::active_per_tenant`]).
    pub max_active_per_tenant: Option<usize>,
    /// Most requests one account has queued or running (the server's 429 past it); `None`:
    /// `max_pending` less a quarter of it ([`SchedulerConfig::pending_per_tenant`]).
    pub max_pending_per_tenant: Option<usize>,
    /// The share of each step's rows that low-priority background work (a dual-stream
    /// summary) may add while requests run, in `[0, 1]` (0: it runs only when no request
    /// does); alone it takes whole steps (`scheduler/background.rs`).
    pub background_share: f32,
    /// Most prompt tokens a low-priority background job prefills in one step, alone or beside
    /// requests: a request that arrives while such a job runs alone waits at most this chunk
    /// (default [`DEFAULT_BACKGROUND_CHUNK`]).
    pub background_chunk: usize,
}

/// The default [`SchedulerConfig::prefill_chunk`]: prompt tokens per forward call. Bounds peak
/// activation memory (the FFN buffers are `chunk * ffn * 4` bytes each) while keeping matmuls
/// wide enough to run at GEMM speed.
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

/// The default [`SchedulerConfig::background_chunk`]: a few decode steps' worth of work on the
/// models this runs, so a summary or cache refresh running alone delays an arriving request
/// by about that much.
pub const DEFAULT_BACKGROUND_CHUNK: usize = 32;

/// The default [`SchedulerConfig::background_share`]: a busy server still advances background
/// work, at about a tenth of the rows.
pub const DEFAULT_BACKGROUND_SHARE: f32 = 0.1;

impl SchedulerConfig {
    /// The slots one account may hold: `max_active_per_tenant`, else `max_batch - max(1,
    /// max_batch / 4)`; at least 1.
    pub fn active_per_tenant(&self) -> usize {
        self.max_active_per_tenant.unwrap_or(self.max_batch.saturating_sub((self.max_batch / 4).max(1))).max(1)
    }

    /// The requests one account may have queued or running: `max_pending_per_tenant`, else
    /// `max_pending - max(1, max_pending / 4)`; at least 1.
    pub fn pending_per_tenant(&self) -> usize {
        self.max_pending_per_tenant.unwrap_or(self.max_pending.saturating_sub((self.max_pending / 4).max(1))).max(1)
    }
}

/// The account an owner key belongs to (its tenant, [`OwnerKey::tenant_of`]), which fairness
/// and limits count by.
pub fn account(owner: &str) -> &str {
    OwnerKey::tenant_of(owner)
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            pack_prompts: true,
            max_batch: 16,
            max_pending: 256,
            speculation: None,
            draft_model: None,
            draft_budget: DraftBudget::default(),
            admission_wait: std::time::Duration::from_secs(60),
            max_active_per_tenant: None,
            max_pending_per_tenant: None,
            background_share: DEFAULT_BACKGROUND_SHARE,
            background_chunk: DEFAULT_BACKGROUND_CHUNK,
        }
    }
}

/// How many drafts a speculating sequence's next tree may hold. Either way the tokens kept are
/// those decoding one by one produces; only the speed differs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DraftBudget {
    /// As many as this machine's measured step costs and the sequence's acceptance rate make
    /// worth it: the count that yields the most tokens per second of step (`draft_budget.rs`),
    /// within the acceptance-driven cap. The trees depend on timings, so they differ between
    /// machines and runs.
    #[default]
    Measured,
    /// As many as the sequence's recent acceptance allows, up to the drafter's maximum (the cap
    /// doubles while drafts are accepted and halves while they are not), whatever a step
    /// costs: the same trees on every machine.
    Acceptance,
}

impl std::str::FromStr for DraftBudget {
    type Err = String;

    /// `measured` or `acceptance`, as `serve --draft-budget` names them.
    fn from_str(s: &str) -> Result<DraftBudget, String> {
        match s {
            "measured" => Ok(DraftBudget::Measured),
            "acceptance" => Ok(DraftBudget::Acceptance),
            _ => Err(format!("a draft budget is `measured` or `acceptance`, not {s:?}")),
        }
    }
}

/// One generation request.
#[derive(Clone)]
pub struct Job {
    /// Whose state the job may reuse: sessions never cross it. Its tenant
    /// ([`OwnerKey::tenant`]) is the account fair admission counts.
    pub owner: OwnerKey,
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
    /// This request's own threshold for serving its conversation sparse (`None`: the
    /// long-context layer's default, if there is one).
    pub long_context_after: Option<usize>,
}

impl Job {
    /// A job for `owner` whose prompt is given as token ids (no text to match, no special
    /// tokens added, no named session, not pinned).
    pub fn from_tokens(owner: OwnerKey, prompt: Vec<u32>, params: SamplingParams) -> Job {
        Job { owner, session: None, text: None, add_special: false, prompt, params, pinned: false, long_context_after: None }
    }
}

/// What a request hears back, in order: `Started`, any number of `Text`,
/// then `Finished` — or a single `Failed` before `Started`. `E` is how a failure is
/// told: a [`JobError`] here, the caller's own error type after [`Event::map_err`].
#[derive(Debug)]
pub enum Event<E = JobError> {
    Started {
        session_id: String,
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    Text(String),
    /// A generated token's log-probabilities (only when the job's `params.logprobs` asks),
    /// sent before any text of that token.
    Logprob(crate::logprobs::TokenLogprob),
    /// `stop_string`: the text was cut at a stop string (not a stop token).
    Finished {
        finish: FinishReason,
        completion_tokens: usize,
        stop_string: bool,
    },
    Failed(E),
}

impl<E> Event<E> {
    /// The same event with its failure converted.
    pub fn map_err<F>(self, f: impl FnOnce(E) -> F) -> Event<F> {
        match self {
            Event::Started { session_id, prompt_tokens, cached_tokens } => Event::Started { session_id, prompt_tokens, cached_tokens },
            Event::Text(t) => Event::Text(t),
            Event::Logprob(l) => Event::Logprob(l),
            Event::Finished { finish, completion_tokens, stop_string } => Event::Finished { finish, completion_tokens, stop_string },
            Event::Failed(e) => Event::Failed(f(e)),
        }
    }
}

/// Why a job failed; the server maps each kind to its HTTP status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JobErrorKind {
    /// The request cannot be served as given (a prompt past the context, untokenizable).
    BadRequest,
    /// Its owner was deleted before it ran.
    NotFound,
    /// Not now: the KV budget cannot take it (retry later).
    Unavailable,
    /// The engine failed (model error, detokenizing).
    Internal,
}

/// A failed job: its kind and a message for the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobError {
    pub kind: JobErrorKind,
    pub message: String,
}

impl JobError {
    fn new(kind: JobErrorKind, message: impl Into<String>) -> JobError {
        JobError { kind, message: message.into() }
    }
}

impl std::fmt::Display for JobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Where one job's [`Event`]s go (a channel to an HTTP handler, a test's vector).
pub trait EventSink: Send {
    /// Delivers an event; false once the receiver is gone (the job is then cancelled).
    fn send(&self, event: Event) -> bool;
    /// Whether the receiver is gone.
    fn is_closed(&self) -> bool;
}

/// What the engine thread is asked to do.
pub enum Command {
    /// Queue a job; its events go to the sink. The instant is when it was submitted.
    Submit(Job, Box<dyn EventSink>, Instant),
    /// Drop everything cached for an owner (a deleted agent or user): its sessions, its
    /// running sequences' caches once they end, its queued jobs (which fail).
    Forget(OwnerKey),
    /// A message for the policy that takes its type (`ContextPolicy::control`: a dual-stream
    /// user's anchors and facts, say), applied before any job submitted after it.
    Control(PolicyControl),
    /// The policy may have background work again (its state changed outside the engine:
    /// the server's RAG routes after an ingest or a query); the idle hook runs when idle.
    Wake,
}

/// Runs the engine loop for `model` on this thread, every sequence's reuse and keeping decided
/// by `policy`, until every [`Command`] sender is gone and the running jobs have finished.
/// `pending` counts jobs queued or running: the caller increments it on submit, the engine
/// decrements it as each job ends.
pub fn run_engine(
    model: &Model,
    pool: KvPool,
    config: SchedulerConfig,
    policy: Box<dyn ContextPolicy>,
    metrics: Arc<Metrics>,
    pending: Arc<AtomicUsize>,
    rx: Receiver<Command>,
) {
    Engine::new(model, pool, config, policy, metrics, pending).run(rx)
}

/// Runs `policy`'s background jobs ([`ContextPolicy::next_background`]) on this thread, through
/// the engine's own step, until it asks for none: for callers that drive a policy without an
/// engine thread (tests and benchmarks of one policy). Returns how many jobs ended.
pub fn drain_background(model: &Model, pool: KvPool, policy: &mut dyn ContextPolicy) -> u64 {
    /// The caller's policy, lent to the engine for the call.
    struct Lent<'a>(&'a mut dyn ContextPolicy);
    impl engram_policy::PolicyLayer for Lent<'_> {
        fn inner(&self) -> &dyn ContextPolicy {
            &*self.0
        }
        fn inner_mut(&mut self) -> &mut dyn ContextPolicy {
            &mut *self.0
        }
    }
    let metrics = Arc::new(Metrics::default());
    let mut engine = Engine::new(model, pool, SchedulerConfig::default(), Box::new(Lent(policy)), metrics.clone(), Arc::default());
    loop {
        engine.pull_background();
        if engine.active.is_empty() {
            break;
        }
        engine.step();
    }
    metrics.background_jobs.load(Relaxed)
}

/// What a request whose owner was forgotten (a deleted agent) before it ran gets.
fn owner_gone() -> Event {
    Event::Failed(JobError::new(JobErrorKind::NotFound, "the owner of this request was deleted before it ran"))
}

/// A request in the batch.
struct Seq<'m> {
    id: u64,
    owner: OwnerKey,
    session_id: String,
    events: Box<dyn EventSink>,
    /// The prompt text, if the request had one (sessions are matched by it).
    prompt_text: Option<String>,
    /// Byte end of each prompt token's text in `prompt_text` (the generated
    /// tokens' follow in `out`, in `prompt_text + out.decoded()`).
    prompt_ends: Vec<usize>,
    prompt: Vec<u32>,
    /// Exactly what `kv`'s own sequence holds.
    tokens: Vec<u32>,
    /// The sequence's cache: the policy's spans then its own paged tokens, or a cache the
    /// policy built (`cache.rs`).
    kv: SeqCacheSlot,
    /// This step's input.
    input: Vec<u32>,
    /// The sampled token to feed next (decoding); `None` while prefilling.
    next: Option<u32>,
    /// This step's tree of drafts after `next` (speculative decoding), its input when set.
    draft: Option<DraftTree>,
    /// Most drafts its next tree may hold, adapted to how many were accepted (`step.rs`).
    draft_cap: usize,
    /// How often its drafts were accepted lately, for the measured draft budget.
    acceptance: Acceptance,
    /// Steps to decode without drafts after trees that were all rejected.
    draft_cooldown: usize,
    /// Tokens the policy's view holds before the sequence's own (`Checkout::lookup`): prompt
    /// lookup searches them, then `tokens`.
    lookup: Vec<u32>,
    /// The draft model's KV for this sequence (with `SchedulerConfig::draft_model`).
    drafter: Option<DraftState>,
    /// Sampling, detokenizing and stopping (`decoding.rs`).
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
    /// Set for forward work the policy asked for (`background.rs`): no client, no `pending`
    /// count, its end goes to `ContextPolicy::background_done`.
    background: Option<background::BackgroundSeq>,
    /// Reused KV to recompute before anything else runs for it (`repair.rs`); `None` once done
    /// or when its checkout had none.
    repair: Option<engram_policy::Repair>,
}

impl<'m> Seq<'m> {
    /// A sequence about to prefill `prompt` over `kv` (which holds `prompt[..cached]`), with no
    /// text to match, no restore pending, nothing to look up and no drafts yet.
    #[allow(clippy::too_many_arguments)]
    fn start(
        id: u64,
        owner: OwnerKey,
        session_id: String,
        events: Box<dyn EventSink>,
        prompt: Vec<u32>,
        cached: usize,
        kv: SeqCacheSlot,
        out: Decoding<'m>,
        submitted: Instant,
    ) -> Seq<'m> {
        Seq {
            id,
            owner,
            session_id,
            events,
            prompt_text: None,
            prompt_ends: Vec::new(),
            out,
            tokens: prompt[..cached].to_vec(),
            prompt,
            kv,
            input: Vec::new(),
            next: None,
            draft: None,
            draft_cap: 4,
            acceptance: Acceptance::default(),
            draft_cooldown: 0,
            drafter: None,
            submitted,
            last_token: None,
            restore: None,
            lookup: Vec::new(),
            cached,
            match_kind: "miss",
            forgotten: false,
            background: None,
            repair: None,
        }
    }

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
    /// What is reused, kept, evicted and persisted (`policy.rs`).
    policy: Box<dyn ContextPolicy + 'm>,
    /// Whether the policy may have background work (asked again after every retirement).
    idle_work: bool,
    /// What the idle hook's work asks between its steps: a job submitted (`pending` > 0).
    interrupt: IdleInterrupt,
    waiting: VecDeque<(Job, Box<dyn EventSink>, Instant)>,
    active: Vec<Seq<'m>>,
    next_id: u64,
    /// Id of the sequence that got the last prefill chunk (round-robin).
    last_prefill: u64,
    /// Forward steps' seconds by row count, for the measured draft budget.
    step_costs: StepCosts,
    /// Background jobs taken from the policy, not started yet (`background.rs`).
    background_queue: VecDeque<BackgroundJob>,
    /// Rows low-priority background work may still take while requests run.
    background_credit: f64,
    /// This step's cap on a low-priority background prefill chunk (`None`: none may run).
    background_chunk: Option<usize>,
    /// Set by a lone sequence's run (`lone.rs`): each retiring request's generated tokens and
    /// their text ends go to `decoded` (a request's events carry its text, not its tokens).
    record_decoded: bool,
    decoded: Option<lone::Decoded>,
}

impl<'m> Engine<'m> {
    fn new(
        model: &'m Model,
        pool: KvPool,
        config: SchedulerConfig,
        policy: Box<dyn ContextPolicy + 'm>,
        metrics: Arc<Metrics>,
        pending: Arc<AtomicUsize>,
    ) -> Self {
        metrics.kv_bytes_budget.store(pool.budget() as u64, Relaxed);
        Engine {
            idle_work: true,
            interrupt: IdleInterrupt::on_submitted(pending.clone()),
            model,
            pool,
            config,
            metrics,
            pending,
            policy,
            waiting: VecDeque::new(),
            active: Vec::new(),
            next_id: 0,
            last_prefill: 0,
            step_costs: StepCosts::default(),
            background_queue: VecDeque::new(),
            background_credit: 0.0,
            background_chunk: None,
            record_decoded: false,
            decoded: None,
        }
    }

    fn run(mut self, rx: Receiver<Command>) {
        let mut open = true;
        loop {
            if self.active.is_empty() && self.waiting.is_empty() && open {
                // Forward work the policy asked for runs before the idle hook's own work (none
                // is started once every sender is gone: the engine finishes what runs and stops).
                self.pull_background();
            }
            if self.active.is_empty() && self.waiting.is_empty() {
                if !open {
                    break;
                }
                if self.idle_work {
                    // The idle hook: one slice of the policy's background work per pass, so a
                    // job that arrives meanwhile waits at most one slice.
                    match rx.try_recv() {
                        Ok(c) => self.command(c),
                        Err(TryRecvError::Empty) => {
                            self.idle_work = self.policy.idle_slice(&self.interrupt);
                            if !self.idle_work {
                                // What the background work changed (files written) shows.
                                self.refresh_gauges();
                            }
                            continue;
                        }
                        Err(TryRecvError::Disconnected) => open = false,
                    }
                } else {
                    match rx.recv() {
                        Ok(c) => self.command(c),
                        Err(_) => break,
                    }
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
            // Before admission: a job a request waits on holds its session first.
            if open {
                self.pull_background();
            }
            self.admit();
            self.step();
            self.refresh_gauges();
        }
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Submit(job, tx, t) => self.waiting.push_back((job, tx, t)),
            Command::Forget(owner) => self.forget(&owner),
            Command::Control(msg) => match self.policy.control(msg) {
                // A change may leave background work (a summary) for the idle hook.
                Ok(reply) => self.idle_work |= reply.wake,
                Err(e) => {
                    tracing::warn!("a context-policy message was not applied: {e}");
                    // Applied in part (a turn's anchors and facts before its state entry).
                    self.idle_work = true;
                }
            },
            Command::Wake => self.idle_work = true,
        }
    }

    fn refresh_gauges(&self) {
        let m = &self.metrics;
        m.kv_bytes_used.store(self.pool.used() as u64, Relaxed);
        let st = self.policy.stats();
        m.sessions_idle.store(st.sessions_idle, Relaxed);
        m.sessions_on_disk.store(st.sessions_on_disk, Relaxed);
        m.sessions_restored.store(st.sessions_restored, Relaxed);
        m.disk_bytes_used.store(st.disk_bytes_used, Relaxed);
        m.set_policy_gauges(st.named);
        m.sequences_running.store(self.active.len() as u64, Relaxed);
        m.requests_waiting.store(self.waiting.len() as u64, Relaxed);
    }

    /// Drops everything cached for `owner`: its sessions (RAM and disk), the
    /// caches of its running sequences once they end, and its queued requests,
    /// which fail (their owner is gone).
    fn forget(&mut self, owner: &OwnerKey) {
        self.drop_queued_background(owner);
        self.policy.forget_owner(owner);
        for s in self.active.iter_mut().filter(|s| &s.owner == owner) {
            s.forgotten = true;
        }
        let (gone, keep): (VecDeque<_>, VecDeque<_>) =
            std::mem::take(&mut self.waiting).into_iter().partition(|(job, ..)| &job.owner == owner);
        self.waiting = keep;
        for (_, events, _) in gone {
            self.pending.fetch_sub(1, Relaxed);
            events.send(owner_gone());
        }
    }

    /// Ends a sequence: reports, and returns its cache to the session store.
    fn retire(&mut self, at: usize, outcome: Result<FinishReason, JobError>) {
        let _span = tracing::debug_span!("retire", owner = %self.active[at].owner, tokens = self.active[at].tokens.len()).entered();
        if self.active[at].repair.take().is_some() {
            // Ended before its repair ran (cancelled): its KV is not what its tokens compute.
            let s = &mut self.active[at];
            s.tokens.clear();
            s.kv.truncate(0);
        }
        // Ended before its first token (cancelled, failed): what it computed on
        // an unverified restore is kept only if the file proves sound.
        if let Some((p, _)) = self.active[at].restore.take() {
            if !self.policy.verify_restore(p) {
                self.metrics.restores_failed.fetch_add(1, Relaxed);
                self.active[at].tokens.clear();
            }
        }
        let s = self.active.remove(at);
        if s.background.is_some() {
            return self.finish_background(s, outcome.map(|_| ()).map_err(|e| e.message));
        }
        if self.record_decoded {
            self.decoded = Some(lone::Decoded { generated: s.out.generated().to_vec(), token_ends: s.out.finished_token_ends() });
        }
        self.pending.fetch_sub(1, Relaxed);
        let outcome_finish = outcome.as_ref().ok().copied();
        match outcome {
            Ok(finish) => {
                if finish == FinishReason::Cancelled {
                    self.metrics.cancelled.fetch_add(1, Relaxed);
                }
                s.events.send(Event::Finished {
                    finish,
                    completion_tokens: s.out.generated().len(),
                    stop_string: s.out.stopped_by_string(),
                });
            }
            Err(e) => {
                s.events.send(Event::Failed(e));
            }
        }
        if s.forgotten {
            // Also drops what a restore verified after the owner was forgotten
            // (it joined the store then) and deletes its file again.
            self.policy.forget_owner(&s.owner);
            return;
        }
        let unfed = match outcome_finish {
            Some(FinishReason::Length | FinishReason::Cancelled) => s.out.generated().last().copied(),
            _ => None,
        };
        let n = s.tokens.len();
        let own = s.kv.is_own();
        let (kv, cache) = s.kv.into_retired(&self.pool, n);
        if own && cache.is_none() {
            // Its own cache could not be brought back to its tokens (a step failed half-way):
            // nothing of the sequence's KV is handed back, so no tokens are claimed either.
            self.policy.retire(Retired {
                owner: s.owner.clone(),
                session_id: s.session_id,
                text: String::new(),
                tokens: Vec::new(),
                token_ends: Vec::new(),
                kv,
                cache: None,
                unfed: None,
            });
            self.idle_work = true;
            return;
        }
        let (text, token_ends) = match s.prompt_text {
            Some(p) => {
                let mut ends = s.prompt_ends;
                ends.extend_from_slice(s.out.token_ends());
                ends.truncate(n);
                (p + s.out.decoded(), ends)
            }
            None => (String::new(), vec![0; n]),
        };
        self.policy.retire(Retired {
            owner: s.owner.clone(),
            session_id: s.session_id,
            text,
            tokens: s.tokens,
            token_ends,
            kv,
            cache,
            unfed,
        });
        self.idle_work = true;
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
}
