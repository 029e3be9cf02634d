//! # engram-server — the HTTP serving layer
//!
//! OpenAI-compatible (`/v1/chat/completions`, `/v1/completions`,
//! `/v1/models`, `/v1/embeddings`), Anthropic-compatible (`/v1/messages`,
//! `/v1/messages/count_tokens`), Ollama-compatible (`/api/chat`, `/api/generate`,
//! `/api/tags`, `/api/show`, `/api/ps`, `/api/embed`, `/api/version`; `ollama/`) and agent
//! (`/v1/agents`) endpoints, personal RAG (`/v1/rag/*`, `rag.rs`), plus `/health` and
//! Prometheus `/metrics`, over `engram-engine`'s continuous-batching scheduler running the
//! policy stack `engram_stack::build` makes (sessions by default: character-level EXACT /
//! EXTEND / DIVERGE matching and the shared prefix index); [`engine_handle`] is the tokio
//! handle to it.
//!
//! Main types: [`Server`] (engine thread + shared state; [`Server::router`]
//! builds the axum app, so tests bind port 0), [`ServerConfig`],
//! [`EngineHandle`] (submit a [`Job`], receive [`Event`]s), [`ApiError`].
//!
//! Architecture invariant: handlers never touch the model's forward pass,
//! KV blocks or sessions; they tokenize, validate and talk to the one engine
//! thread over channels. The engine thread never sees HTTP. NOTE: the one
//! exception is `/v1/embeddings` served by the LLM-pooled fallback
//! (`engram_engine::PooledEncoder`): it runs the immutable model's forward
//! pass on a blocking thread over its own scratch cache, never the engine's
//! sequences, blocks or pool.

/// The agent registry (`agents.json` in the session directory), public so the Python package
/// keeps the same agents in the same file.
pub mod agent_registry;
mod agents;
mod anthropic;
mod api;
mod catalog;
mod chat_job;
mod dual;
mod dual_sync;
mod embeddings;
pub mod error;
mod facts;
mod guard;
#[cfg(test)]
mod health_tests;
/// The metrics the engine and the handlers share (`engram_engine::metrics`).
pub use engram_engine::metrics;
pub mod engine_handle;
mod listen;
/// OpenAI's `logprobs` shapes, built from the engine's events (the Python package answers with them too).
pub mod logprobs;
mod long_context;
mod ollama;
mod openai;
mod quota;
/// Personal RAG's routes; its folder layout and answer shape are public for the Python package.
pub mod rag;
mod rag_metrics;
mod remote_metrics;
mod sse;
mod structured;
mod tools;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use engram_kv::KvPool;
use engram_model::Model;

/// Ids as every route checks them, and fresh response ids (the Python package names agents and
/// responses the same way).
pub use api::{check_id, new_id, now_s};
pub use engine_handle::{EngineHandle, Event, Job, SchedulerConfig};
pub use engram_context::{DiskConfig, SessionsConfig};
pub use engram_stack::{ContextMode, LongContextConfig, MaskedTurns};
use engram_stack::{RagLayer, StackConfig};
pub use error::ApiError;
/// How facts and their summary are introduced in their system messages (`facts.rs`).
pub use facts::{FACT_PREFIX, SUMMARY_PREFIX};
pub use listen::HttpLimits;
pub use metrics::Metrics;
pub use rag::RagServerConfig;

/// The largest request body any route reads (a bigger one is a 413).
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// How the server behaves.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The id `/v1/models` lists; requests must name it or an alias.
    pub model_id: String,
    /// `(api key, tenant)`. Empty: no authentication, one tenant `default`.
    pub api_keys: Vec<(String, String)>,
    /// The engine's limits: batch, prefill chunk, queue, admission wait, speculation.
    pub scheduler: SchedulerConfig,
    /// The session policy: idle sessions kept, the disk tier (which dual-stream files, agents'
    /// records and users' facts also live under), prefix sharing across tenants.
    pub sessions: SessionsConfig,
    /// The text encoder `/v1/embeddings` serves (a sentence encoder, or the LLM's pooled
    /// hidden states, `engram_engine::PooledEncoder`); `None`: that route answers 501.
    pub embedder: Option<Arc<dyn engram_embed::TextEncoder>>,
    /// How context is kept between chat requests.
    pub context: ContextMode,
    /// Connection cap and header/body deadlines.
    pub limits: HttpLimits,
    /// Personal RAG routes (`/v1/rag/*`, `rag.rs`) and their banks' folder; `None`: those
    /// routes answer 501.
    pub rag: Option<RagServerConfig>,
    /// With `--context dual`: the model that condenses a user's facts past the persistent
    /// cap (`None`: the served model).
    pub summarizer: Option<SummarizerModel>,
    /// With `--context dual` and relevance masks: where a turn masked out of attention keeps
    /// its KV (RAM, or a file under the disk tier read back when wanted).
    pub masked_turns: MaskedTurns,
    /// Conversations whose history and prompt pass a threshold served sparse (DynaKV) over KV
    /// offloaded to disk (`None`: every sequence holds exact KV).
    pub long_context: Option<LongContextConfig>,
}

