//! What one generation returns ([`Generation`]) and how long its parts took ([`Timings`]):
//! the result of a [`crate::LoneSequence`] run, and the timings of a [`crate::run_alone`] job.
//!
//! Invariant: `tokens` are the generated tokens in order (a stop token included), one
//! `token_ends` entry each; `text` is their text up to a stop string.

use crate::decoding::FinishReason;

/// Timings of one generation, in milliseconds.
#[derive(Clone, Debug, Default)]
pub struct Timings {
    pub prompt_tokens: usize,
    /// Prompt tokens served from the cache instead of computed.
    pub cached_tokens: usize,
    /// From the call to the end of the prefill: the step that computes the prompt's last chunk
    /// also samples the first token, so this is the time to the first sampled token.
    pub prefill_ms: f64,
    /// From the call to the first sampled token.
    pub ttft_ms: f64,
    pub decode_tokens: usize,
    /// From the first sampled token to the end (the steps that feed each later token).
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

/// The result of [`crate::LoneSequence::generate`].
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
