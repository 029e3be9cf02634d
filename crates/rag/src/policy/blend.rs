//! Blend admission for [`super::TreePolicy`] (`engram serve --chunk-reuse blend`): a
//! RAG job registered with [`ChunkReuse::Blend`] starts from its tenant's [`ChunkStore`] — each
//! chunk's KV computed once after the system prompt, moved into place — repaired by
//! [`engram_engine::blend`], the same calls `Rag::query` makes in blend mode; the scheduler
//! then prefills the question and decodes.
//!
//! ```text
//!  admit(owner, Blend{ratio}) ─ ChunkStore::assemble(prompt) ─ blend(ratio) ─► Checkout { kv: sys+chunks, reused }
//!                             └ BlendOutcome ─► SegmentRegistry (the handler reports what was reused)
//!  retire(owner)              ─ nothing enters the exact chunk KV tree (its entries stay exact)
//! ```
//! Invariant: the checkout holds KV for exactly `prompt[..chunks_end]` at slots equal to
//! positions; with ratio 1 every moved token is recomputed, so the answer is the cold
//! prefill's, token for token (`crates/server/tests/it/rag_blend.rs`).

use std::path::PathBuf;

use engram_kv::{KvPool, SeqKv};
use engram_model::Model;

use super::PromptSegments;
use crate::chunk_store::{BlendFailure, ChunkStore};
use crate::pipeline::{BlendStats, Prompt};

/// What a blended admission reused and recomputed, for the handler's answer.
#[derive(Clone, Copy, Debug, Default)]
pub struct BlendOutcome {
    pub stats: BlendStats,
    /// Prompt tokens prefilled at admission (a system prompt or chunks not stored yet): the
    /// checkout's reused tokens minus these came from the store.
    pub tokens_computed: usize,
}

/// One tenant's chunk store, where it persists, and whether it changed since it was saved.
pub(super) struct Chunks {
    pub store: ChunkStore,
    pub dir: Option<PathBuf>,
    pub dirty: bool,
}

/// The KV of `seg`'s system prompt and chunks from `store` (computed and stored where missing),
/// blended with `ratio`; its length is where the last chunk ends.
pub(super) fn assemble(
    model: &Model,
    pool: &KvPool,
    store: &mut ChunkStore,
    seg: &PromptSegments,
    ratio: f32,
) -> Result<(SeqKv, usize, BlendOutcome), String> {
    if seg.path.is_empty() {
        return Err("a blended RAG job needs its system prompt segment".into());
    }
    let prompt = Prompt { path: seg.path.clone(), tokens: seg.tokens.clone(), ends: seg.ends.clone(), chunks: Vec::new() };
    let (a, stats) = store.assemble_blended(model, pool, &prompt, ratio).map_err(|f| match f {
        BlendFailure::Assemble(e) => format!("assembling the chunks' KV: {e}"),
        BlendFailure::Blend(e) => format!("blending the chunks' KV: {e}"),
    })?;
    let reused = a.tokens.len();
    Ok((a.kv, reused, BlendOutcome { stats, tokens_computed: a.tokens_computed.min(reused) }))
}
