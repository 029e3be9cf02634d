//! [`run_alone`]: one background job run through the engine's own step on the caller's thread,
//! for callers that own their caches and have no engine thread (a RAG pipeline in one process,
//! its idle units driven by hand). The job is started as the engine starts any background job,
//! stepped by [`Engine::step`] — the one decode loop — and asked `stop` before every step.
//!
//! ```text
//!  job (checkout + sampling) ─► Engine (no other sequence) ─► stop()? ─► step ─► … ─► done
//!                                                               └ yes ─► dropped whole (None)
//! ```
//!
//! Invariant: what it returns is what the same job computes as a background sequence of an
//! engine thread, batched or not (same start, same step, same sampling); a stopped run hands
//! back nothing and its KV goes back to the pool.

use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use engram_kv::KvPool;
use engram_model::Model;
use engram_policy::{
    AdmitRequest, BackgroundDone, BackgroundJob, Checkout, ContextPolicy, ControlError, ControlReply, IdleInterrupt, OwnerKey,
    PendingRestore, PolicyControl, PolicyStats, Readiness, Retired,
};

use super::{Engine, SchedulerConfig};
use crate::generation::Timings;
use crate::metrics::Metrics;
use crate::sampling::SamplingParams;

/// What [`run_alone`] computed: the job's end as a policy would hear it, and its timings.
pub struct AloneRun {
    pub done: BackgroundDone,
    /// Prompt tokens, those the checkout held, prefill and decode times (the first sampled
    /// token ends the prefill), generated tokens.
    pub timings: Timings,
}

/// The policy of a lone run (here, in `lone.rs` and in `stepped.rs`): it admits at most the
/// one checkout it was given and keeps nothing; it hands what the sequence ends with (retired
/// or done) to its caller.
pub(super) struct Lone {
    /// The one request's checkout (`None`: it admits no request).
    pub start: Option<Checkout>,
    pub done: Arc<Mutex<Option<BackgroundDone>>>,
    pub retired: Arc<Mutex<Option<Retired>>>,
    /// Most prompt tokens the engine writes a step (its prefill chunk): what a start cache
    /// that releases sliding layers holds at most while its prompt is written.
    pub prefill_step: usize,
}

impl ContextPolicy for Lone {
    fn prepare(&mut self, _req: &AdmitRequest<'_>) -> Readiness {
        Readiness::Now
    }
    fn admit(&mut self, _req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.start.take().ok_or_else(|| "a lone run admits one request only".into())
    }
    fn admission_bytes(&self, _owner: &OwnerKey, prompt_tokens: usize, _long_context_after: Option<usize>) -> Option<usize> {
        // An own cache charges its RAM itself as it grows (its reservations); paged KV needs
        // the prompt's blocks, or where the cache releases its sliding layers what it holds
        // once the prompt is written in the engine's steps (the window, not the history).
        let c = self.start.as_ref()?;
        if c.cache.is_some() {
            return Some(0);
        }
        let g = c.kv.sliding()?;
        let pool = c.kv.pool();
        let held = g.bytes_held(pool, prompt_tokens, self.prefill_step, c.kv.resume_points(), c.kv.keeps_spaced_windows());
        Some(held.min(pool.bytes_for(prompt_tokens)))
    }
    fn pin_owner(&mut self, _owner: &OwnerKey) {}
    fn make_room(&mut self, _bytes: usize) -> bool {
        false
    }
    fn verify_restore(&mut self, _restore: PendingRestore) -> bool {
        false
    }
    fn retire(&mut self, retired: Retired) {
        *self.retired.lock().unwrap_or_else(|e| e.into_inner()) = Some(retired);
    }
    fn forget_owner(&mut self, _owner: &OwnerKey) {}
    fn stats(&self) -> PolicyStats {
        PolicyStats::default()
    }
    fn control(&mut self, msg: PolicyControl) -> Result<ControlReply, ControlError> {
        Err(msg.refuse())
    }
    fn idle_slice(&mut self, _interrupt: &IdleInterrupt) -> bool {
        false
    }
    fn next_background(&mut self) -> Option<BackgroundJob> {
        None
    }
    fn background_done(&mut self, done: BackgroundDone) {
        *self.done.lock().unwrap_or_else(|e| e.into_inner()) = Some(done);
    }
}

/// An engine of its own over the lone policy with `job` started as its one sequence, `params`
/// its sampling (greedy with the job's `max_tokens` and `stop` when `None`); the slot hears
/// the job's end. What [`run_alone`], `SteppedJob` and a `LoneSequence` prefill step.
pub(super) fn lone_engine(
    model: &Model,
    pool: KvPool,
    config: SchedulerConfig,
    job: BackgroundJob,
    params: Option<SamplingParams>,
) -> (Engine<'_>, Arc<Mutex<Option<BackgroundDone>>>) {
    let done = Arc::new(Mutex::new(None));
    let policy = Lone { start: None, done: done.clone(), retired: Arc::default(), prefill_step: config.prefill_chunk };
    let mut engine = Engine::new(model, pool, config, Box::new(policy), Arc::new(Metrics::default()), Arc::new(AtomicUsize::new(0)));
    let params =
        params.unwrap_or_else(|| SamplingParams { max_tokens: job.max_tokens, stop: job.stop.clone(), ..SamplingParams::default() });
    // A job that cannot start has already ended (its error is in the slot).
    let _ = engine.start_background_with(job, params);
    (engine, done)
}

/// Runs `job` alone through the engine's step with `params` (greedy with the job's
/// `max_tokens` and `stop` when `None`), `config.prefill_chunk` prompt tokens a step, asking
/// `stop` before every step; `None` when it said stop (nothing is kept).
pub fn run_alone(
    model: &Model,
    pool: KvPool,
    config: SchedulerConfig,
    job: BackgroundJob,
    params: Option<SamplingParams>,
    stop: &mut dyn FnMut() -> bool,
) -> Option<AloneRun> {
    let prompt_tokens = job.start.tokens.len();
    let cached_tokens = job.start.reused.min(prompt_tokens.saturating_sub(1));
    let t0 = Instant::now();
    let (mut engine, done) = lone_engine(model, pool, config, job, params);
    let mut first: Option<Instant> = None;
    let mut generated = 0;
    while let Some(s) = engine.active.first() {
        generated = s.out.generated().len();
        if first.is_none() && s.next.is_some() {
            first = Some(Instant::now());
        }
        if stop() {
            return None;
        }
        engine.step();
    }
    let end = Instant::now();
    let first = first.unwrap_or(end);
    let done = done.lock().unwrap_or_else(|e| e.into_inner()).take()?;
    if let Ok(out) = &done.outcome {
        generated = out.generated.len();
    }
    let ms = |a: Instant, b: Instant| (b - a).as_secs_f64() * 1e3;
    let timings = Timings {
        prompt_tokens,
        cached_tokens,
        prefill_ms: ms(t0, first),
        ttft_ms: ms(t0, first),
        decode_tokens: generated,
        decode_ms: ms(first, end),
    };
    Some(AloneRun { done, timings })
}
