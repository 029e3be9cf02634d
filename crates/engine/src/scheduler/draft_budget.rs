//! How many drafts a speculating sequence's next tree may hold, from what this machine's steps
//! cost and what the sequence's drafts have earned.
//!
//! A step of `n` rows does not cost `n` times a step of one: how much more it costs depends on
//! the CPU (on Zen 4 a 9-row step costs about 2.3 one-row steps, on Zen 1 about 5.4). So the
//! engine times every forward step by its row count ([`StepCosts`]), and each sequence keeps
//! the rate at which its drafts are accepted ([`Acceptance`]). A tree of `k` drafts is expected
//! to yield `1 + p + p² + … + pᵏ` tokens (each draft on the walked path accepted with
//! probability `p`, given its parent was); the budget is the `k` that yields the most tokens
//! per second of step ([`StepCosts::best_drafts`]).
//!
//! Sizes never timed are tried: a step size above every fresh measurement is taken to cost
//! what the largest measured one does, and a measurement is forgotten after [`STALE_STEPS`]
//! steps, so a cost that changed (the context grew, the machine got busier) is measured again.
//!
//! Invariant: this decides only how many drafts are offered, never which tokens are kept:
//! verification keeps exactly the tokens decoding one by one would produce, whatever the
//! budget.

/// Largest step, in rows, whose cost is kept: drafts are weighed only against steps this size.
const MAX_ROWS: usize = 64;
/// Weight of a new timing in a row count's running mean.
const ALPHA: f64 = 0.25;
/// Steps after which a timing is forgotten (and what it timed is timed again).
const STALE_STEPS: u64 = 256;

/// A running mean of seconds and the step it was last updated at.
#[derive(Clone, Copy, Debug)]
struct Timing {
    mean: f64,
    at: u64,
}

impl Timing {
    /// `prev` with `secs` folded in at step `now`; a new mean if `prev` is absent or stale.
    fn update(prev: Option<Timing>, secs: f64, now: u64) -> Timing {
        let mean = match Timing::fresh(prev, now) {
            Some(m) => m + ALPHA * (secs - m),
            None => secs,
        };
        Timing { mean, at: now }
    }

    /// `t`'s mean if it was updated within the last [`STALE_STEPS`] steps before `now`.
    fn fresh(t: Option<Timing>, now: u64) -> Option<f64> {
        t.filter(|t| now - t.at < STALE_STEPS).map(|t| t.mean)
    }
}

/// Each row count's running mean of step seconds, and a draft model's per drafted token.
#[derive(Debug, Default)]
pub(super) struct StepCosts {
    secs: Vec<Option<Timing>>,
    steps: u64,
    /// A draft model's seconds per drafted token (its one-token steps).
    drafting: Option<Timing>,
}

impl StepCosts {
    /// Records that a forward step of `rows` rows took `secs` (steps above [`MAX_ROWS`] rows
    /// count as steps, their time is not kept).
    pub(super) fn observe(&mut self, rows: usize, secs: f64) {
        self.steps += 1;
        if rows == 0 || rows > MAX_ROWS || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        if self.secs.len() <= rows {
            self.secs.resize(rows + 1, None);
        }
        self.secs[rows] = Some(Timing::update(self.secs[rows], secs, self.steps));
    }

    /// Records a draft model's mean seconds per drafted token in one draft.
    pub(super) fn observe_drafting(&mut self, secs: f64) {
        if secs.is_finite() && secs >= 0.0 {
            self.drafting = Some(Timing::update(self.drafting, secs, self.steps));
        }
    }

    /// Seconds a draft model takes per drafted token, if timed within the last [`STALE_STEPS`]
    /// steps; `prior` otherwise.
    fn draft_secs(&self, prior: f64) -> f64 {
        Timing::fresh(self.drafting, self.steps).unwrap_or(prior)
    }

    /// The running mean for `rows`, if it was timed within the last [`STALE_STEPS`] steps.
    fn fresh(&self, rows: usize) -> Option<f64> {
        Timing::fresh(self.secs.get(rows).copied().flatten(), self.steps)
    }

