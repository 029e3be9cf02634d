//! [`LoneSequence`]: one sequence run through the engine's own step on the caller's thread, for
//! callers without an engine thread (benchmarks, a test's cold reference, a tool): each run is
//! one request admitted by a one-sequence policy that hands the engine this sequence's cache,
//! and gets it back when the request retires. There is no decode loop here: the engine's step
//! computes every token, as it does for a server's requests.
//!
//! ```text
//!  generate(prompt) ─► reuse: the longest common token prefix of the cache and the prompt
//!                   ─► Engine (this sequence alone): admit ─► stop()? ─► step ─► … ─► retire
//!                   ─► the cache is what the request retired with (prompt + fed tokens)
//!  prefill(tokens)  ─► the same, as a background job that samples nothing
//!  score(tokens)    ─► a forward pass over the cache with every token's logits (no sampling)
//! ```
//!
//! Invariant: `tokens()` is always exactly what `kv()` holds, token for token (generated tokens
//! as generated, never re-tokenized), and reuse only ever keeps a prefix of them; a run
//! computes what the same request computes on an engine thread over the same cache (same
//! admission, same step, same sampling): a fresh `LoneSequence` is the cold path.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use engram_kv::{KvPool, SeqCache, SeqKv};
use engram_model::{Logits, Model, SeqStep};
use engram_policy::{BackgroundJob, BackgroundPriority, Checkout, MatchKind, OwnerKey, Retired};

use super::alone::{lone_engine, Lone};
use super::{Engine, Event, EventSink, Job, JobErrorKind, SchedulerConfig};
use crate::decoding::FinishReason;
use crate::error::EngineError;
use crate::generation::{Generation, Timings};
use crate::metrics::Metrics;
use crate::sampling::SamplingParams;

/// A retiring request's generated tokens and their text ends (recorded by the engine for a
/// lone run: the request's events carry its text, not its tokens).
pub(super) struct Decoded {
    pub generated: Vec<u32>,
    pub token_ends: Vec<usize>,
}

/// A lone request's events, kept for the caller's thread; closed once the caller's callback
/// refused text (the engine then cancels the request before its next step).
struct Collect {
    events: Arc<Mutex<Vec<Event>>>,
    closed: Arc<AtomicBool>,
}

impl EventSink for Collect {
    fn send(&self, event: Event) -> bool {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push(event);
        !self.closed.load(Relaxed)
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Relaxed)
    }
}

/// A sequence and its cache, run through the engine's step (module doc).
pub struct LoneSequence<'m> {
    model: &'m Model,
    pool: KvPool,
    config: SchedulerConfig,
    kv: SeqKv,
    tokens: Vec<u32>,
}

/// How one run went, before it is turned into a [`Generation`].
struct Ran {
    text: String,
    finish: Option<FinishReason>,
    decoded: Option<Decoded>,
    /// When the first token was sampled (the prefill's end).
    first: Option<Instant>,
}

