//! `engram chat --long-context-after`: the chat's turns run through the engine with the policy
//! stack (the session store under the long-context layer, `engram_stack::build`), so a thread
//! whose history passes the threshold goes sparse over KV offloaded to disk and keeps its
//! sparse cache between turns, as `engram serve` does. Each thread is a named session of the
//! chat's user.
//!
//! Invariant: a turn's tokens stream to stdout as they are decoded; its counts (cached and
//! prompt tokens, decode speed) are the engine's own report of that turn.

use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::{anyhow, Result};
use engram_engine::{EngineHandle, Event, EventSink, Job, Metrics, OwnerKey, SamplingParams, SchedulerConfig};
use engram_kv::KvPool;
use engram_model::Model;
use engram_stack::{LongContextConfig, StackConfig};

/// Sends a turn's events back to the chat loop.
struct Back(Sender<Event>);

impl EventSink for Back {
    fn send(&self, event: Event) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

/// What a turn printed and how it went.
pub struct TurnReport {
    pub text: String,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub generated: usize,
    pub ttft_ms: f64,
    pub decode_tok_s: f64,
}

/// The engine the chat's turns run on (module doc).
pub struct EngineChat {
    handle: Option<EngineHandle>,
    thread: Option<JoinHandle<()>>,
}

impl EngineChat {
    /// Starts the engine on `model` with the long-context layer `long` over the session store.
    pub fn start(model: Arc<Model>, pool: KvPool, long: LongContextConfig) -> EngineChat {
        let stack = StackConfig { long_context: Some(long), ..StackConfig::default() };
        let (handle, thread) = EngineHandle::start(
            model.clone(),
            pool,
            SchedulerConfig::default(),
            Arc::new(Metrics::default()),
            move |m: &Model, p: &KvPool| {
                let _ = m;
                engram_stack::build(&model, p, &stack).policy
            },
        );
        EngineChat { handle: Some(handle), thread: Some(thread) }
    }

    /// Runs one turn of thread `session` for `owner` (`text` rendered, `ids` its tokens),
    /// streaming the answer through `out`.
    pub fn turn(
        &self,
        owner: &OwnerKey,
        session: &str,
        text: &str,
        ids: Vec<u32>,
        params: &SamplingParams,
        out: &mut dyn FnMut(&str) -> bool,
    ) -> Result<TurnReport> {
        let (tx, rx) = mpsc::channel();
        let job = Job {
            session: Some(session.to_string()),
            text: Some(text.to_string()),
            ..Job::from_tokens(owner.clone(), ids, params.clone())
        };
        let start = Instant::now();
        self.handle.as_ref().expect("running").submit(job, Box::new(Back(tx))).map_err(|e| anyhow!("{e}"))?;
        let mut r = TurnReport { text: String::new(), prompt_tokens: 0, cached_tokens: 0, generated: 0, ttft_ms: 0.0, decode_tok_s: 0.0 };
        let mut first: Option<Instant> = None;
        for e in rx {
            match e {
                Event::Started { prompt_tokens, cached_tokens, .. } => (r.prompt_tokens, r.cached_tokens) = (prompt_tokens, cached_tokens),
                Event::Text(t) => {
                    if first.is_none() {
                        first = Some(Instant::now());
                        r.ttft_ms = start.elapsed().as_secs_f64() * 1e3;
                    }
                    out(&t);
                    r.text.push_str(&t);
                }
                Event::Finished { completion_tokens, .. } => {
                    r.generated = completion_tokens;
                    let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
                    r.decode_tok_s = if secs > 0.0 { completion_tokens.saturating_sub(1) as f64 / secs } else { 0.0 };
                    return Ok(r);
                }
                Event::Failed(e) => return Err(anyhow!("{e}")),
                Event::Logprob(_) => {}
            }
        }
        Err(anyhow!("the engine stopped before the turn ended"))
    }
}

impl Drop for EngineChat {
    fn drop(&mut self) {
        self.handle.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
