//! `engine.rag`: personal RAG (PerCache) in process, as `/v1/rag/*` serves it — the tenant's
//! knowledge bank and QA bank in the server's folder layout (`<data>/rag/tenants/<blake3>/`),
//! each generation an engine job whose prompt segments the policy stack's `TreePolicy` serves
//! from the chunk KV tree. Answers are `/v1/rag/query`'s objects.
//!
//! Invariant: as on the server, a document batch is validated whole before any is written, and
//! removing or changing a document makes the engine forget the tree's KV built on its chunks.
//! NOTE: idle-time population (predicted questions) runs only under `engram serve`.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use engram_engine::{Job, SamplingParams};
use engram_rag::{ChunkReuse, ForgetChunks, KnowledgeBank, Library, Plan, PromptSegments, QaBank, RagConfig, SegmentRegistry};
use engram_server::rag::{answer_json, api_error, kind_of, tenant_dir, RagServerConfig, TENANT_FILE};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use serde_json::json;

use crate::convert::{to_py, type_name};
use crate::core::{Core, TENANT};
use crate::errors::{from_api, value, EngramError};

/// The RAG side of an engine: where the banks live and the registry the policy reads.
pub struct RagHome {
    pub config: RagServerConfig,
    pub registry: SegmentRegistry,
    library: Mutex<Option<Library>>,
}

impl RagHome {
    /// Banks under `<data>/rag/tenants` (the server's `--data-dir` layout), opened on first use.
    pub fn new(data: &std::path::Path, registry: SegmentRegistry) -> RagHome {
        let config = RagServerConfig { idle: None, ..RagServerConfig::new(data.join("rag").join("tenants")) };
        RagHome { config, registry, library: Mutex::new(None) }
    }

    fn dir(&self) -> PathBuf {
        tenant_dir(&self.config, TENANT)
    }
}

/// Personal RAG over the engine's model: documents in, questions answered from them.
#[pyclass(frozen, module = "engram._engram")]
pub struct Rag {
    core: Arc<Core>,
}

impl Rag {
    pub fn new(core: Arc<Core>) -> Rag {
        Rag { core }
    }

    /// The tenant's library, opened (or created) on first use; needs the sentence encoder.
    fn library(&self) -> PyResult<MutexGuard<'_, Option<Library>>> {
        let home = &self.core.rag;
        let mut guard = home.library.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let encoder = self.core.encoder().map_err(|e| EngramError::new_err(format!("RAG needs a text encoder: {e}")))?;
            let dir = home.dir();
            std::fs::create_dir_all(&dir).map_err(|e| EngramError::new_err(format!("creating {}: {e}", dir.display())))?;
            // The folder's tenant, as the server names it (its idle work finds it after a restart).
            let _ = engram_kv::persist::atomic_write(&dir.join(TENANT_FILE), |w| std::io::Write::write_all(w, TENANT.as_bytes()));
            let bank = KnowledgeBank::open(&dir.join("bank"), encoder)
                .map_err(|e| EngramError::new_err(format!("opening the knowledge bank: {e}")))?;
            let qa = QaBank::open(&dir.join("qa.bank"), home.config.qa_cap_bytes)
                .map_err(|e| EngramError::new_err(format!("opening the QA bank: {e}")))?;
            let config = RagConfig { top_k: home.config.top_k, ..RagConfig::default() };
            *guard = Some(Library::new(self.core.model.clone(), bank, qa, config));
        }
        Ok(guard)
    }

    /// Tells the engine to drop the tree's KV built on `chunks` (changed or removed).
    fn forget(&self, chunks: Vec<String>) -> PyResult<()> {
        if chunks.is_empty() {
            return Ok(());
        }
        let dir = self.core.rag.dir();
        self.core.rag.registry.forget(ForgetChunks {
            tenant: TENANT.to_string(),
            chunks,
            tree_dir: Some(dir.join("kvtree")),
            chunk_dir: Some(dir.join("chunks")),
        });
        self.core.handle()?.wake();
        Ok(())
    }
}

