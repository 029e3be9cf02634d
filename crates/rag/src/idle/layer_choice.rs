//! The layer choice (PerCache §4.3): for a predicted question, populate the QA bank
//! (prefill + decode), only the chunk KV tree (prefill), or nothing — by expected benefit
//! against compute spent — and when to convert between the two layers.
//!
//! ```text
//!  answer:   benefit = p_qa·(P(rest) + D)  +  (1 − p_qa)·p_kv·P(chunks)     cost = P(rest) + D
//!  prefill:  benefit = p_kv·P(chunks)                                       cost = P(chunks)
//!  net = benefit − w·cost   (w: what a millisecond of idle compute is worth against one of the
//!                            user's; the larger net wins, skip if neither is > 0)
//!  threshold ≥ τ  → answering is off (a stricter QA threshold makes QA hits unlikely): prefill only
//!  QA → KV:  a predicted answer with no hit after `patience` real queries, or threshold ≥ τ
//!  KV → QA:  a prefilled prediction whose chunks a real query then used, threshold < τ
//! ```
//! `P(n)` is n tokens of prefill and `D` the answer's decode at the measured rates; `p_qa` is the
//! share of judged predictions a later real query matched at the QA threshold within
//! `patience` queries, `p_kv` the share whose first chunk a later real query's prompt started
//! with (both smoothed by a prior, [`HitStats`]). Invariant: [`decide`] is a pure function of its inputs (hand-made cases in
//! `tests/it/idle.rs`); with threshold ≥ τ it never answers.

// The layer choice's settings.
#[derive(Clone, Copy, Debug)]
pub struct LayerChoiceConfig {
    /// QA thresholds at or past this turn answering off (prefill only).
    pub tau: f32,
    /// Worth of an idle-time millisecond against a user-facing one (0: idle compute is free).
    pub idle_weight: f64,
    /// Real queries a predicted answer may go without a hit before it is converted to KV.
    pub patience: u64,
}

impl Default for LayerChoiceConfig {
    fn default() -> Self {
        LayerChoiceConfig { tau: 0.95, idle_weight: 0.2, patience: 10 }
    }
}

/// What populating one predicted question does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Prefill and decode: the answer into the QA bank (its prefix into the KV tree too).
    Answer,
    /// Prefill the chunks only: the chunk KV tree.
    Prefill,
    /// Nothing.
    Skip,
}

/// Hit probabilities and measured rates the decision uses.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Estimates {
    pub p_qa: f64,
    pub p_kv: f64,
    pub prefill_ms_per_token: f64,
    pub decode_ms_per_token: f64,
}

/// The work one predicted question would take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Prompt tokens the KV tree does not hold (chunks not stored, and the question).
    pub rest_tokens: usize,
    /// Chunk tokens the KV tree does not hold (what a prefill-only unit computes).
    pub rest_chunk_tokens: usize,
    /// Tokens an answer decodes.
    pub decode_tokens: usize,
}

/// A decision and its terms in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    pub strategy: Strategy,
    pub benefit_ms: f64,
    pub cost_ms: f64,
}

/// The strategy with the largest expected net benefit (see the module doc).
pub fn decide(cfg: &LayerChoiceConfig, est: &Estimates, c: &Candidate, threshold: f32) -> Decision {
    let prefill = |n: usize| n as f64 * est.prefill_ms_per_token;
    let d = c.decode_tokens as f64 * est.decode_ms_per_token;
    let answer = {
        let cost = prefill(c.rest_tokens) + d;
        let benefit = est.p_qa * cost + (1.0 - est.p_qa) * est.p_kv * prefill(c.rest_chunk_tokens);
        Decision { strategy: Strategy::Answer, benefit_ms: benefit, cost_ms: cost }
    };
    let pre = {
        let cost = prefill(c.rest_chunk_tokens);
        Decision { strategy: Strategy::Prefill, benefit_ms: est.p_kv * cost, cost_ms: cost }
    };
    let net = |x: &Decision| x.benefit_ms - cfg.idle_weight * x.cost_ms;
    let mut best = Decision { strategy: Strategy::Skip, benefit_ms: 0.0, cost_ms: 0.0 };
    let answering = threshold < cfg.tau;
    for x in [answer, pre] {
        if x.strategy == Strategy::Answer && !answering {
            continue;
        }
        if x.cost_ms > 0.0 && net(&x) > net(&best) {
            best = x;
        }
    }
    best
}

/// Whether a predicted answer should leave the QA bank for the KV tree: no hit after
/// `patience` real queries, or a threshold at or past τ.
pub fn qa_to_kv(cfg: &LayerChoiceConfig, hits: u64, real_queries_since: u64, threshold: f32) -> bool {
    hits == 0 && (real_queries_since >= cfg.patience || threshold >= cfg.tau)
}

/// Whether a prefilled prediction should be answered into the QA bank: a real query used its
/// chunks (`uses` ≥ 1) and answering is on.
pub fn kv_to_qa(cfg: &LayerChoiceConfig, uses: u64, threshold: f32) -> bool {
    uses >= 1 && threshold < cfg.tau
}

/// Counts behind `p_qa` and `p_kv`. A prediction is judged once: matched when a later real
/// query reaches it at the QA threshold (or starts from its first chunk), missed when
/// `patience` real queries passed since it was planned without that; until then it counts for
/// neither (so predictions made ahead of the queries do not read as failures).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct HitStats {
    /// Predictions planned (retrieved and embedded).
    pub issued: u64,
    pub qa_matched: u64,
    pub qa_missed: u64,
    pub kv_matched: u64,
    pub kv_missed: u64,
}

impl HitStats {
    /// Prior: one success in four (so an empty history gives 0.25).
    const PRIOR: (f64, f64) = (1.0, 3.0);

    fn share(hit: u64, miss: u64) -> f64 {
        (hit as f64 + Self::PRIOR.0) / ((hit + miss) as f64 + Self::PRIOR.0 + Self::PRIOR.1)
    }

    /// Smoothed share of judged predictions a later query matched at the QA threshold.
    pub fn p_qa(&self) -> f64 {
        Self::share(self.qa_matched, self.qa_missed)
    }

    /// Smoothed share of judged predictions whose first chunk a later query started with.
    pub fn p_kv(&self) -> f64 {
        Self::share(self.kv_matched, self.kv_missed)
    }
}

/// An exponential moving average of a rate, with a starting value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate {
    pub value: f64,
    samples: u64,
}

impl Rate {
    /// A rate that reads `initial` until measured.
    pub fn new(initial: f64) -> Rate {
        Rate { value: initial, samples: 0 }
    }

    /// Folds in `ms` over `n` units (ignored when `n` is 0); the first sample replaces the
    /// initial value.
    pub fn add(&mut self, ms: f64, n: usize) {
        if n == 0 {
            return;
        }
        let x = ms / n as f64;
        self.value = if self.samples == 0 { x } else { 0.8 * self.value + 0.2 * x };
        self.samples += 1;
    }
}
