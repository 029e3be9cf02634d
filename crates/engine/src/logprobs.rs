//! Log-probabilities of generated tokens (OpenAI's `logprobs` / `top_logprobs`).
//!
//! A token's log-probability is taken from the model's own distribution: the log-softmax of
//! the raw logits, before penalties, temperature and the top-k/top-p/min-p filters (as vLLM
//! reports by default), so it says how likely the model found the token whatever the
//! request's sampling did. Invariant: `logprob <= 0`, the alternatives are the `n` largest
//! logits in descending order (ties: lower id first), and the sampled token's entry is
//! computed the same way whether or not it is among them.

/// One generated token's log-probability and the most likely alternatives at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    /// The most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// Most alternatives a request may ask for (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// `token`'s log-probability under `logits` (raw, unmodified) and the `top` most likely tokens.
pub fn token_logprob(logits: &[f32], token: u32, top: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max as f64 + sum.ln();
    let lp = |l: f32| (l as f64 - lse) as f32;
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &l) in logits.iter().enumerate() {
            if best.len() == top && l <= best[top - 1].1 {
                continue;
            }
            let at = best.partition_point(|&(_, b)| b >= l);
            best.insert(at, (i as u32, l));
            best.truncate(top);
        }
    }
    TokenLogprob {
        token,
        logprob: logits.get(token as usize).map_or(f32::NEG_INFINITY, |&l| lp(l)),
        top: best.into_iter().map(|(t, l)| (t, lp(l))).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_softmax_and_the_largest_alternatives() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -1.0];
        let r = token_logprob(&logits, 2, 3);
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        assert!((r.logprob as f64 - (2.0 - z.ln())).abs() < 1e-6);
        assert_eq!(r.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 2], "descending, ties by id");
        let total: f64 = logits.iter().map(|&l| ((l as f64) - z.ln()).exp()).sum();
        assert!((total - 1.0).abs() < 1e-9);
        assert!(token_logprob(&logits, 0, 0).top.is_empty());
        assert!(r.top.iter().all(|t| t.1 <= 0.0));
    }
}