    /// Estimated seconds of a step of `rows` rows: its fresh mean; between two fresh row
    /// counts, the line through them; above every fresh one, the largest's (so a larger tree is
    /// tried and timed); below every fresh one, or none fresh, `None`.
    pub(super) fn estimate(&self, rows: usize) -> Option<f64> {
        if let Some(m) = self.fresh(rows) {
            return Some(m);
        }
        let below = (1..rows.min(self.secs.len())).rev().find_map(|r| self.fresh(r).map(|m| (r, m)))?;
        let above = (rows + 1..self.secs.len()).find_map(|r| self.fresh(r).map(|m| (r, m)));
        Some(match above {
            Some((r1, m1)) => {
                let (r0, m0) = below;
                m0 + (m1 - m0) * (rows - r0) as f64 / (r1 - r0) as f64
            }
            None => below.1,
        })
    }

    /// The number of drafts, at most `cap`, that yields the most tokens per second for a
    /// sequence whose step already holds `rows` rows, its own next token among them, each
    /// row counted as one token, when each draft is accepted with probability `p`. Each draft
    /// also costs a draft model's step: as timed, or before that `draft_ratio` of a row of
    /// this step (the draft model's weight bytes over the target's; 0 for prompt lookup, which
    /// runs no model). Zero when a step of `rows` rows has no fresh timing (that step times
    /// it) or is above [`MAX_ROWS`].
    pub(super) fn best_drafts(&self, rows: usize, p: f64, cap: usize, draft_ratio: f64) -> usize {
        let Some(base) = self.estimate(rows).filter(|_| rows <= MAX_ROWS) else { return 0 };
        let per_draft = self.draft_secs(draft_ratio * base / rows as f64);
        let (mut best, mut best_rate) = (0, rows as f64 / base);
        let (mut tokens, mut term) = (rows as f64, 1.0);
        for k in 1..=cap.min(MAX_ROWS.saturating_sub(rows)) {
            term *= p;
            tokens += term;
            let Some(secs) = self.estimate(rows + k) else { break };
            let rate = tokens / (secs + k as f64 * per_draft);
            if rate > best_rate {
                (best, best_rate) = (k, rate);
            }
        }
        best
    }
}

/// A sequence's running count of accepted drafts against drafts its walks reached (each draft
/// accepted, and the first rejected one), older walks weighing less.
#[derive(Clone, Copy, Debug)]
pub(super) struct Acceptance {
    accepted: f64,
    reached: f64,
}

/// Weight a walk's counts keep at each newer walk.
const DECAY: f64 = 0.75;

impl Default for Acceptance {
    /// Before any walk: three drafts in four accepted, so the first trees are tried.
    fn default() -> Acceptance {
        Acceptance { accepted: 3.0, reached: 4.0 }
    }
}

impl Acceptance {
    /// Records a walk that accepted `accepted` drafts and then met a draft it rejected
    /// (`rejected`) or ran out of tree.
    pub(super) fn observe(&mut self, accepted: usize, rejected: bool) {
        self.accepted = DECAY * self.accepted + accepted as f64;
        self.reached = DECAY * self.reached + (accepted + rejected as usize) as f64;
    }

