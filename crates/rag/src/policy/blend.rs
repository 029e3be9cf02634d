//! Blend admission for [`super::TreePolicy`] (`engram serve --chunk-reuse blend`): a RAG job
//! registered with [`ChunkReuse::Blend`](crate::ChunkReuse) starts from its tenant's
//! [`ChunkStore`] — each chunk's KV computed once after the system prompt, moved into place —
//! and its checkout asks the engine to repair the moved chunks ([`Repair`]: the engine runs
//! [`engram_engine::blend`] as the sequence's first work in a step); the scheduler then
//! prefills the question and decodes. Pieces the store lacks were prefilled by the engine as
//! background jobs before admission (`chunk_jobs.rs`), so admission runs no model.
//!
//! ```text
//!  prepare(owner)  ─ store lacks pieces ─► BlockingOwner prefill jobs (chunk_jobs.rs) ─► AfterBackground … Now
//!  admit(owner, Blend{ratio}) ─ ChunkStore::assemble_stored(prompt) ─► Checkout { kv: sys+chunks, reused, repair: moved × ratio }
//!                             └ BlendOutcome (counts planned: BlendReport::planned) ─► SegmentRegistry (the handler reports it)
//!  engine step     ─ blend(kv, moved, ratio) ─ then the question's prefill, decode
//!  retire(owner)   ─ nothing enters the exact chunk KV tree (its entries stay exact)
//! ```
//! Invariant: the checkout holds KV for exactly `prompt[..chunks_end]` at slots equal to
//! positions; with ratio 1 every moved token is recomputed, so the answer is the cold
//! prefill's, token for token (`crates/server/tests/it/rag_blend.rs`).

use std::path::PathBuf;
use std::time::Instant;

use engram_engine::BlendReport;
use engram_kv::SeqKv;
use engram_model::Model;
use engram_policy::Repair;

use super::chunk_jobs::{prompt_of, Wait};
use super::PromptSegments;
use crate::chunk_store::ChunkStore;
use crate::pipeline::BlendStats;

/// What a blended admission reused and recomputed, for the handler's answer.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlendOutcome {
    pub stats: BlendStats,
    /// Prompt tokens the engine prefilled for this request before its admission (a system
    /// prompt or chunks not stored yet): the checkout's reused tokens minus these came from
    /// the store.
    pub tokens_computed: usize,
}

/// One tenant's chunk store, where it persists, and whether it changed since it was saved.
pub(super) struct Chunks {
    pub store: ChunkStore,
    pub dir: Option<PathBuf>,
    pub dirty: bool,
}

/// The KV of `seg`'s system prompt and chunks from `store` alone (`wait`: what the engine
/// prefilled for this request before, counted as computed), the repair the engine runs on its
/// moved chunks with `ratio`, and what it reused; its length is where the last chunk ends.
pub(super) fn assemble(
    model: &Model,
    store: &mut ChunkStore,
    seg: &PromptSegments,
    ratio: f32,
    wait: Option<Wait>,
) -> Result<(SeqKv, usize, Repair, BlendOutcome), String> {
    if seg.path.is_empty() {
        return Err("a blended RAG job needs its system prompt segment".into());
    }
    let wait = wait.unwrap_or_default();
    if let Some(e) = wait.failed {
        return Err(e);
    }
    let t = Instant::now();
    let a = store.assemble_stored(model, &prompt_of(seg)).map_err(|e| format!("assembling the chunks' KV: {e}"))?;
    let plan = BlendReport::planned(&a.moved, ratio, model.config.num_layers);
    let chunks = seg.path.len() - 1;
    let stats = BlendStats {
        ratio,
        chunks_reused: chunks.saturating_sub(wait.chunks_computed),
        chunks_computed: wait.chunks_computed,
        moved_tokens: plan.moved_tokens,
        recomputed_tokens: plan.recomputed_tokens,
        probed_tokens: plan.probed_tokens,
        assemble_ms: t.elapsed().as_secs_f64() * 1e3,
    };
    let reused = a.tokens.len();
    let outcome = BlendOutcome { stats, tokens_computed: wait.tokens_computed.min(reused) };
    Ok((a.kv, reused, Repair { moved: a.moved, ratio }, outcome))
}
