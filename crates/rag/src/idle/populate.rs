//! The two ways a question populates the caches in idle time, each one unit of work over the
//! pipeline's stores (the same retrieval, prompt and tree as [`crate::Rag::query`]):
//!
//! ```text
//!  plan:     embed ─ retrieve top-k ─ prompt (system, chunks…, question) ─ tokens the tree holds
//!  prefill:  longest tree prefix ─ feed the rest of the chunk segments ─ every prefix into the tree
//!  answer:   longest tree prefix (if the tree is on) ─ generate ─ prefixes into the tree ─ QA insert
//! ```
//! Both hand their model work to a [`StepClock`] (alone on this thread, asked before every
//! model step, or the engine thread's background job) and return `None` when it says stop,
//! having stored nothing (the unfinished KV and answer are dropped whole).
//!
//! Invariant: what they store is what [`crate::Rag::query`] would store for the same question — the
//! tree's entries are forks of a sequence that computed exactly their tokens, and the QA answer
//! is the tokens a generation from a cold prefill gives (`tests/it/idle.rs`).

use engram_engine::SamplingParams;

use super::preempt::StepClock;
use crate::error::Result;
use crate::pipeline::{documents_of, Prompt};
use crate::run::Request;
use crate::stores::Stores;

/// A question's retrieval and prompt, and how much of it the tree holds.
pub struct Plan {
    pub query: String,
    pub vector: Vec<f32>,
    pub prompt: Prompt,
    /// Prompt tokens the chunk KV tree holds (its longest stored prefix).
    pub cached_tokens: usize,
}

impl Plan {
    /// Where the last chunk segment ends (the question follows).
    pub fn chunks_end(&self) -> usize {
        self.prompt.ends.last().copied().unwrap_or(0)
    }
}

/// What a unit computed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Work {
    pub prefill_tokens: usize,
    pub prefill_ms: f64,
    pub decode_tokens: usize,
    pub decode_ms: f64,
    /// The QA entry stored (answers only).
    pub qa_id: Option<u64>,
}

/// Embeds, retrieves and builds the prompt of `query`.
pub fn plan(rag: &Stores<'_>, query: &str) -> Result<Plan> {
    let vector = rag.bank.embed(query)?;
    let prompt = crate::front::retrieve_prompt(rag.model, rag.config, rag.bank, query, &vector)?;
    let cached_tokens = rag.tree.cached_tokens(&prompt.path);
    Ok(Plan { query: query.to_string(), vector, prompt, cached_tokens })
}

/// Prefills the plan's chunk segments the tree lacks and stores every prefix (prefill only, no
/// decode, nothing in the QA bank); `None` (nothing stored) when `clock` said stop.
pub fn prefill(rag: &mut Stores<'_>, plan: &Plan, clock: &mut StepClock<'_>) -> Result<Option<Work>> {
    let end = plan.chunks_end();
    if rag.tree.cached_tokens(&plan.prompt.path) >= end {
        return Ok(Some(Work::default()));
    }
    let (start, from) = tree_start(rag, plan);
    let req = Request {
        prompt: plan.prompt.tokens[..end].to_vec(),
        start,
        reused: from,
        params: SamplingParams { max_tokens: 0, ..SamplingParams::default() },
        repair: None,
    };
    let model = rag.model.clone();
    let Some(r) = clock.run(&model, rag.pool, req)? else { return Ok(None) };
    rag.tree.insert(&plan.prompt.path, &plan.prompt.ends, &r.tokens, &r.kv);
    let ms = r.timings.prefill_ms + r.timings.decode_ms;
    Ok(Some(Work { prefill_tokens: end - r.timings.cached_tokens, prefill_ms: ms, ..Work::default() }))
}

/// The tree's longest stored prefix of the plan's prompt: its KV and length (checked, not
/// assumed: its tokens are the prompt's first tokens).
fn tree_start(rag: &mut Stores<'_>, plan: &Plan) -> (Option<engram_kv::SeqKv>, usize) {
    let (fp, fmt) = (rag.model.fingerprint, rag.pool.format());
    let m = rag.tree.lookup(fp, fmt, &plan.prompt.path);
    match m.kv {
        Some(kv) if plan.prompt.tokens.starts_with(&m.tokens) => (Some(kv), m.tokens.len()),
        _ => (None, 0),
    }
}

/// Generates the plan's answer (from the tree's longest prefix if `use_kv`, whose prefixes it
/// then stores) and stores it in the QA bank (saved); `None` (nothing stored: no tree entry,
/// no QA entry) when `clock` said stop before the answer was whole.
pub fn answer(rag: &mut Stores<'_>, plan: Plan, use_kv: bool, clock: &mut StepClock<'_>) -> Result<Option<Work>> {
    let (start, reused) = if use_kv { tree_start(rag, &plan) } else { (None, 0) };
    let req = Request { prompt: plan.prompt.tokens.clone(), start, reused, params: rag.config.params.clone(), repair: None };
    let model = rag.model.clone();
    let Some(g) = clock.run(&model, rag.pool, req)? else { return Ok(None) };
    if use_kv {
        rag.tree.insert(&plan.prompt.path, &plan.prompt.ends, &g.tokens, &g.kv);
    }
    let docs = documents_of(rag.bank, &plan.prompt.chunks);
    let generation = rag.bank.generation();
    let id = rag.qa.insert(&plan.query, plan.vector, &g.text, g.generated, plan.prompt.chunks, docs, generation);
    rag.qa.save()?;
    let t = g.timings;
    Ok(Some(Work {
        prefill_tokens: t.prompt_tokens - t.cached_tokens,
        prefill_ms: t.prefill_ms,
        decode_tokens: t.decode_tokens,
        decode_ms: t.decode_ms,
        qa_id: Some(id),
    }))
}
