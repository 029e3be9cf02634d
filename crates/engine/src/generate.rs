//! `Generator`: one sequence's generation loop over a model and a KV cache.
//!
//! ```text
//!  cache:   [ reused prefix | new prompt tokens (chunked prefill) | generated ... ]
//!  tokens:  what the cache holds, token for token (generated tokens are kept
//!           as generated, never re-tokenized from text)
//! ```
//! Invariant: `tokens()` always equals the tokens whose keys and values the
//! cache holds, in order; reuse only ever keeps a prefix of them.

use std::time::Instant;

use crate::decoding::Decoding;
use crate::error::EngineError;
use crate::sampling::SamplingParams;
use engram_kv::{KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};

/// Prompt tokens per forward call. Bounds peak activation memory (the FFN
/// buffers are `chunk * ffn * 4` bytes each) while keeping matmuls wide
/// enough to run at GEMM speed.
pub const DEFAULT_PREFILL_CHUNK: usize = 256;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
    /// The caller's callback asked to stop (client went away).
    Cancelled,
}

impl FinishReason {
    /// OpenAI's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Timings of one generation, in milliseconds.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    /// Prompt tokens served from the cache instead of computed.
    pub cached_tokens: usize,
    pub prefill_ms: f64,
    /// From the call to the first sampled token.
    pub ttft_ms: f64,
    pub decode_tokens: usize,
    pub decode_ms: f64,
}

impl Timings {
    /// Prefill throughput over computed tokens.
    pub fn prefill_tok_s(&self) -> f64 {
        (self.prompt_tokens - self.cached_tokens) as f64 / (self.prefill_ms / 1e3).max(1e-9)
    }
    /// Decode throughput (tokens after the first).
    pub fn decode_tok_s(&self) -> f64 {
        self.decode_tokens.saturating_sub(1) as f64 / (self.decode_ms / 1e3).max(1e-9)
    }
}

/// The result of [`Generator::generate`].
#[derive(Clone, Debug)]
pub struct Generation {
    pub text: String,
    pub tokens: Vec<u32>,
    /// Byte offset in `text`'s decoded stream where each token's text ends. A
    /// token that ends inside a UTF-8 character gets the end of the token
    /// completing it, so every end is a valid resume point (`<= text.len()`
    /// for tokens that are part of `text`; larger for tokens cut by a stop string).
    pub token_ends: Vec<usize>,
    pub finish: FinishReason,
    pub timings: Timings,
}

/// Records the text end of a token just decoded. A token that produced no
/// text yet (it ends inside a UTF-8 character) is pending (`usize::MAX`)
/// until a later token completes the text; `end` is where the decoded text
/// ends after this token, and it becomes the end of every pending token.
pub fn push_token_end(ends: &mut Vec<usize>, produced_text: bool, end: usize) {
    ends.push(usize::MAX);
    if produced_text {
        for e in ends.iter_mut().rev().take_while(|e| **e == usize::MAX) {
            *e = end;
        }
    }
}

/// A sequence: its cache and the tokens in it.
pub struct Generator<'m> {
    model: &'m Model,
    kv: SeqKv,
    tokens: Vec<u32>,
    prefill_chunk: usize,
}