#[pymethods]
impl Rag {
    /// Adds or replaces documents: a list of `{"id", "text", "type"?}` dicts (`type`: txt, md,
    /// eml or ics; default txt), validated whole before any is written. Returns one report per
    /// document (`chunks_added`, `chunks_removed`, `unchanged`).
    fn add(&self, py: Python<'_>, documents: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        let docs: Vec<Bound<'_, PyAny>> = if documents.is_instance_of::<PyDict>() {
            vec![documents.clone()]
        } else {
            documents.try_iter().map_err(|_| PyTypeError::new_err("documents must be a list of dicts"))?.collect::<PyResult<_>>()?
        };
        if docs.is_empty() || docs.len() > engram_server::rag::MAX_DOCUMENTS_PER_REQUEST {
            return Err(value(format!("send 1 to {} documents, got {}", engram_server::rag::MAX_DOCUMENTS_PER_REQUEST, docs.len())));
        }
        let mut checked: Vec<(String, engram_rag::DocKind, String)> = Vec::new();
        for (i, d) in docs.iter().enumerate() {
            let d = d.cast::<PyDict>().map_err(|_| PyTypeError::new_err(format!("documents[{i}] must be a dict, got {}", type_name(d))))?;
            let field = |k: &str| -> PyResult<Option<String>> {
                match d.get_item(k)? {
                    None => Ok(None),
                    Some(v) if v.is_none() => Ok(None),
                    Some(v) => v.extract().map(Some).map_err(|_| PyTypeError::new_err(format!("documents[{i}][{k:?}] must be a str"))),
                }
            };
            let id = field("id")?.ok_or_else(|| value(format!("documents[{i}] has no \"id\"")))?;
            let text = field("text")?.ok_or_else(|| value(format!("documents[{i}] has no \"text\"")))?;
            engram_server::check_id("id", &id).map_err(from_api)?;
            let kind = kind_of(field("type")?.as_deref()).map_err(from_api)?;
            if checked.iter().any(|c| c.0 == id) {
                return Err(value(format!("document {i}: id {id:?} appears twice in this request")));
            }
            engram_rag::parse::parse_bytes(&format!("document {id:?}"), &id, kind, false, text.as_bytes())
                .map_err(|e| from_api(api_error(e)))?;
            checked.push((id, kind, text));
        }
        let mut guard = self.library()?;
        let lib = guard.as_mut().expect("opened above");
        let (mut out, mut gone) = (Vec::new(), Vec::new());
        let work = py.detach(|| -> Result<(), engram_rag::RagError> {
            for (id, kind, text) in checked {
                let r = lib.ingest_text(&id, kind, &text)?;
                out.push(json!({"id": id, "object": "rag.document", "type": kind.name(), "unchanged": r.unchanged,
                                "chunks_added": r.chunks_added.len(), "chunks_removed": r.chunks_removed.len()}));
                gone.extend(r.chunks_removed.into_iter().map(|c| c.0));
            }
            Ok(())
        });
        drop(guard);
        work.map_err(|e| from_api(api_error(e)))?;
        self.forget(gone)?;
        to_py(py, &serde_json::Value::Array(out))
    }

    /// The documents: `{"id", "type", "words", "chunks"}` each.
    fn documents(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let guard = self.library()?;
        let lib = guard.as_ref().expect("opened above");
        let docs: Vec<serde_json::Value> = lib
            .bank
            .docs()
            .iter()
            .map(|(id, d)| json!({"id": id, "object": "rag.document", "type": d.kind.name(), "words": d.words, "chunks": d.chunks.len()}))
            .collect();
        to_py(py, &serde_json::Value::Array(docs))
    }

    /// Removes document `id`; returns how many chunks went with it.
    fn remove(&self, id: String) -> PyResult<usize> {
        engram_server::check_id("id", &id).map_err(from_api)?;
        let removed = {
            let mut guard = self.library()?;
            guard.as_mut().expect("opened above").remove(&id).map_err(|e| from_api(api_error(e)))?
        };
        let n = removed.len();
        self.forget(removed.into_iter().map(|c| c.0).collect())?;
        Ok(n)
    }