/// A summarizer model (`--summarizer PATH`), any model Engram loads.
#[derive(Clone)]
pub struct SummarizerModel(pub Arc<Model>);

impl std::fmt::Debug for SummarizerModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SummarizerModel({} layers)", self.0.config.num_layers)
    }
}

impl ServerConfig {
    /// Defaults for `model_id`.
    pub fn new(model_id: impl Into<String>) -> ServerConfig {
        ServerConfig {
            model_id: model_id.into(),
            api_keys: Vec::new(),
            scheduler: SchedulerConfig::default(),
            sessions: SessionsConfig::default(),
            embedder: None,
            context: ContextMode::Sessions,
            limits: HttpLimits::default(),
            rag: None,
            summarizer: None,
            masked_turns: MaskedTurns::Ram,
            long_context: None,
        }
    }
}

/// State shared by handlers.
pub(crate) struct Shared {
    pub model: Arc<Model>,
    pub config: ServerConfig,
    pub engine: EngineHandle,
    pub metrics: Arc<Metrics>,
    pub agents: agent_registry::Agents,
    pub rag: Option<rag::RagState>,
    /// Users' facts (dual-stream contexts only).
    pub facts: Option<facts::Facts>,
    /// The vocabulary's grammar compiler for structured output (`structured.rs`), built
    /// on first use.
    pub grammars: std::sync::OnceLock<Result<Arc<engram_engine::GrammarCompiler>, String>>,
}

pub(crate) type AppState = Arc<Shared>;

/// A running engine plus what the router needs. Dropping every router and
/// the server stops the engine thread once in-flight requests are done.
pub struct Server {
    state: AppState,
    engine_thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Starts the engine thread for `model` with KV charged to `pool`.
    pub fn start(model: Arc<Model>, pool: KvPool, config: ServerConfig) -> Server {
        let metrics = Arc::new(Metrics::default());
        // The policy stack: sessions or dual-stream contexts, under RAG's chunk KV tree when
        // RAG is on (RAG jobs go to the tree; every other owner to the policy, unchanged).
        let rag = config.rag.clone().map(rag::RagState::new);
        let stack = engram_stack::build(
            &model,
            &pool,
            &StackConfig {
                context: config.context,
                // Admission sizes a sliding model's prompt by the steps the engine prefills in.
                sessions: SessionsConfig { prefill_step: config.scheduler.prefill_chunk, ..config.sessions.clone() },
                encoder: config.embedder.clone(),
                summarizer: config.summarizer.as_ref().map(|m| m.0.clone()),
                masked_turns: config.masked_turns,
                render_summary: Some(facts::summary_renderer(model.clone())),
                rag: rag.as_ref().map(|r| RagLayer {
                    registry: r.registry.clone(),
                    tree_cap_bytes: r.tree_cap_bytes(),
                    idle: r.idle.clone(),
                }),
                long_context: config.long_context.clone(),
            },
        );
        if let (Some(r), Some(counters)) = (&rag, stack.rag_tree) {
            *r.tree.lock().unwrap_or_else(|e| e.into_inner()) = Some(counters);
        }
        let policy = stack.policy;
        let (engine, thread) = EngineHandle::start_with(model.clone(), pool, config.scheduler.clone(), policy, metrics.clone());
        let mut agents = match &config.sessions.disk {
            Some(d) => agent_registry::Agents::open(&d.dir),
            None => agent_registry::Agents::in_memory(),
        };
        if let Some(r) = &config.sessions.remote {
            // An agent another replica deleted is forgotten here as a local delete forgets it.
            let e = engine.clone();
            agents = agents.with_remote(r.clone(), Box::new(move |tenant, id| e.forget(engram_engine::OwnerKey::agent(tenant, id))));
        }
        let facts = match config.context {
            ContextMode::Sessions => None,
            ContextMode::Dual { .. } => Some(facts::Facts::new(
                config.sessions.disk.as_ref().map(|d| d.dir.join("facts")).as_deref(),
                engram_dual::FactLimits::default(),
                config.sessions.remote.clone(),
            )),
        };
        let state = Arc::new(Shared { model, config, engine, metrics, agents, rag, facts, grammars: Default::default() });
        if state.rag.as_ref().is_some_and(|r| r.idle.is_some()) {
            // Tenants with idle work left from before a restart start it without a request.
            let s = state.clone();
            std::thread::spawn(move || rag::wake_tenants_on_disk(&s));
        }
        Server { state, engine_thread: Some(thread) }
    }