impl<'m> LoneSequence<'m> {
    /// An empty sequence whose cache is charged to `pool`, run with the engine's default
    /// configuration (prefill chunks of [`super::DEFAULT_PREFILL_CHUNK`] tokens, no speculation).
    pub fn new(model: &'m Model, pool: &KvPool) -> LoneSequence<'m> {
        LoneSequence::from_parts(model, SeqKv::new(pool), Vec::new())
    }

    /// A sequence resuming from a cache that holds exactly `tokens` (a session, a shared
    /// prefix, a restored file).
    pub fn from_parts(model: &'m Model, kv: SeqKv, tokens: Vec<u32>) -> LoneSequence<'m> {
        assert_eq!(kv.len(), tokens.len(), "a cache must hold exactly its tokens");
        LoneSequence { model, pool: kv.pool().clone(), config: SchedulerConfig::default(), kv, tokens }
    }

    /// The cache and the tokens it holds.
    pub fn into_parts(self) -> (SeqKv, Vec<u32>) {
        (self.kv, self.tokens)
    }

    /// Sets the engine's prefill chunk (prompt tokens per step), at least 1.
    pub fn with_prefill_chunk(mut self, n: usize) -> Self {
        self.config.prefill_chunk = n.max(1);
        self
    }

    /// Runs with `config` (its prefill chunk, speculation, draft model; batch and queue limits
    /// do not matter to one sequence).
    pub fn with_config(mut self, config: SchedulerConfig) -> Self {
        self.config = config;
        self
    }

    /// The tokens the cache holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The sequence's cache.
    pub fn kv(&self) -> &SeqKv {
        &self.kv
    }

    /// Drops cached tokens from `n` on.
    pub fn truncate(&mut self, n: usize) {
        self.kv.truncate(n);
        self.tokens.truncate(n);
    }

    /// Generates a continuation of `prompt`, reusing the longest cached token prefix (all but
    /// the last prompt token at most: its logits start generation). `on_text` receives the
    /// streamed text (never a split UTF-8 character, never part of a stop string); returning
    /// `false` cancels before the next step. Afterwards the cache holds the prompt and every
    /// generated token that was fed.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, EngineError> {
        Ok(self.generate_until(prompt, params, on_text, &mut || false)?.expect("never stopped"))
    }

    /// [`LoneSequence::generate`] that asks `stop` before every engine step (each prefill chunk
    /// and each decode step) and returns `None` as soon as it says yes — preemptible work: the
    /// caller waits at most one step. A stopped run's cache holds its whole steps (`tokens()`
    /// stays exact); one never stopped computes exactly what `generate` does.
    pub fn generate_until(
        &mut self,
        prompt: &[u32],
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str) -> bool,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Option<Generation>, EngineError> {
        params.validate()?;
        if prompt.is_empty() {
            return Err(EngineError::BadRequest("the prompt is empty".into()));
        }
        let start = Instant::now();
        let common = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        self.truncate(common);
        // Nothing to sample: the prompt is prefilled, as a background job that samples nothing.
        let prefill_only = params.max_tokens == 0;
        let Some(ran) = self.run(prompt, params, prefill_only, on_text, stop)? else { return Ok(None) };
        Ok(Some(ran.into_generation(prompt.len(), common, start, prefill_only)))
    }

    /// Appends `tokens` to the cache through the engine's step (prefill chunks, nothing
    /// sampled).
    pub fn prefill(&mut self, tokens: &[u32]) -> Result<(), EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::BadRequest("nothing to prefill".into()));
        }
        let prompt: Vec<u32> = self.tokens.iter().chain(tokens).copied().collect();
        let params = SamplingParams { max_tokens: 0, ..SamplingParams::default() };
        self.run(&prompt, &params, true, &mut |_| true, &mut || false)?.expect("never stopped");
        Ok(())
    }

    /// Appends `tokens` to the cache in prefill chunks and returns every token's logits
    /// (`tokens.len() * vocab` floats): a forward pass for scoring and exactness checks, with
    /// the chunk boundaries the engine's step uses. Nothing is sampled.
    pub fn score(&mut self, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::BadRequest("nothing to score".into()));
        }
        let limit = self.model.config.max_positions;
        if self.tokens.len() + tokens.len() > limit {
            return Err(EngineError::BadRequest(format!(
                "{} tokens exceed the model's context of {limit}",
                self.tokens.len() + tokens.len()
            )));
        }
        let mut out = Vec::with_capacity(tokens.len() * self.model.config.vocab);
        for chunk in tokens.chunks(self.config.prefill_chunk.max(1)) {
            self.kv.reserve(chunk.len())?;
            let mut step = [SeqStep::new(chunk, self.tokens.len(), &mut self.kv, Logits::All)];
            let logits = self.model.forward(&mut step)?.pop().unwrap_or_default();
            self.tokens.extend_from_slice(chunk);
            out.extend(logits);
        }
        Ok(out)
    }

    /// Runs `prompt` (whose first `self.tokens.len()` tokens the cache holds) as one sequence
    /// of an engine of its own: a request sampling with `params`, or with `prefill_only` a
    /// background job that prefills and samples nothing. The cache is handed to the engine and
    /// taken back at the end (or when `stop` says so, with its whole steps); a failed run
    /// leaves the cache empty.
    fn run(
        &mut self,
        prompt: &[u32],
        params: &SamplingParams,
        prefill_only: bool,
        on_text: &mut dyn FnMut(&str) -> bool,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Option<Ran>, EngineError> {
        let reused = self.tokens.len();
        let kind = if reused > 0 { MatchKind::Extend } else { MatchKind::Miss };
        let kv = std::mem::replace(&mut self.kv, SeqKv::new(&self.pool));
        self.tokens.clear();
        let checkout = Checkout::own(String::new(), kind, prompt.to_vec(), Vec::new(), reused, kv);
        if prefill_only {
            return self.run_prefill(checkout, params, stop);
        }
        match run_request(self.model, &self.pool, &self.config, checkout, params, on_text, stop) {
            Ended::Stopped(kv, tokens) => {
                (self.kv, self.tokens) = (kv, tokens);
                Ok(None)
            }
            Ended::Ran(ran, retired) => {
                if let Some(r) = retired.filter(|r| r.kv.len() == r.tokens.len()) {
                    (self.kv, self.tokens) = (r.kv, r.tokens);
                }
                ran.map(Some)
            }
        }
    }

    /// [`LoneSequence::run`] for a prefill: a background job that samples nothing.
    fn run_prefill(
        &mut self,
        checkout: Checkout,
        params: &SamplingParams,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Option<Ran>, EngineError> {
        let job = BackgroundJob {
            owner: OwnerKey::from("lone"),
            tag: 0,
            start: checkout,
            max_tokens: 0,
            stop: Vec::new(),
            priority: BackgroundPriority::Blocking,
            hidden: Vec::new(),
        };
        let (mut engine, done) = lone_engine(self.model, self.pool.clone(), self.config.clone(), job, Some(params.clone()));
        while !engine.active.is_empty() {
            if stop() {
                (self.kv, self.tokens) = take_back(&mut engine, &self.pool);
                return Ok(None);
            }
            engine.step();
        }
        drop(engine);
        let done = done.lock().unwrap_or_else(|e| e.into_inner()).take();
        match done.map(|d| d.outcome) {
            Some(Ok(out)) => {
                (self.kv, self.tokens) = (out.kv, out.tokens);
                Ok(Some(Ran { text: String::new(), finish: Some(FinishReason::Length), decoded: None, first: None }))
            }
            Some(Err(e)) => Err(EngineError::Failed(e)),
            None => Err(EngineError::Failed("the prefill ended without a result".into())),
        }
    }
}

/// Generates after `prompt` on `cache`, a cache of the caller's own that is not paged KV (a
/// sparse cache over KV offloaded to disk) and holds exactly `prompt[..cache.len()]`: one
/// request through the engine's step on this thread, as a policy's checkout carrying
/// [`Checkout::cache`] runs on an engine thread (`config`: its prefill chunk; the cache
/// decodes one token a step unless it allows drafts). Returns the generation and the cache,
/// holding the prompt and every generated token that was fed (`None` where the engine could
/// not bring it back to its tokens).
pub fn generate_on_cache(
    model: &Model,
    pool: &KvPool,
    config: &SchedulerConfig,
    cache: Box<dyn SeqCache>,
    prompt: &[u32],
    params: &SamplingParams,
    on_text: &mut dyn FnMut(&str) -> bool,
) -> Result<(Generation, Option<Box<dyn SeqCache>>), EngineError> {
    params.validate()?;
    if prompt.is_empty() {
        return Err(EngineError::BadRequest("the prompt is empty".into()));
    }
    if params.max_tokens == 0 {
        return Err(EngineError::BadRequest("max_tokens: a run on an own cache samples at least one token".into()));
    }
    let reused = cache.len();
    if reused >= prompt.len() {
        return Err(EngineError::BadRequest(format!(
            "the cache holds {reused} tokens; the prompt of {} must add at least one",
            prompt.len()
        )));
    }
    let start = Instant::now();
    let kind = if reused > 0 { MatchKind::Extend } else { MatchKind::Miss };
    let checkout =
        Checkout { cache: Some(cache), ..Checkout::own(String::new(), kind, prompt.to_vec(), Vec::new(), reused, SeqKv::new(pool)) };
    let (ran, retired) = match run_request(model, pool, config, checkout, params, on_text, &mut || false) {
        Ended::Ran(ran, retired) => (ran?, retired),
        Ended::Stopped(..) => unreachable!("never stopped"),
    };
    let generation = ran.into_generation(prompt.len(), reused.min(prompt.len() - 1), start, false);
    Ok((generation, retired.and_then(|r| r.cache)))
}

impl Ran {
    /// The generation this run makes: `cached` prompt tokens came from the cache; timed from
    /// `start` (the call) to now.
    fn into_generation(self, prompt_tokens: usize, cached: usize, start: Instant, prefill_only: bool) -> Generation {
        let end = Instant::now();
        let first = self.first.unwrap_or(end);
        let (tokens, token_ends) = self.decoded.map_or((Vec::new(), Vec::new()), |d| (d.generated, d.token_ends));
        let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
        let timings = Timings {
            prompt_tokens,
            cached_tokens: cached,
            prefill_ms: ms(start, first),
            ttft_ms: ms(start, first),
            decode_tokens: tokens.len(),
            decode_ms: ms(first, end),
        };
        let finish = if prefill_only { FinishReason::Length } else { self.finish.unwrap_or(FinishReason::Stop) };
        Generation { text: self.text, tokens, token_ends, finish, timings }
    }
}

/// How a lone request ended.
enum Ended {
    /// `stop` said so between steps: the sequence's paged cache with its whole steps, and its
    /// tokens (only paged runs are stopped).
    Stopped(SeqKv, Vec<u32>),
    /// It ran to its end: what it streamed (or why it failed), and what it retired with.
    Ran(Result<Ran, EngineError>, Option<Retired>),
}

/// Runs `checkout` as the one request of an engine of its own on this thread (module doc),
/// asking `stop` before every step.
fn run_request(
    model: &Model,
    pool: &KvPool,
    config: &SchedulerConfig,
    checkout: Checkout,
    params: &SamplingParams,
    on_text: &mut dyn FnMut(&str) -> bool,
    stop: &mut dyn FnMut() -> bool,
) -> Ended {
    let job = Job::from_tokens(OwnerKey::from("lone"), checkout.tokens.clone(), params.clone());
    let retired = Arc::new(Mutex::new(None));
    let policy = Lone { start: Some(checkout), done: Arc::default(), retired: Arc::clone(&retired), prefill_step: config.prefill_chunk };
    let pending = Arc::new(AtomicUsize::new(1));
    let mut engine = Engine::new(model, pool.clone(), config.clone(), Box::new(policy), Arc::new(Metrics::default()), pending);
    engine.record_decoded = true;
    let (events, closed) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
    engine.waiting.push_back((job, Box::new(Collect { events: events.clone(), closed: closed.clone() }), Instant::now()));
    engine.admit();
    let mut ran = Ran { text: String::new(), finish: None, decoded: None, first: None };
    let mut failed = None;
    let mut drain = |ran: &mut Ran| {
        for e in std::mem::take(&mut *events.lock().unwrap_or_else(|e| e.into_inner())) {
            match e {
                Event::Text(t) => {
                    ran.text.push_str(&t);
                    if !closed.load(Relaxed) && !on_text(&t) {
                        closed.store(true, Relaxed);
                    }
                }
                Event::Finished { finish, .. } => ran.finish = Some(finish),
                Event::Failed(e) => failed = Some(e),
                Event::Started { .. } | Event::Logprob(_) => {}
            }
        }
    };
    loop {
        drain(&mut ran);
        engine.cancel_gone();
        drain(&mut ran);
        let Some(s) = engine.active.first() else { break };
        if ran.first.is_none() && !s.out.generated().is_empty() {
            ran.first = Some(Instant::now());
        }
        if stop() {
            let (kv, tokens) = take_back(&mut engine, pool);
            return Ended::Stopped(kv, tokens);
        }
        engine.step();
        if ran.first.is_none() && engine.active.first().is_none_or(|s| !s.out.generated().is_empty()) {
            ran.first = Some(Instant::now());
        }
    }
    ran.decoded = engine.decoded.take();
    drop(engine);
    let retired = retired.lock().unwrap_or_else(|e| e.into_inner()).take();
    let ran = match failed {
        Some(e) if e.kind == JobErrorKind::BadRequest => Err(EngineError::BadRequest(e.message)),
        Some(e) => Err(EngineError::Failed(e.message)),
        None => Ok(ran),
    };
    Ended::Ran(ran, retired)
}

/// Takes the running sequence's paged cache back from `engine` (stopped between steps): it
/// holds exactly the tokens of the steps that ran.
fn take_back(engine: &mut Engine<'_>, pool: &KvPool) -> (SeqKv, Vec<u32>) {
    let s = engine.active.remove(0);
    let n = s.tokens.len();
    let (kv, _) = s.kv.into_retired(pool, n);
    (kv, s.tokens)
}
