//! What `engram bench fidelity` reports of an approximation against the exact path on the
//! same tokens: mean KL of the next-token distributions, top-1 agreement, perplexity of the
//! text under each, the worst relative logit error, and (where the approximation drops keys)
//! the share of the exact attention mass its kept keys hold.
//!
//! Invariant: [`Scores`] are sums, so scores of several windows add up ([`Scores::add`]) and
//! the means are taken once, at the end.

use serde_json::json;

/// Sums over scored positions of one approximation against the exact path.
#[derive(Clone, Debug, Default)]
pub struct Scores {
    /// Scored positions (next-token distributions compared).
    pub positions: usize,
    /// Positions where both paths' most likely token is the same.
    pub top1_agree: usize,
    /// Sum of `KL(exact || approx)` in nats.
    pub kl_sum: f64,
    /// Worst `max |exact - approx| / max |exact|` over positions.
    pub max_rel_err: f32,
    /// Positions whose true next token is known (all but each window's last).
    pub predicted: usize,
    /// Sum of the true next token's negative log-likelihood, exact and approximate.
    pub nll_exact: f64,
    pub nll_approx: f64,
    /// Sum and count of attention mass recalled (per query head, layer and scored token).
    pub mass: Option<(f64, usize)>,
}

impl Scores {
    /// Compares `[n × vocab]` logits; `next[i]` is the true token after position `i`, if known.
    pub fn compare(exact: &[f32], approx: &[f32], vocab: usize, next: &[Option<u32>]) -> Scores {
        assert_eq!(exact.len(), approx.len(), "exact and approximate logits differ in length");
        let mut s = Scores::default();
        for (i, (e, q)) in exact.chunks_exact(vocab).zip(approx.chunks_exact(vocab)).enumerate() {
            s.positions += 1;
            s.top1_agree += (engram_engine::argmax(e) == engram_engine::argmax(q)) as usize;
            let scale = e.iter().fold(0f32, |m, x| m.max(x.abs())).max(f32::MIN_POSITIVE);
            s.max_rel_err = s.max_rel_err.max(e.iter().zip(q).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale);
            let (le, lq) = (log_sum_exp(e), log_sum_exp(q));
            s.kl_sum += e.iter().zip(q).map(|(&a, &b)| (a as f64 - le).exp() * ((a as f64 - le) - (b as f64 - lq))).sum::<f64>();
            if let Some(Some(t)) = next.get(i) {
                s.predicted += 1;
                s.nll_exact += le - e[*t as usize] as f64;
                s.nll_approx += lq - q[*t as usize] as f64;
            }
        }
        s
    }

    /// Adds another window's sums.
    pub fn add(&mut self, o: &Scores) {
        self.positions += o.positions;
        self.top1_agree += o.top1_agree;
        self.kl_sum += o.kl_sum;
        self.max_rel_err = self.max_rel_err.max(o.max_rel_err);
        self.predicted += o.predicted;
        self.nll_exact += o.nll_exact;
        self.nll_approx += o.nll_approx;
        self.mass = match (self.mass, o.mass) {
            (Some((a, n)), Some((b, m))) => Some((a + b, n + m)),
            (a, b) => a.or(b),
        };
    }

    pub fn mean_kl(&self) -> f64 {
        self.kl_sum / self.positions.max(1) as f64
    }

    pub fn top1(&self) -> f64 {
        self.top1_agree as f64 / self.positions.max(1) as f64
    }

    pub fn ppl_exact(&self) -> f64 {
        (self.nll_exact / self.predicted.max(1) as f64).exp()
    }

    pub fn ppl_approx(&self) -> f64 {
        (self.nll_approx / self.predicted.max(1) as f64).exp()
    }

    /// Mean attention mass recalled, where measured.
    pub fn mass_recalled(&self) -> Option<f64> {
        self.mass.map(|(s, n)| s / n.max(1) as f64)
    }

    /// The JSON fields of these scores (`bench cache`'s quality row reads the same names).
    pub fn json(&self) -> serde_json::Value {
        json!({
            "positions": self.positions,
            "top1_agreement": (self.top1() * 1e4).round() / 1e4,
            "mean_kl_nats": self.mean_kl(),
            "max_rel_logit_err": self.max_rel_err,
            "ppl_exact": self.ppl_exact(),
            "ppl": self.ppl_approx(),
            "ppl_delta_pct": (self.ppl_approx() / self.ppl_exact() - 1.0) * 100.0,
            "attention_mass_recalled": self.mass_recalled(),
        })
    }
}

/// `ln Σ exp(x)`, in f64.
pub fn log_sum_exp(x: &[f32]) -> f64 {
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    m + x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identical_logits_score_zero_kl_and_full_agreement() {
        let e = [1.0, 2.0, 0.5, -1.0, 0.0, 3.0];
        let s = Scores::compare(&e, &e, 3, &[Some(1), None]);
        assert_eq!((s.positions, s.top1_agree, s.predicted), (2, 2, 1));
        assert!(s.mean_kl().abs() < 1e-12 && s.max_rel_err == 0.0);
        assert!((s.ppl_exact() - s.ppl_approx()).abs() < 1e-12);
    }

    #[test]
    fn kl_and_perplexity_follow_the_distributions() {
        // p = softmax([0, ln 3]) = (1/4, 3/4); q uniform: KL = 1/4 ln(1/2) + 3/4 ln(3/2).
        let (e, q) = ([0.0, 3f32.ln()], [0.0, 0.0]);
        let s = Scores::compare(&e, &q, 2, &[Some(1)]);
        let kl = 0.25 * 0.5f64.ln() + 0.75 * 1.5f64.ln();
        assert!((s.mean_kl() - kl).abs() < 1e-6, "{}", s.mean_kl());
        assert!((s.ppl_exact() - 4.0 / 3.0).abs() < 1e-5 && (s.ppl_approx() - 2.0).abs() < 1e-5);
        let mut t = s.clone();
        t.add(&s);
        assert_eq!(t.positions, 2);
        assert!((t.mean_kl() - kl).abs() < 1e-6);
    }
}