    /// Answers `query` from the documents (greedy): `/v1/rag/query`'s object — `answer`,
    /// `sources`, `cache_level` (`qa`: the QA bank's stored answer; `kv`: chunks' KV from the
    /// tree; `none`), `timings`, `usage`.
    #[pyo3(signature = (query, *, max_tokens=None, qa_threshold=None, use_qa=true))]
    fn query(
        &self,
        py: Python<'_>,
        query: String,
        max_tokens: Option<i64>,
        qa_threshold: Option<f32>,
        use_qa: bool,
    ) -> PyResult<Py<PyAny>> {
        let ctx = self.core.context_length();
        let max_tokens = match max_tokens {
            None => RagConfig::default().params.max_tokens,
            Some(n) if n >= 1 && (n as u64) < ctx as u64 => n as usize,
            Some(n) => return Err(value(format!("max_tokens must be in 1..{ctx}, got {n}"))),
        };
        let threshold = qa_threshold.unwrap_or(engram_rag::DEFAULT_THRESHOLD);
        let plan = {
            let mut guard = self.library()?;
            let lib = guard.as_mut().expect("opened above");
            py.detach(|| lib.plan(&query, threshold, max_tokens, use_qa)).map_err(|e| from_api(api_error(e)))?
        };
        let pending = match plan {
            Plan::Hit(a) => return to_py(py, &answer_json(&a, 0)),
            Plan::Generate(p) => p,
        };
        let n_prompt = pending.prompt.tokens.len();
        if n_prompt + max_tokens > ctx {
            return Err(value(format!(
                "the prompt is {n_prompt} tokens; with max_tokens {max_tokens} it passes this model's context of {ctx}"
            )));
        }
        let params = SamplingParams { temperature: 0.0, max_tokens, ..Default::default() };
        let dir = self.core.rag.dir();
        let owner = self.core.rag.registry.register(PromptSegments {
            tenant: TENANT.to_string(),
            path: pending.prompt.path.clone(),
            ends: pending.prompt.ends.clone(),
            tokens: pending.prompt.tokens.clone(),
            tree_dir: Some(dir.join("kvtree")),
            reuse: ChunkReuse::Prefix,
            chunk_dir: Some(dir.join("chunks")),
        });
        let job = Job::from_tokens(owner.clone(), pending.prompt.tokens.clone(), params);
        let submitted = self.core.submit(job).inspect_err(|_| self.core.rag.registry.cancel(&owner))?;
        let before_ms = pending.elapsed_ms();
        let done = submitted.collect(py)?;
        let ttft = before_ms + done.ttft_ms.unwrap_or(0.0);
        let answer = {
            let mut guard = self.library()?;
            let lib = guard.as_mut().expect("opened above");
            let (text, cached, completion) = (done.text, done.cached_tokens, done.completion_tokens);
            py.detach(|| lib.record(pending, text, ttft, cached, completion)).map_err(|e| from_api(api_error(e)))?
        };
        to_py(py, &answer_json(&answer, done.completion_tokens))
    }
}

/// Seed 003's synthetic personal corpus (`engram_rag::synth`, as `engram bench rag` uses it):
/// per user, the documents to ingest and the questions to ask, in timeline order.
#[pyfunction]
#[pyo3(signature = (*, seed=3, users=3, topics_per_user=5, updates_per_user=2))]
pub fn synth_corpus(py: Python<'_>, seed: u64, users: usize, topics_per_user: usize, updates_per_user: usize) -> PyResult<Py<PyAny>> {
    use engram_rag::synth::{generate, Step, SynthConfig};
    let out: Vec<serde_json::Value> = generate(&SynthConfig { seed, users, topics_per_user, updates_per_user })
        .into_iter()
        .map(|u| {
            let steps: Vec<serde_json::Value> = u
                .steps
                .into_iter()
                .map(|s| match s {
                    Step::Ingest(d) => json!({"ingest": {"id": d.id, "type": d.kind.name(), "text": d.text}}),
                    Step::Query { text, kind, topic } => json!({"query": text, "kind": kind, "topic": topic}),
                })
                .collect();
            json!({"user": u.name, "steps": steps})
        })
        .collect();
    to_py(py, &serde_json::Value::Array(out))
}
