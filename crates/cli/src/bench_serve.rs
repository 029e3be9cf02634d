//! The figures `engram bench serve` reports for one concurrency level, computed from each
//! session's own timings ([`SessionTiming`]) so that they add up.
//!
//! * `aggregate_decode_tok_s`: every session's decode tokens (all but its first token, which
//!   prefill produced) over the time during which at least one session was decoding (the union
//!   of the sessions' `[first token, finished]` windows). Because every session's decode window
//!   lies inside that union, the figure can never exceed `sessions × fastest session's own
//!   rate` ([`ServeStats::adds_up`] checks it, and it is asserted before printing).
//! * `mean_session_decode_tok_s`: the mean of each session's decode tokens over its own window.
//! * `overall_tok_s`: all generated tokens over the wall time from submission to the last
//!   finish (prefill included).
//!
//! The former figure divided by the time after the *last* session's first token, which with
//! interleaved prefill comes late and gave more-than-linear "aggregates".

use std::time::Duration;

/// When one session's events arrived, measured from the common submission instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SessionTiming {
    /// Arrival of the first text event (the first generated token).
    pub first: Duration,
    /// Arrival of the `Finished` event.
    pub finished: Duration,
    /// Tokens the session generated (its `completion_tokens`).
    pub tokens: usize,
}

impl SessionTiming {
    /// Tokens produced by decode steps: all but the first, which the prefill step produced.
    pub fn decode_tokens(&self) -> usize {
        self.tokens.saturating_sub(1)
    }

    /// Length of the session's decode window, `finished − first` (zero if out of order).
    pub fn decode_time(&self) -> Duration {
        self.finished.saturating_sub(self.first)
    }

    /// The session's own decode rate (0 when it decoded nothing or took no time).
    pub fn decode_rate(&self) -> f64 {
        let s = self.decode_time().as_secs_f64();
        if self.decode_tokens() == 0 || s <= 0.0 {
            0.0
        } else {
            self.decode_tokens() as f64 / s
        }
    }
}

/// One concurrency level's figures; see the module doc for their definitions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServeStats {
    /// Number of sessions.
    pub sessions: usize,
    /// Σ decode tokens ÷ |∪ decode windows|.
    pub aggregate_decode_tok_s: f64,
    /// Mean of the sessions' own decode rates.
    pub mean_session_decode_tok_s: f64,
    /// Fastest session's own decode rate.
    pub best_session_decode_tok_s: f64,
    /// All generated tokens ÷ wall time.
    pub overall_tok_s: f64,
    /// Σ decode tokens.
    pub decode_tokens: usize,
    /// Σ generated tokens.
    pub tokens: usize,
    /// Seconds during which at least one session was decoding.
    pub decode_union_s: f64,
}

impl ServeStats {
    /// Computes the figures from the sessions' timings and the wall time of the level.
    pub fn new(sessions: &[SessionTiming], wall: Duration) -> ServeStats {
        let decode_tokens: usize = sessions.iter().map(SessionTiming::decode_tokens).sum();
        let tokens: usize = sessions.iter().map(|s| s.tokens).sum();
        let union = union_len(sessions.iter().filter(|s| s.decode_tokens() > 0).map(|s| (s.first, s.finished)));
        let u = union.as_secs_f64();
        let rates: Vec<f64> = sessions.iter().map(SessionTiming::decode_rate).collect();
        let w = wall.as_secs_f64();
        ServeStats {
            sessions: sessions.len(),
            aggregate_decode_tok_s: if u > 0.0 { decode_tokens as f64 / u } else { 0.0 },
            mean_session_decode_tok_s: if rates.is_empty() { 0.0 } else { rates.iter().sum::<f64>() / rates.len() as f64 },
            best_session_decode_tok_s: rates.iter().copied().fold(0.0, f64::max),
            overall_tok_s: if w > 0.0 { tokens as f64 / w } else { 0.0 },
            decode_tokens,
            tokens,
            decode_union_s: u,
        }
    }

    /// Whether the figures are mutually consistent: the aggregate is at most `sessions ×` the
    /// fastest session's own rate (up to float rounding). Holds by construction (each session's
    /// decode tokens = its rate × its window ≤ best rate × union); a `false` means a bug in the
    /// bookkeeping, not noise.
    pub fn adds_up(&self) -> bool {
        self.aggregate_decode_tok_s <= self.sessions as f64 * self.best_session_decode_tok_s * (1.0 + 1e-9) + 1e-9
    }

