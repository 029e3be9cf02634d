//! The relevance measurement: how well cosine similarity of two vectors
//! tells a relevant (query, earlier turn) pair from an irrelevant one, on
//! the labelled set `tests/data/relevance.jsonl` (embedded as [`SET`]) or
//! another file of the same form. [`measure`] runs any [`TextEncoder`];
//! [`roc_auc`], [`at_threshold`] and [`best_f1`] are the metrics.
//!
//! Invariant: the metrics depend on the scores' order and the labels only;
//! a threshold calls a pair relevant when its score is `>=` it.

use crate::error::{EmbedError, Result};
use crate::text_encoder::TextEncoder;
use crate::vector::cosine;

/// The labelled set written for this repository (85 pairs, one JSON object a line:
/// `topic`, `query`, `passage`, `relevant`).
pub const SET: &str = include_str!("../tests/data/relevance.jsonl");

/// 100 words of ordinary prose: the unit the relevance masks and RAG rank, which speed is measured on.
pub const CHUNK_100_WORDS: &str = "The session store keeps every conversation's text together with the key and value cache \
that the model computed for it, so that when the user comes back with one more message only the new tokens \
have to be run through the network. When memory runs short the least recently used sessions are written to \
disk in the same byte layout they have in RAM, and a later request maps the file back instead of recomputing \
the prefix. Every file carries a checksum and the model's fingerprint, and nothing is shown to the user \
before the checksum has been fully verified.";

/// One labelled pair.
#[derive(Clone, Debug)]
pub struct Pair {
    pub topic: String,
    pub query: String,
    pub passage: String,
    pub relevant: bool,
}

/// Parses a set in [`SET`]'s format; `name` is what errors call it.
pub fn parse(name: &str, text: &str) -> Result<Vec<Pair>> {
    let bad = |line: usize, reason: String| EmbedError::Json { path: name.into(), reason: format!("line {line}: {reason}") };
    let mut pairs = Vec::new();
    for (i, l) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(l).map_err(|e| bad(i + 1, e.to_string()))?;
        let field = |k: &str| v[k].as_str().map(str::to_string).ok_or_else(|| bad(i + 1, format!("\"{k}\" must be a string")));
        let relevant = v["relevant"].as_bool().ok_or_else(|| bad(i + 1, "\"relevant\" must be a boolean".into()))?;
        pairs.push(Pair {
            topic: v["topic"].as_str().unwrap_or("").to_string(),
            query: field("query")?,
            passage: field("passage")?,
            relevant,
        });
    }
    if !pairs.iter().any(|p| p.relevant) || pairs.iter().all(|p| p.relevant) {
        return Err(bad(0, "a set needs both relevant and irrelevant pairs".into()));
    }
    Ok(pairs)
}

/// The cosine similarity of each pair's two vectors under `enc`.
pub fn scores(enc: &dyn TextEncoder, pairs: &[Pair]) -> Result<Vec<f32>> {
    let queries: Vec<String> = pairs.iter().map(|p| p.query.clone()).collect();
    let passages: Vec<String> = pairs.iter().map(|p| p.passage.clone()).collect();
    let q = enc.encode(&queries)?.vectors;
    let p = enc.encode(&passages)?.vectors;
    Ok(q.iter().zip(&p).map(|(a, b)| cosine(a, b)).collect())
}

/// The probability that a random relevant pair scores above a random
/// irrelevant one (ties count half): the Mann–Whitney form of ROC AUC.
pub fn roc_auc(scores: &[f32], labels: &[bool]) -> f64 {
    let (mut wins, mut pairs) = (0.0, 0.0);
    for (s, _) in scores.iter().zip(labels).filter(|(_, &l)| l) {
        for (n, _) in scores.iter().zip(labels).filter(|(_, &l)| !l) {
            pairs += 1.0;
            wins += if s > n {
                1.0
            } else if s == n {
                0.5
            } else {
                0.0
            };
        }
    }
    wins / pairs
}

/// Precision and recall when pairs scoring at least `threshold` are called relevant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AtThreshold {
    pub threshold: f32,
    /// Relevant among those kept (1 when none is kept).
    pub precision: f64,
    /// Kept among the relevant.
    pub recall: f64,
}

impl AtThreshold {
    pub fn f1(&self) -> f64 {
        if self.precision + self.recall == 0.0 {
            0.0
        } else {
            2.0 * self.precision * self.recall / (self.precision + self.recall)
        }
    }
}

/// Pairs scoring at least `t` are called relevant.
pub fn at_threshold(scores: &[f32], labels: &[bool], t: f32) -> AtThreshold {
    let kept = |want: bool| scores.iter().zip(labels).filter(|(&s, &l)| s >= t && l == want).count() as f64;
    let (tp, fp) = (kept(true), kept(false));
    let pos = labels.iter().filter(|&&l| l).count() as f64;
    AtThreshold { threshold: t, precision: if tp + fp > 0.0 { tp / (tp + fp) } else { 1.0 }, recall: tp / pos }
}

/// The threshold with the best F1 among the scores themselves (the highest such score on
/// ties). NOTE: chosen on the set it is then measured on, so it flatters the encoder.
pub fn best_f1(scores: &[f32], labels: &[bool]) -> AtThreshold {
    let mut best = at_threshold(scores, labels, f32::INFINITY);
    for &t in scores {
        let m = at_threshold(scores, labels, t);
        if m.f1() > best.f1() || (m.f1() == best.f1() && t > best.threshold) {
            best = m;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_embedded_set_parses() {
        let pairs = parse("relevance.jsonl", SET).unwrap();
        assert_eq!(pairs.len(), 85);
        assert_eq!(pairs.iter().filter(|p| p.relevant).count(), 43);
    }

    #[test]
    fn metrics_on_a_small_example() {
        let scores = [0.9, 0.8, 0.7, 0.6, 0.5];
        let labels = [true, false, true, false, false];
        // Relevant above irrelevant in 5 of the 6 (relevant, irrelevant) pairs.
        assert!((roc_auc(&scores, &labels) - 5.0 / 6.0).abs() < 1e-12);
        let m = at_threshold(&scores, &labels, 0.7);
        assert_eq!((m.precision, m.recall), (2.0 / 3.0, 1.0));
        let b = best_f1(&scores, &labels);
        assert_eq!(b.threshold, 0.7);
        assert!(parse("x", "{\"query\": \"a\", \"passage\": \"b\", \"relevant\": true}").is_err());
    }
}
