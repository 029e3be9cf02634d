//! Turns run by the engine's scheduler in this process: each agent's cache is a named
//! session under its [`AgentKey`] (pinned and persisted when permanent and a cache
//! directory is given), and a round's turns are submitted together so they share steps.
//!
//! Invariant: the prompt text a turn submits is the model's chat template over the turn's
//! messages — the same text the server's `/v1/agents/{id}/generate` renders — so a scenario
//! gives the same transcript in process and against a server.

use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use engram_engine::{EngineHandle, Event, EventSink, Metrics, SamplingParams, SchedulerConfig};
use engram_kv::{EvictionPolicy, KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_stack::{DiskConfig, SessionsConfig, StackConfig};

use crate::backend::{AgentKey, Backend, Turn, TurnOutcome};
use crate::no_reuse::NoReuse;

/// The agents' session name inside their own cache key (the server's agents use the same).
const SESSION: &str = "main";

/// How the in-process engine is set up.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// How KV is stored (f16, q4, ...).
    pub kv_format: KvFormat,
    /// RAM for KV blocks.
    pub kv_budget_bytes: usize,
    /// Where agents' caches persist (needed for a warm restart); `None` keeps them in RAM.
    pub cache_dir: Option<PathBuf>,
    /// Most bytes the cache directory holds.
    pub disk_budget_bytes: u64,
    /// False: reuse nothing, compute every prompt whole (the re-prefilling baseline).
    pub reuse: bool,
    /// Tokens per prefill chunk.
    pub prefill_chunk: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            kv_format: KvFormat::F16,
            kv_budget_bytes: 1 << 30,
            cache_dir: None,
            disk_budget_bytes: 4 << 30,
            reuse: true,
            prefill_chunk: SchedulerConfig::default().prefill_chunk,
        }
    }
}

/// The engine thread and its command channel. See the module doc.
pub struct EngineBackend {
    model: Arc<Model>,
    options: EngineOptions,
    engine: Option<(EngineHandle, JoinHandle<()>)>,
}

struct ChannelSink(Sender<(Instant, Event)>);

impl EventSink for ChannelSink {
    fn send(&self, event: Event) -> bool {
        self.0.send((Instant::now(), event)).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

impl EngineBackend {
    /// Starts an engine thread on `model`.
    pub fn start(model: Arc<Model>, options: EngineOptions) -> EngineBackend {
        let mut b = EngineBackend { model, options, engine: None };
        b.spawn();
        b
    }

    fn spawn(&mut self) {
        let o = self.options.clone();
        let pool = KvPool::new(KvLayout::of(&self.model.config), o.kv_format, o.kv_budget_bytes);
        let config = SchedulerConfig { prefill_chunk: o.prefill_chunk, ..SchedulerConfig::default() };
        let sessions = SessionsConfig {
            disk: o.cache_dir.map(|dir| DiskConfig {
                dir,
                budget_bytes: o.disk_budget_bytes,
                policy: EvictionPolicy::Lru,
                tenant_share_bytes: None,
            }),
            ..SessionsConfig::default()
        };
        let stack = StackConfig { sessions, ..StackConfig::default() };
        let (reuse, model) = (o.reuse, self.model.clone());
        self.engine = Some(EngineHandle::start(self.model.clone(), pool, config, Arc::new(Metrics::default()), move |_, p| {
            let policy = engram_stack::build(&model, p, &stack).policy;
            if reuse {
                policy
            } else {
                Box::new(NoReuse(policy))
            }
        }));
    }

    fn stop(&mut self) {
        if let Some((engine, thread)) = self.engine.take() {
            drop(engine);
            // The engine ends once its jobs have; its session store then flushes to disk.
            let _ = thread.join();
        }
    }

    fn submit(&self, turn: &Turn, max_tokens: usize) -> Result<(String, Receiver<(Instant, Event)>, Instant), String> {
        let tok = &self.model.tokenizer;
        let template = tok.chat_template().ok_or("the model has no chat template")?;
        let text =
            template.render(&turn.chat(), true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or("")).map_err(|e| e.to_string())?;
        let prompt = tok.encode(&text, false).map_err(|e| e.to_string())?.ids;
        let params = SamplingParams { temperature: 0.0, max_tokens, ..SamplingParams::default() };
        let job = engram_engine::Job {
            owner: turn.agent.key.as_str().into(),
            session: Some(SESSION.into()),
            text: Some(text.clone()),
            add_special: false,
            prompt,
            params,
            pinned: turn.agent.permanent,
            long_context_after: None,
        };
        let (tx, rx) = mpsc::channel();
        let (engine, _) = self.engine.as_ref().ok_or("the engine is stopped")?;
        let at = Instant::now();
        engine.submit(job, Box::new(ChannelSink(tx))).map_err(|e| e.to_string())?;
        Ok((text, rx, at))
    }
}

/// Collects one turn's events into its outcome.
fn collect(prompt_text: String, rx: Receiver<(Instant, Event)>, submitted: Instant) -> Result<TurnOutcome, String> {
    let mut out = TurnOutcome {
        text: String::new(),
        prompt_text,
        prompt_tokens: 0,
        cached_tokens: 0,
        completion_tokens: 0,
        ttft: None,
        total: Default::default(),
    };
    for (at, event) in rx {
        match event {
            Event::Started { prompt_tokens, cached_tokens, .. } => {
                out.prompt_tokens = prompt_tokens;
                out.cached_tokens = cached_tokens;
            }
            Event::Text(t) => {
                out.ttft.get_or_insert(at - submitted);
                out.text.push_str(&t);
            }
            Event::Finished { completion_tokens, .. } => {
                out.completion_tokens = completion_tokens;
                out.ttft.get_or_insert(at - submitted);
                out.total = at - submitted;
                return Ok(out);
            }
            Event::Failed(e) => return Err(e.message),
            Event::Logprob(_) => {}
        }
    }
    Err("the engine dropped a turn without finishing it".into())
}

impl Backend for EngineBackend {
    fn register(&mut self, _agent: &AgentKey, _name: &str, _system: Option<&str>) -> Result<(), String> {
        // NOTE: nothing to create: a cache key becomes a session on its first turn.
        Ok(())
    }

    fn run_round(&mut self, turns: &[Turn], max_tokens: usize) -> Result<Vec<TurnOutcome>, String> {
        let submitted = turns.iter().map(|t| self.submit(t, max_tokens)).collect::<Result<Vec<_>, _>>()?;
        submitted.into_iter().map(|(text, rx, at)| collect(text, rx, at)).collect()
    }

    fn release(&mut self, agent: &AgentKey) -> Result<(), String> {
        let (engine, _) = self.engine.as_ref().ok_or("the engine is stopped")?;
        if !engine.is_alive() {
            return Err("the engine thread is gone".into());
        }
        engine.forget(agent.key.as_str().into());
        Ok(())
    }

    fn restart(&mut self) -> Result<(), String> {
        if self.options.cache_dir.is_none() {
            return Err("a restart needs a cache directory (the caches would be lost)".into());
        }
        self.stop();
        self.spawn();
        Ok(())
    }
}

impl Drop for EngineBackend {
    fn drop(&mut self) {
        self.stop();
    }
}
