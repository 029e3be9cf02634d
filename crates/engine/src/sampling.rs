//! Token sampling: penalties, temperature, top-k, top-p, min-p, seeded draws.
//!
//! Order (as llama.cpp and transformers): penalties on raw logits, then
//! temperature, then top-k, top-p and min-p filters, then a draw. A
//! temperature of 0 is greedy (argmax after penalties; ties go to the lowest id),
//! and so is a temperature so small that logits / temperature overflows f32
//! (1e-45, say): the limit of the distribution is the argmax, while the
//! overflowed values would make `inf - inf` NaN probabilities.
//! Invariant: the same params, seed and logits give the same token.

use crate::error::EngineError;
use crate::rng::Rng;

/// How to pick tokens and when to stop.
#[derive(Clone, Debug)]
pub struct SamplingParams {
    /// 0 = greedy.
    pub temperature: f32,
    /// 0 = disabled.
    pub top_k: usize,
    /// 1.0 = disabled.
    pub top_p: f32,
    /// 0.0 = disabled.
    pub min_p: f32,
    /// transformers-style multiplicative penalty; 1.0 = disabled.
    pub repetition_penalty: f32,
    /// OpenAI-style, subtracted per occurrence.
    pub frequency_penalty: f32,
    /// OpenAI-style, subtracted once if present.
    pub presence_penalty: f32,
    pub seed: u64,
    pub max_tokens: usize,
    /// Generation ends before any of these strings; they are not emitted.
    pub stop: Vec<String>,
    /// Extra stop token ids (the model's EOS ids always stop unless `ignore_eos`).
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    /// Speculative decoding for this request: `None` as the engine is configured
    /// (`SchedulerConfig::speculation`), `Some(false)` never, `Some(true)` prompt lookup (the
    /// engine's limits, or the defaults). It never changes which tokens are picked
    /// (`speculate.rs`), only how many one step can produce; under a `grammar` too (each
    /// draft is checked by a masked draw).
    pub speculate: Option<bool>,
    /// Report each generated token's log-probability with this many alternatives
    /// (`logprobs.rs`; at most [`crate::logprobs::MAX_TOP_LOGPROBS`]); `None`: none.
    pub logprobs: Option<usize>,
    /// Constrained decoding (`grammar.rs`): every sampled token is one the grammar allows,
    /// and the sequence stops when the grammar is complete; a draft is accepted only where
    /// the masked draw picks it. `None`: unconstrained, at no cost.
    pub grammar: Option<std::sync::Arc<crate::grammar::Grammar>>,
    /// Whether the text shows special tokens (stop tokens aside): a chat format whose
    /// structure is special tokens (GPT-OSS's harmony) is parsed from it.
    pub show_special_tokens: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
            max_tokens: 128,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            speculate: None,
            logprobs: None,
            grammar: None,
            show_special_tokens: false,
        }
    }
}

impl SamplingParams {
    /// Rejects values no sampler can honour, with the field named.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |f: &str, why: &str| Err(EngineError::BadRequest(format!("{f}: {why}")));
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return bad("temperature", "must be a finite number >= 0");
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad("top_p", "must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min_p", "must be in [0, 1]");
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return bad("repetition_penalty", "must be > 0");
        }
        if !self.frequency_penalty.is_finite() || !self.presence_penalty.is_finite() {
            return bad("frequency_penalty/presence_penalty", "must be finite");
        }
        if self.logprobs.is_some_and(|n| n > crate::logprobs::MAX_TOP_LOGPROBS) {
            return bad("top_logprobs", "at most 20 alternatives per token");
        }
        if self.stop.iter().any(|s| s.is_empty()) {
            return bad("stop", "stop strings must not be empty");
        }
        Ok(())
    }
}

/// Picks tokens from logits according to [`SamplingParams`].
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    counts: std::collections::HashMap<u32, u32>,
}

