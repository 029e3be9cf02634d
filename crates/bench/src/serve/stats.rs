//! The figures `engram bench serve` reports for one concurrency level, so that they add up.
//!
//! Text events are no clock for tokens: the detokenizer holds text back (partial UTF-8, stop
//! strings; a random-weight model's tokens often print nothing until the end), so the time of
//! the first text event can be the time of the last token. The former aggregate divided by the
//! time after the *last* session's first text event and printed more-than-linear figures
//! (1,502 tok/s for 4 sessions against 23 for one). The token clock is the engine's own: its
//! time-to-first-token and inter-token histograms ([`EngineClock`], deltas over the level).
//!
//! * `mean_session_decode_tok_s`: decode tokens ÷ the time sessions spent decoding (Σ of
//!   every session's gaps between consecutive tokens = Σ of their decode windows).
//! * `aggregate_decode_tok_s`: the sum over sessions of each one's decode tokens over its own
//!   decode time, taken token-weighted: `sessions × mean_session_decode_tok_s`. The sessions
//!   of a level run concurrently (the scheduler batches them all), so this is the decode
//!   throughput while they do.
//! * `overall_tok_s`: every generated token over the wall time from submission to the last
//!   finish (prefill included).
//!
//! [`ServeStats::adds_up`] checks the bookkeeping: the engine counted exactly the decode tokens
//! the sessions report (completion tokens − 1 each), and no more decode time than `sessions ×
//! wall`. `scaling_vs` compares with the one-session level (≤ 1 up to noise).

use std::time::Duration;

/// What one session reported: its `completion_tokens`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SessionTiming {
    /// Arrival of the `Finished` event, from the common submission instant.
    pub finished: Duration,
    /// Tokens the session generated.
    pub tokens: usize,
}

/// The engine's token clock over one level: deltas of its histograms.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineClock {
    /// Inter-token gaps observed (= decode tokens).
    pub decode_tokens: u64,
    /// Their sum in seconds (= Σ of the sessions' decode windows).
    pub decode_s: f64,
    /// First tokens observed.
    pub first_tokens: u64,
    /// Σ time to first token, seconds.
    pub ttft_s: f64,
}

impl EngineClock {
    /// Reads the running totals from the engine's Prometheus text (`Metrics::render`).
    pub fn read(prometheus: &str) -> EngineClock {
        let get = |name: &str| -> f64 {
            prometheus
                .lines()
                .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
                .unwrap_or(0.0)
        };
        EngineClock {
            decode_tokens: get("engram_inter_token_seconds_count") as u64,
            decode_s: get("engram_inter_token_seconds_sum"),
            first_tokens: get("engram_time_to_first_token_seconds_count") as u64,
            ttft_s: get("engram_time_to_first_token_seconds_sum"),
        }
    }

    /// `self − before` (the level's share of the running totals).
    pub fn since(&self, before: &EngineClock) -> EngineClock {
        EngineClock {
            decode_tokens: self.decode_tokens.saturating_sub(before.decode_tokens),
            decode_s: (self.decode_s - before.decode_s).max(0.0),
            first_tokens: self.first_tokens.saturating_sub(before.first_tokens),
            ttft_s: (self.ttft_s - before.ttft_s).max(0.0),
        }
    }
}

/// One concurrency level's figures; see the module doc for their definitions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServeStats {
    /// Number of sessions.
    pub sessions: usize,
    /// `sessions × mean_session_decode_tok_s`.
    pub aggregate_decode_tok_s: f64,
    /// Decode tokens ÷ Σ of the sessions' decode time.
    pub mean_session_decode_tok_s: f64,
    /// All generated tokens ÷ wall time.
    pub overall_tok_s: f64,
    /// Mean engine-side time to first token, milliseconds.
    pub mean_ttft_ms: f64,
    /// Σ (completion tokens − 1) as the sessions report them.
    pub decode_tokens: usize,
    /// Σ generated tokens.
    pub tokens: usize,
    /// The engine's clock over the level.
    pub clock: EngineClock,
    /// Wall time of the level, seconds.
    pub wall_s: f64,
}

impl ServeStats {
    /// Computes the figures from the sessions' reports, the engine's clock and the wall time.
    pub fn new(sessions: &[SessionTiming], clock: EngineClock, wall: Duration) -> ServeStats {
        let decode_tokens: usize = sessions.iter().map(|s| s.tokens.saturating_sub(1)).sum();
        let tokens: usize = sessions.iter().map(|s| s.tokens).sum();
        let mean = if clock.decode_s > 0.0 { clock.decode_tokens as f64 / clock.decode_s } else { 0.0 };
        let w = wall.as_secs_f64();
        ServeStats {
            sessions: sessions.len(),
            aggregate_decode_tok_s: sessions.len() as f64 * mean,
            mean_session_decode_tok_s: mean,
            overall_tok_s: if w > 0.0 { tokens as f64 / w } else { 0.0 },
            mean_ttft_ms: if clock.first_tokens > 0 { clock.ttft_s / clock.first_tokens as f64 * 1e3 } else { 0.0 },
            decode_tokens,
            tokens,
            clock,
            wall_s: w,
        }
    }