    /// Aggregate decode relative to `n` sessions each decoding at `single` tok/s (1.0 = linear
    /// scaling; above 1 only by noise between the two runs).
    pub fn scaling_vs(&self, single: f64) -> f64 {
        if single > 0.0 && self.sessions > 0 {
            self.aggregate_decode_tok_s / (self.sessions as f64 * single)
        } else {
            0.0
        }
    }
}

/// Total length of the union of `[start, end)` intervals (empty or reversed ones count 0).
pub fn union_len(iv: impl Iterator<Item = (Duration, Duration)>) -> Duration {
    let mut v: Vec<(Duration, Duration)> = iv.filter(|(a, b)| b > a).collect();
    v.sort();
    let mut total = Duration::ZERO;
    let mut cur: Option<(Duration, Duration)> = None;
    for (a, b) in v {
        cur = match cur {
            Some((ca, cb)) if a <= cb => Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                total += cb - ca;
                Some((a, b))
            }
            None => Some((a, b)),
        };
    }
    if let Some((ca, cb)) = cur {
        total += cb - ca;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    fn s(first: u64, finished: u64, tokens: usize) -> SessionTiming {
        SessionTiming { first: ms(first), finished: ms(finished), tokens }
    }

    #[test]
    fn union_merges_overlaps_and_skips_gaps() {
        let u = union_len([(ms(0), ms(10)), (ms(5), ms(20)), (ms(30), ms(40)), (ms(50), ms(50))].into_iter());
        assert_eq!(u, ms(30));
        assert_eq!(union_len(std::iter::empty()), Duration::ZERO);
    }

    #[test]
    fn one_session_aggregate_is_its_own_rate() {
        let st = ServeStats::new(&[s(100, 1100, 65)], ms(1100));
        assert!((st.aggregate_decode_tok_s - 64.0).abs() < 1e-9);
        assert!((st.best_session_decode_tok_s - 64.0).abs() < 1e-9);
        assert!((st.overall_tok_s - 65.0 / 1.1).abs() < 1e-9);
        assert!(st.adds_up());
    }

    /// The case that fooled the old figure: sessions' first tokens staggered by interleaved
    /// prefill, the last one arriving just before everyone finishes. The old formula gave
    /// 4·63 / 10 ms = 25 200 tok/s; the union of decode windows gives a bounded figure.
    #[test]
    fn staggered_first_tokens_do_not_inflate_the_aggregate() {
        let sessions = [s(100, 2000, 64), s(600, 2000, 64), s(1200, 2005, 64), s(1995, 2005, 64)];
        let st = ServeStats::new(&sessions, ms(2005));
        let old = (st.tokens - 4) as f64 / 0.010;
        assert!(old > 20_000.0);
        assert!((st.aggregate_decode_tok_s - 252.0 / 1.905).abs() < 1e-6);
        assert!(st.adds_up());
        assert!(st.aggregate_decode_tok_s <= 4.0 * st.best_session_decode_tok_s);
    }

    #[test]
    fn disjoint_sessions_do_not_add_their_rates() {
        // Two sessions one after the other, each at 100 tok/s: the aggregate is 100, not 200.
        let st = ServeStats::new(&[s(0, 1000, 101), s(1000, 2000, 101)], ms(2000));
        assert!((st.aggregate_decode_tok_s - 100.0).abs() < 1e-9);
        assert!((st.scaling_vs(100.0) - 0.5).abs() < 1e-9);
    }

    #[test]
    fn random_timings_always_add_up() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        for _ in 0..500 {
            let n = 1 + next(8) as usize;
            let v: Vec<SessionTiming> = (0..n)
                .map(|_| {
                    let a = next(5000);
                    s(a, a + next(5000), next(200) as usize)
                })
                .collect();
            let st = ServeStats::new(&v, ms(10_000));
            assert!(st.adds_up(), "{st:?}");
            assert!(st.decode_union_s <= 10.0);
        }
    }

    #[test]
    fn sessions_without_decode_tokens_are_harmless() {
        let st = ServeStats::new(&[s(10, 10, 1), s(0, 0, 0)], ms(20));
        assert_eq!(st.aggregate_decode_tok_s, 0.0);
        assert_eq!(st.decode_tokens, 0);
        assert!(st.adds_up());
        assert_eq!(ServeStats::new(&[], Duration::ZERO).overall_tok_s, 0.0);
    }
}