impl Sampler {
    /// A sampler seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = Rng::new(params.seed);
        Sampler { params, rng, counts: Default::default() }
    }

    /// Records tokens that count for the penalties (the prompt, and each sampled token).
    pub fn observe(&mut self, tokens: &[u32]) {
        for &t in tokens {
            *self.counts.entry(t).or_insert(0) += 1;
        }
    }

    /// Picks the next token from `logits` (modified in place) and observes it.
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        let p = &self.params;
        if p.repetition_penalty != 1.0 || p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&t, &n) in &self.counts {
                if let Some(l) = logits.get_mut(t as usize) {
                    if p.repetition_penalty != 1.0 {
                        *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                    }
                    *l -= n as f32 * p.frequency_penalty + p.presence_penalty;
                }
            }
        }
        let tok = if p.temperature <= 0.0 { argmax(logits) } else { self.draw(logits) };
        self.observe(&[tok]);
        tok
    }

    fn draw(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let mut cand: Vec<(u32, f32)> =
            logits.iter().enumerate().filter(|(_, l)| l.is_finite()).map(|(i, &l)| (i as u32, l * inv_t)).collect();
        // NOTE: a finite logit scaled to ±inf (or 0 × inf = NaN) means the
        // temperature is below what f32 resolves here: take its limit, greedy.
        if cand.is_empty() || cand.iter().any(|c| !c.1.is_finite()) {
            return argmax(logits);
        }
        // Sort descending by logit, ties by id, so filtering is deterministic.
        cand.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            cand.truncate(p.top_k);
        }
        let mx = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|c| ((c.1 - mx) as f64).exp()).collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= sum);
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            for (i, &q) in probs.iter().enumerate() {
                acc += q;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
        }
        let total: f64 = probs[..keep].iter().sum();
        let mut r = self.rng.next_f64() * total;
        for i in 0..keep {
            r -= probs[i];
            if r < 0.0 {
                return cand[i].0;
            }
        }
        cand[keep - 1].0
    }
}

/// Index of the largest logit (lowest index on ties; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    let mut bv = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        if l > bv {
            bv = l;
            best = i;
        }
    }
    best as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax_and_penalties_apply() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0]), 1);
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..Default::default() });
        s.observe(&[1]);
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0]), 2, "3.0/2 < 2.0");
        let mut s = Sampler::new(SamplingParams { presence_penalty: 1.5, ..Default::default() });
        s.observe(&[1]);
        assert_eq!(s.sample(&mut [0.1, 3.0, 2.0]), 2);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_filters_hold() {
        let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let params = SamplingParams { temperature: 0.9, top_k: 10, top_p: 0.9, seed: 42, ..Default::default() };
        let run = |p: &SamplingParams| -> Vec<u32> {
            let mut s = Sampler::new(p.clone());
            (0..50).map(|_| s.sample(&mut logits.clone())).collect()
        };
        assert_eq!(run(&params), run(&params));
        let mut sorted: Vec<u32> = (0..100).collect();
        sorted.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        let top10: Vec<u32> = sorted[..10].to_vec();
        assert!(run(&params).iter().all(|t| top10.contains(t)));
        let other = SamplingParams { seed: 43, ..params.clone() };
        assert_ne!(run(&params), run(&other));
        // min_p = 1 keeps only the best token.
        let only = SamplingParams { temperature: 1.0, min_p: 1.0, seed: 1, ..Default::default() };
        assert!(run(&only).iter().all(|&t| t == sorted[0]));
    }

    /// A temperature of 1e-45 once made logits / temperature overflow to
    /// ±inf (and 0 × inf = NaN), so every probability was NaN and the draw
    /// fell through to the lowest-ranked token.
    #[test]
    fn a_tiny_temperature_is_greedy_not_nan() {
        let logits: Vec<f32> = vec![0.5, 3.0, -1.0, 0.0, 2.9, -7.0];
        for temperature in [1e-45, 1e-40, 1e-38, f32::MIN_POSITIVE] {
            for seed in 0..20 {
                let p = SamplingParams { temperature, top_k: 0, seed, ..Default::default() };
                let mut s = Sampler::new(p);
                assert_eq!(s.sample(&mut logits.clone()), 1, "temperature {temperature:e}, seed {seed}");
                // With the filters on, too.
                let p = SamplingParams { temperature, top_k: 3, top_p: 0.9, min_p: 0.1, seed, ..Default::default() };
                assert_eq!(Sampler::new(p).sample(&mut logits.clone()), 1, "filtered, temperature {temperature:e}");
            }
        }
    }

    #[test]
    fn bad_params_are_rejected_with_the_field_named() {
        let e = SamplingParams { top_p: 0.0, ..Default::default() }.validate().unwrap_err();
        assert!(e.to_string().contains("top_p"));
        let e = SamplingParams { temperature: -1.0, ..Default::default() }.validate().unwrap_err();
        assert!(e.to_string().contains("temperature"));
    }
}
