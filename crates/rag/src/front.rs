//! The front half of a RAG query, written once for both halves' owners ([`crate::Rag`], which
//! generates on its own thread, and [`crate::Library`], whose caller submits to the engine):
//!
//! ```text
//!  check(question, threshold) ─ build_prompt(no chunks) fits? ─ t0 ─ embed ─ QA hit? ─yes─► Front::Hit(answer)
//!                                                                          └ no ─ retrieve top-k ─ build_prompt ─► Front::Miss
//! ```
//! Invariant: bad input (an empty question, a threshold outside (0, 1], a question that cannot
//! fit the context with room for `config.params.max_tokens`) is refused before the encoder runs
//! and stores nothing; the prompt is [`build_prompt`]'s over the retrieved chunks, in rank order.

use std::time::Instant;

use engram_model::Model;

use crate::bank::{ChunkId, KnowledgeBank};
use crate::error::{RagError, Result};
use crate::pipeline::{build_prompt, Answer, AnswerTimings, Prompt, RagConfig};
use crate::qa::QaBank;

/// How the front half consults the QA bank.
pub(crate) struct QaLookup<'a> {
    /// Whether to look at all.
    pub use_qa: bool,
    /// The least similarity of a hit, in (0, 1].
    pub threshold: f32,
    /// The name the threshold has where the caller took it from (for the error).
    pub field: &'a str,
}

/// What the front half found.
pub(crate) enum Front {
    /// A stored answer (its timings filled up to the lookup).
    Hit { answer: Answer, qv: Vec<f32> },
    /// A prompt to generate; `timings` holds the embedding and retrieval times.
    Miss { prompt: Prompt, qv: Vec<f32>, timings: AnswerTimings },
}

/// The front half of `question` (module doc) with `config`'s top-k, system prompt and
/// `params.max_tokens`; returns it and when the query started (after the input checks).
pub(crate) fn front_half(
    model: &Model,
    config: &RagConfig,
    bank: &KnowledgeBank,
    qa: &mut QaBank,
    question: &str,
    lookup: &QaLookup<'_>,
) -> Result<(Front, Instant)> {
    if question.trim().is_empty() {
        return Err(RagError::bad_input("query", "empty"));
    }
    if !(lookup.threshold > 0.0 && lookup.threshold <= 1.0) {
        return Err(RagError::bad_input(lookup.field, format!("{} is not in (0, 1]", lookup.threshold)));
    }
    // A question over the context is refused before the encoder runs on it.
    build_prompt(model, config, bank, question, &[])?;
    let t0 = Instant::now();
    let ms = |t: Instant| t.elapsed().as_secs_f64() * 1e3;
    let qv = bank.embed(question)?;
    let mut timings = AnswerTimings { embed_ms: ms(t0), ..Default::default() };
    if lookup.use_qa {
        if let Some(hit) = qa.lookup(&qv, lookup.threshold) {
            timings.ttft_ms = ms(t0);
            timings.total_ms = timings.ttft_ms;
            return Ok((Front::Hit { answer: Answer::from_qa_hit(hit, timings), qv }, t0));
        }
    }
    let t1 = Instant::now();
    let prompt = retrieve_prompt(model, config, bank, question, &qv)?;
    timings.retrieve_ms = ms(t1);
    timings.prompt_tokens = prompt.tokens.len();
    Ok((Front::Miss { prompt, qv, timings }, t0))
}

/// The prompt of `question` (embedded as `qv`) over its `config.top_k` chunks from `bank`, in
/// rank order ([`build_prompt`]).
pub(crate) fn retrieve_prompt(model: &Model, config: &RagConfig, bank: &KnowledgeBank, question: &str, qv: &[f32]) -> Result<Prompt> {
    let retrieved = bank.search(question, qv, config.top_k)?;
    let ids: Vec<ChunkId> = retrieved.into_iter().map(|r| r.chunk).collect();
    build_prompt(model, config, bank, question, &ids)
}