    /// A handle to submit jobs directly (benchmarks).
    pub fn engine(&self) -> EngineHandle {
        self.state.engine.clone()
    }

    /// The metrics.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.state.metrics.clone()
    }

    /// The axum app.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/health", get(health))
            .route("/metrics", get(render_metrics))
            .route("/v1/models", get(openai::models))
            .route("/v1/chat/completions", post(openai::chat))
            .route("/v1/completions", post(openai::completions))
            .route("/v1/messages", post(anthropic::messages))
            .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
            .route("/v1/embeddings", post(embeddings::create))
            .route("/api/chat", post(ollama::chat))
            .route("/api/generate", post(ollama::generate))
            .route("/api/tags", get(ollama::tags))
            .route("/api/show", post(ollama::show))
            .route("/api/ps", get(ollama::ps))
            .route("/api/embed", post(ollama::embed))
            .route("/api/embeddings", post(ollama::embeddings))
            .route("/api/version", get(ollama::version))
            .route("/api/{*rest}", axum::routing::any(ollama::not_found))
            .route("/v1/agents", post(agents::create).get(agents::list))
            .route("/v1/agents/{id}", get(agents::get).delete(agents::delete))
            .route("/v1/agents/{id}/generate", post(agents::generate))
            .route("/v1/rag/documents", post(rag::add_documents).get(rag::list_documents))
            .route("/v1/rag/documents/{id}", axum::routing::delete(rag::delete_document))
            .route("/v1/rag/query", post(rag::query))
            .route("/v1/rag/predictions", get(rag::list_predictions))
            .route("/v1/users/{id}/facts", post(facts::add).get(facts::list).delete(facts::delete_all))
            .route("/v1/users/{id}/facts/{fact_id}", axum::routing::delete(facts::delete_one))
            .fallback(not_found)
            .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
            // Outermost last: count, then the key (headers only), then the body.
            .layer(middleware::from_fn_with_state(self.state.clone(), guard::read_body))
            .layer(middleware::from_fn_with_state(self.state.clone(), guard::authenticate))
            .layer(middleware::from_fn_with_state(self.state.clone(), count_requests))
            .with_state(self.state.clone())
    }

    /// Serves on `listener` until `shutdown` resolves, then lets in-flight
    /// requests finish for at most `grace`; connections are capped and timed by
    /// `ServerConfig::limits` (`listen.rs`).
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
        grace: Duration,
    ) -> std::io::Result<()> {
        let app = self.router();
        let limits = self.state.config.limits;
        listen::serve_limited(listener, app, limits, shutdown, grace).await?;
        drop(self.state);
        // The engine exits once the last handle is gone; do not wait on stuck work.
        if let Some(t) = self.engine_thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        Ok(())
    }
}

/// 200 `{"status": "ok"}` while the engine thread runs; 503 `{"status": "engine_down"}` once
/// it has died (every generation request then gets 503 too).
async fn health(State(s): State<AppState>) -> Response {
    if !s.engine.is_alive() {
        let body = serde_json::json!({"status": "engine_down", "model": s.config.model_id, "error": "the engine thread has stopped"});
        return (axum::http::StatusCode::SERVICE_UNAVAILABLE, axum::Json(body)).into_response();
    }
    axum::Json(serde_json::json!({"status": "ok", "model": s.config.model_id})).into_response()
}

/// Prometheus text. With API keys set, any valid key is required: the gauges and
/// counters sum every tenant's activity.
async fn render_metrics(State(s): State<AppState>, headers: axum::http::HeaderMap) -> Result<Response, error::ApiError> {
    api::tenant(&s, &headers)?;
    let mut text = s.metrics.render();
    if let Some(r) = &s.rag {
        text.push_str(&r.render_metrics());
    }
    if let Some(r) = &s.config.sessions.remote {
        text.push_str(&remote_metrics::render(&r.stats()));
    }
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!("no route for {} {}", req.method(), req.uri().path()))
}

async fn count_requests(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string()).unwrap_or_else(|| "unmatched".into());
    let r = next.run(req).await;
    s.metrics.count_request(&route, r.status().as_u16());
    r
}