    /// The estimated chance that a draft is accepted, given its parent was.
    pub(super) fn rate(&self) -> f64 {
        if self.reached > 0.0 {
            self.accepted / self.reached
        } else {
            0.0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Step costs of `n` rows `a + b·(n-1)`, timed at the given row counts.
    fn costs(a: f64, b: f64, rows: &[usize]) -> StepCosts {
        let mut c = StepCosts::default();
        for &n in rows {
            c.observe(n, a + b * (n - 1) as f64);
        }
        c
    }

    #[test]
    fn cheap_extra_rows_take_every_draft_the_cap_allows() {
        // A 9-row step at 2.3 one-row steps (Zen 4's Q4_0): eight drafts pay at p = 0.95, four
        // at p = 0.8 (the fifth draft's expected 0.33 tokens cost more than the rate so far).
        let c = costs(1.0, 1.3 / 8.0, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(c.best_drafts(1, 0.95, 8, 0.0), 8);
        assert_eq!(c.best_drafts(1, 0.8, 8, 0.0), 4);
        // With no draft ever accepted none is worth a row.
        assert_eq!(c.best_drafts(1, 0.0, 8, 0.0), 0);
    }

    #[test]
    fn dear_extra_rows_take_few_drafts_or_none() {
        // Every extra row at 0.6 of the first (Zen 1): one draft pays at p = 0.8, not eight.
        let c = costs(1.0, 0.6, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(c.best_drafts(1, 0.8, 8, 0.0), 1);
        assert_eq!(c.best_drafts(1, 0.5, 8, 0.0), 0);
        // Rows that cost what the first does never pay: a draft yields less than a token.
        let linear = costs(1.0, 1.0, &[1, 2, 3, 4, 5]);
        assert_eq!(linear.best_drafts(1, 0.95, 4, 0.0), 0);
    }

    #[test]
    fn in_a_batch_drafts_are_weighed_against_the_step_they_join() {
        // Four decoders already in the step, rows cost 0.6 each from there: drafts do not pay
        // even at p = 0.8, though alone one would.
        let c = costs(1.0, 0.6, &(1..=12).collect::<Vec<_>>());
        assert_eq!(c.best_drafts(4, 0.8, 8, 0.0), 0);
        assert_eq!(c.best_drafts(1, 0.8, 8, 0.0), 1);
    }

    #[test]
    fn an_untimed_base_step_is_timed_first_and_larger_sizes_are_tried() {
        let mut c = StepCosts::default();
        assert_eq!(c.best_drafts(1, 0.9, 8, 0.0), 0, "no timing at all: decode plainly, which times it");
        c.observe(1, 1.0);
        // Nothing above one row timed: larger trees are assumed as cheap, so the cap is tried.
        assert_eq!(c.best_drafts(1, 0.9, 8, 0.0), 8);
        c.observe(9, 9.0);
        // Timed at last: linear between 1 and 9 rows, no draft pays.
        assert_eq!(c.estimate(5), Some(5.0));
        assert_eq!(c.best_drafts(1, 0.9, 8, 0.0), 0);
    }

    #[test]
    fn timings_go_stale_and_are_measured_again() {
        let mut c = StepCosts::default();
        c.observe(1, 1.0);
        c.observe(9, 9.0);
        for _ in 0..STALE_STEPS {
            c.observe(1, 1.0);
        }
        // The 9-row timing is older than STALE_STEPS steps: that size is tried again.
        assert_eq!(c.estimate(9), Some(1.0));
        assert_eq!(c.best_drafts(1, 0.9, 8, 0.0), 8);
        // A step above MAX_ROWS counts as a step; its time is not kept.
        c.observe(MAX_ROWS + 1, 1.0);
        assert_eq!(c.estimate(MAX_ROWS + 1), Some(1.0), "estimated from the largest fresh size");
        assert_eq!(c.best_drafts(MAX_ROWS + 1, 0.9, 8, 0.0), 0);
    }

    #[test]
    fn a_draft_model_as_dear_as_the_target_does_not_pay() {
        // Rows nearly free (a small model's step is mostly overhead): prompt lookup takes all
        // eight drafts at p = 0.9.
        let mut c = costs(1.0, 0.02, &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(c.best_drafts(1, 0.9, 8, 0.0), 8);
        // Before a draft model is timed its weight bytes stand for its cost: a draft model
        // of the target's size is not tried, one a twentieth of it is.
        assert_eq!(c.best_drafts(1, 0.9, 8, 1.0), 0);
        assert_eq!(c.best_drafts(1, 0.9, 8, 0.05), 8);
        // Timed at what the target's step costs: each draft costs a step and yields less
        // than a token.
        c.observe_drafting(1.0);
        assert_eq!(c.best_drafts(1, 0.9, 8, 0.05), 0);
        // Ten times cheaper pays, and deep.
        for _ in 0..40 {
            c.observe_drafting(0.1);
        }
        assert!(c.best_drafts(1, 0.9, 8, 0.05) >= 4);
        // Untimed for STALE_STEPS steps: the prior again.
        c.observe_drafting(1.0);
        for _ in 0..STALE_STEPS {
            c.observe(1, 1.0);
        }
        assert_eq!(c.draft_secs(0.05), 0.05);
    }

    #[test]
    fn a_running_mean_follows_new_timings() {
        let mut c = StepCosts::default();
        c.observe(2, 4.0);
        c.observe(2, 0.0); // not a timing
        c.observe(2, 2.0);
        assert_eq!(c.estimate(2), Some(4.0 + ALPHA * (2.0 - 4.0)));
        assert_eq!(c.estimate(1), None, "nothing timed below");
    }

    #[test]
    fn acceptance_follows_recent_walks() {
        let mut a = Acceptance::default();
        assert_eq!(a.rate(), 0.75);
        for _ in 0..20 {
            a.observe(0, true);
        }
        assert!(a.rate() < 0.01, "{}", a.rate());
        for _ in 0..20 {
            // Whole trees accepted: the walk ran out of drafts, nothing rejected.
            a.observe(6, false);
        }
        assert!(a.rate() > 0.99, "{}", a.rate());
        a.observe(3, true);
        assert!(a.rate() > 0.9 && a.rate() < 1.0, "{}", a.rate());
    }
}