    /// Whether the figures are mutually consistent: the engine's decode-token count equals the
    /// sessions' (completion − 1) sum, it saw one first token per session that generated any,
    /// and the sessions' decode time fits in `sessions × wall` (plus 1 ms of clock skew). A
    /// `false` means the bookkeeping is wrong (e.g. another client shared the engine), not noise.
    pub fn adds_up(&self) -> bool {
        self.clock.decode_tokens as usize == self.decode_tokens
            && self.clock.first_tokens as usize <= self.sessions
            && self.clock.decode_s <= self.sessions as f64 * self.wall_s + 1e-3
    }

    /// Aggregate decode relative to this many sessions each decoding at `single` tok/s (1.0 =
    /// linear scaling; above 1 only by noise between the two levels).
    pub fn scaling_vs(&self, single: f64) -> f64 {
        if single > 0.0 && self.sessions > 0 {
            self.aggregate_decode_tok_s / (self.sessions as f64 * single)
        } else {
            0.0
        }
    }
}

/// The median of `v` (the mean of the middle two for an even count; 0 when empty).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(finished_ms: u64, tokens: usize) -> SessionTiming {
        SessionTiming { finished: Duration::from_millis(finished_ms), tokens }
    }

    const PROM: &str = "# HELP engram_inter_token_seconds x\nengram_inter_token_seconds_bucket{le=\"0.1\"} 3\n\
                        engram_inter_token_seconds_sum 2.5\nengram_inter_token_seconds_count 250\n\
                        engram_time_to_first_token_seconds_sum 0.4\nengram_time_to_first_token_seconds_count 4\n";

    #[test]
    fn the_engine_clock_is_read_from_its_metrics_and_differenced() {
        let c = EngineClock::read(PROM);
        assert_eq!(c, EngineClock { decode_tokens: 250, decode_s: 2.5, first_tokens: 4, ttft_s: 0.4 });
        let d = c.since(&EngineClock { decode_tokens: 2, decode_s: 0.5, first_tokens: 0, ttft_s: 0.0 });
        assert_eq!(d.decode_tokens, 248);
        assert!((d.decode_s - 2.0).abs() < 1e-12);
        assert_eq!(EngineClock::read(""), EngineClock::default());
    }

    #[test]
    fn one_session_aggregate_is_its_own_rate() {
        let clock = EngineClock { decode_tokens: 64, decode_s: 1.0, first_tokens: 1, ttft_s: 0.1 };
        let st = ServeStats::new(&[s(1100, 65)], clock, Duration::from_millis(1100));
        assert!((st.aggregate_decode_tok_s - 64.0).abs() < 1e-9);
        assert!((st.mean_ttft_ms - 100.0).abs() < 1e-9);
        assert!((st.overall_tok_s - 65.0 / 1.1).abs() < 1e-9);
        assert!(st.adds_up());
    }

    /// Four sessions whose text arrived only at the end (the case that fooled the old figure)
    /// are measured by the engine's clock: 4 × 63 tokens in 4 × 1.9 s of decode = 4 × 33.2.
    #[test]
    fn text_arrival_does_not_enter_the_aggregate() {
        let clock = EngineClock { decode_tokens: 252, decode_s: 7.6, first_tokens: 4, ttft_s: 0.4 };
        let st = ServeStats::new(&[s(2000, 64), s(2000, 64), s(2005, 64), s(2005, 64)], clock, Duration::from_millis(2005));
        assert!((st.mean_session_decode_tok_s - 252.0 / 7.6).abs() < 1e-9);
        assert!((st.aggregate_decode_tok_s - 4.0 * 252.0 / 7.6).abs() < 1e-9);
        assert!(st.adds_up());
        assert!((st.scaling_vs(40.0) - 252.0 / 7.6 / 40.0).abs() < 1e-9);
    }

    #[test]
    fn inconsistent_bookkeeping_is_caught() {
        let ok = EngineClock { decode_tokens: 126, decode_s: 2.0, first_tokens: 2, ttft_s: 0.2 };
        let sessions = [s(1000, 64), s(1000, 64)];
        assert!(ServeStats::new(&sessions, ok, Duration::from_secs(1)).adds_up());
        // Another client's tokens in the engine's counts.
        assert!(!ServeStats::new(&sessions, EngineClock { decode_tokens: 130, ..ok }, Duration::from_secs(1)).adds_up());
        // More decode time than the sessions could have spent.
        assert!(!ServeStats::new(&sessions, EngineClock { decode_s: 2.5, ..ok }, Duration::from_secs(1)).adds_up());
    }

    #[test]
    fn empty_levels_are_harmless() {
        let st = ServeStats::new(&[], EngineClock::default(), Duration::ZERO);
        assert_eq!((st.aggregate_decode_tok_s, st.overall_tok_s, st.mean_ttft_ms), (0.0, 0.0, 0.0));
        assert!(st.adds_up());
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