impl<'m> Generator<'m> {
    /// An empty sequence whose cache is charged to `pool`.
    pub fn new(model: &'m Model, pool: &KvPool) -> Generator<'m> {
        Generator { model, kv: SeqKv::new(pool), tokens: Vec::new(), prefill_chunk: DEFAULT_PREFILL_CHUNK }
    }

    /// A sequence resuming from a cache that holds exactly `tokens` (from a
    /// session or a shared prefix).
    pub fn from_parts(model: &'m Model, kv: SeqKv, tokens: Vec<u32>) -> Generator<'m> {
        assert_eq!(kv.len(), tokens.len(), "a cache must hold exactly its tokens");
        Generator { model, kv, tokens, prefill_chunk: DEFAULT_PREFILL_CHUNK }
    }

    /// The cache and the tokens it holds.
    pub fn into_parts(self) -> (SeqKv, Vec<u32>) {
        (self.kv, self.tokens)
    }

    /// Sets the prefill chunk (tokens per forward call), at least 1.
    pub fn with_prefill_chunk(mut self, n: usize) -> Self {
        self.prefill_chunk = n.max(1);
        self
    }

    /// The tokens the cache holds.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The sequence's cache.
    pub fn kv(&self) -> &SeqKv {
        &self.kv
    }

    /// Drops cached tokens from `n` on.
    pub fn truncate(&mut self, n: usize) {
        self.kv.truncate(n);
        self.tokens.truncate(n);
    }

    /// Appends `tokens` to the cache in chunks; returns the logits of every
    /// token if `all`, else of the last one only.
    pub fn feed(&mut self, tokens: &[u32], all: bool) -> Result<Vec<f32>, EngineError> {
        Ok(self.feed_until(tokens, all, &mut || false)?.expect("never stopped"))
    }

    /// [`Generator::feed`] that asks `stop` before each forward call (each prefill chunk) and
    /// returns `None` when it says yes: the cache then holds the chunks fed before it (still
    /// exactly `tokens()`), and the chunk boundaries are the ones `feed` uses, so a run that
    /// is never stopped computes the same values.
    pub fn feed_until(&mut self, tokens: &[u32], all: bool, stop: &mut dyn FnMut() -> bool) -> Result<Option<Vec<f32>>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::BadRequest("nothing to feed".into()));
        }
        let limit = self.model.config.max_positions;
        if self.tokens.len() + tokens.len() > limit {
            return Err(EngineError::BadRequest(format!(
                "{} tokens exceed the model's context of {limit}",
                self.tokens.len() + tokens.len()
            )));
        }
        let mut out = Vec::new();
        for (i, chunk) in tokens.chunks(self.prefill_chunk).enumerate() {
            if stop() {
                return Ok(None);
            }
            let last = (i + 1) * self.prefill_chunk >= tokens.len();
            self.kv.reserve(chunk.len())?;
            let want = if all {
                Logits::All
            } else if last {
                Logits::Last
            } else {
                Logits::None
            };
            let mut step =
                [SeqStep { tokens: chunk, first_pos: self.tokens.len(), positions: None, key_mask: None, kv: &mut self.kv, logits: want }];
            let logits = self.model.forward(&mut step)?.pop().unwrap_or_default();
            self.tokens.extend_from_slice(chunk);
            out.extend(logits);
        }
        Ok(Some(out))
    }

    /// Generates a continuation of `prompt`, reusing the longest cached token
    /// prefix. `on_text` receives streamed text (never a split UTF-8
    /// character, never part of a stop string); returning `false` cancels.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str) -> bool,
    ) -> Result<Generation, EngineError> {
        Ok(self.generate_until(prompt, params, on_text, &mut || false)?.expect("never stopped"))
    }

    /// [`Generator::generate`] that asks `stop` before every forward call (each prefill chunk
    /// and each decode step) and returns `None` as soon as it says yes — preemptible idle work:
    /// the caller waits at most one model step. A stopped generation's cache holds whole steps
    /// only (`tokens()` stays exact); one never stopped computes exactly what `generate` does.
    pub fn generate_until(
        &mut self,
        prompt: &[u32],
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str) -> bool,
        stop: &mut dyn FnMut() -> bool,
    ) -> Result<Option<Generation>, EngineError> {
        params.validate()?;
        if prompt.is_empty() {
            return Err(EngineError::BadRequest("the prompt is empty".into()));
        }
        let start = Instant::now();
        // Reuse: keep the common prefix, but always recompute at least the last
        // prompt token, whose logits we need.
        let common = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        self.truncate(common);
        let mut timings = Timings { prompt_tokens: prompt.len(), cached_tokens: common, ..Default::default() };
        let Some(mut logits) = self.feed_until(&prompt[common..], false, stop)? else { return Ok(None) };
        timings.prefill_ms = start.elapsed().as_secs_f64() * 1e3;

        let mut out = Decoding::new(&self.model.tokenizer, prompt, params, 0);
        let mut text = String::new();
        let decode_start = Instant::now();
        let ctx = self.model.config.max_positions;
        let finish = loop {
            if params.max_tokens == 0 {
                break FinishReason::Length;
            }
            let t = out.sample(&mut logits);
            if out.generated().is_empty() {
                timings.ttft_ms = start.elapsed().as_secs_f64() * 1e3;
            }
            let step = out.accept(t, self.tokens.len() + 1 < ctx)?;
            text.push_str(&step.release);
            if !step.release.is_empty() && !on_text(&step.release) {
                break FinishReason::Cancelled;
            }
            if let Some(finish) = step.done {
                break finish;
            }
            if stop() {
                return Ok(None);
            }
            logits = self.feed(&[t], false)?;
        };
        let (tokens, token_ends) = (out.generated().to_vec(), out.finished_token_ends());
        timings.decode_tokens = tokens.len();
        timings.decode_ms = decode_start.elapsed().as_secs_f64() * 1e3;
        Ok(Some(Generation { text, tokens, token_ends, finish, timings }))
    }
}
