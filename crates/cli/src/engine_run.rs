//! The engine `engram chat` and `engram generate` run on: an [`EngineHandle`] over the policy
//! stack `engram_stack::build` assembles (the session store or dual-stream contexts, with the
//! long-context layer on top when `--long-context-after` asks), as `engram serve` builds its
//! own. Every token of a chat or a generation is computed by the engine's step: there is no
//! other decode loop here.
//!
//! ```text
//!  chat turn / generate ─► Job (owner, session, rendered text, tokens) ─► EngineHandle
//!        ▲                                                                     │
//!        └──── Started (prompt, cached tokens) · Text … · Finished ◄───────────┘
//! ```
//! A chat thread is a named session of the chat's user, so a turn reuses the previous turn's
//! KV exactly (only the new message is prefilled), and a thread past the long-context
//! threshold goes sparse over KV offloaded to disk and keeps its sparse cache between turns.
//!
//! Invariant: a run's tokens stream to the caller's sink as they are decoded; its counts
//! (cached and prompt tokens, generated tokens, finish reason) are the engine's own report of
//! that job; a sink that refuses text cancels the job at the engine's next step.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{anyhow, Result};
use engram_engine::{EngineHandle, Event, EventSink, FinishReason, Job, Metrics, PolicyControl, SchedulerConfig};
use engram_kv::KvPool;
use engram_model::Model;
use engram_stack::{LongContextConfig, StackConfig};

/// Sends a run's events back to the caller's thread; closed once the caller's sink refused
/// text (the engine then cancels the job).
struct Back {
    tx: Sender<Event>,
    closed: Arc<AtomicBool>,
}

impl EventSink for Back {
    fn send(&self, event: Event) -> bool {
        !self.closed.load(Relaxed) && self.tx.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        self.closed.load(Relaxed)
    }
}

/// What a run printed and how it went.
pub struct RunReport {
    /// The text streamed (the whole answer unless cancelled).
    pub text: String,
    pub prompt_tokens: usize,
    /// Prompt tokens the engine took from the cache instead of computing them.
    pub cached_tokens: usize,
    pub generated: usize,
    /// From submission to the first streamed text.
    pub ttft_ms: f64,
    /// Tokens after the first over the time after the first text.
    pub decode_tok_s: f64,
    pub finish: FinishReason,
}

impl RunReport {
    /// Prompt tokens computed (not cached) per second of the time to the first text.
    pub fn prefill_tok_s(&self) -> f64 {
        (self.prompt_tokens - self.cached_tokens) as f64 / (self.ttft_ms / 1e3).max(1e-9)
    }
}

/// The engine the CLI's generations run on (module doc).
pub struct CliEngine {
    handle: Option<EngineHandle>,
    thread: Option<JoinHandle<()>>,
}

impl CliEngine {
    /// Starts the engine on `model` with the session store (RAM only) under the long-context
    /// layer `long`, if given.
    pub fn start(model: Arc<Model>, pool: KvPool, long: Option<LongContextConfig>) -> CliEngine {
        CliEngine::start_with(model, pool, StackConfig { long_context: long, ..StackConfig::default() })
    }

    /// Starts the engine on `model` with the stack `stack` describes (dual-stream contexts, the
    /// long-context layer, a disk tier), as `engram serve` builds its own.
    pub fn start_with(model: Arc<Model>, pool: KvPool, stack: StackConfig) -> CliEngine {
        let (handle, thread) =
            EngineHandle::start(model.clone(), pool, SchedulerConfig::default(), Arc::new(Metrics::default()), move |_m, p| {
                engram_stack::build(&model, p, &stack).policy
            });
        CliEngine { handle: Some(handle), thread: Some(thread) }
    }

    /// Sends a policy's own message (dual-stream's anchors and facts before a turn); it reaches
    /// the policy before any job submitted after it.
    pub fn control(&self, msg: PolicyControl) {
        self.handle.as_ref().expect("running until dropped").control(msg);
    }

    /// Runs `job` to its end, streaming its text through `out` (returning false cancels).
    pub fn run(&self, job: Job, out: &mut dyn FnMut(&str) -> bool) -> Result<RunReport> {
        let (tx, rx) = mpsc::channel();
        let closed = Arc::new(AtomicBool::new(false));
        let start = Instant::now();
        let handle = self.handle.as_ref().expect("running until dropped");
        handle.submit(job, Box::new(Back { tx, closed: closed.clone() })).map_err(|e| anyhow!("{e}"))?;
        let mut r = RunReport {
            text: String::new(),
            prompt_tokens: 0,
            cached_tokens: 0,
            generated: 0,
            ttft_ms: 0.0,
            decode_tok_s: 0.0,
            finish: FinishReason::Stop,
        };
        let mut first: Option<Instant> = None;
        let decode_tok_s = |first: Option<Instant>, generated: usize| {
            let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
            if secs > 0.0 {
                generated.saturating_sub(1) as f64 / secs
            } else {
                0.0
            }
        };
        for e in rx {
            match e {
                Event::Started { prompt_tokens, cached_tokens, .. } => (r.prompt_tokens, r.cached_tokens) = (prompt_tokens, cached_tokens),
                Event::Text(t) => {
                    if first.is_none() {
                        first = Some(Instant::now());
                        r.ttft_ms = start.elapsed().as_secs_f64() * 1e3;
                    }
                    // Text pieces, not tokens: only a cancelled run reports this count.
                    r.generated += 1;
                    r.text.push_str(&t);
                    if !out(&t) {
                        // The engine hears it at its next step and drops the job (no more events).
                        closed.store(true, Relaxed);
                        r.finish = FinishReason::Cancelled;
                        r.decode_tok_s = decode_tok_s(first, r.generated);
                        return Ok(r);
                    }
                }
                Event::Finished { finish, completion_tokens, .. } => {
                    (r.generated, r.finish) = (completion_tokens, finish);
                    if first.is_none() {
                        // No text at all (an immediate stop): the prefill took the whole run.
                        r.ttft_ms = start.elapsed().as_secs_f64() * 1e3;
                    }
                    r.decode_tok_s = decode_tok_s(first, completion_tokens);
                    return Ok(r);
                }
                Event::Failed(e) => return Err(anyhow!("{e}")),
                Event::Logprob(_) => {}
            }
        }
        Err(anyhow!("the engine stopped before the job ended"))
    }
}

impl Drop for CliEngine {
    fn drop(&mut self) {
        self.handle.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
