//! From token vectors to one sentence vector: pooling as
//! `1_Pooling/config.json` says, L2 normalization as a Normalize module
//! does, and the cosine similarity callers rank with.
//!
//! Invariant: every special token the tokenizer added counts as a token
//! (sentence-transformers' attention mask covers `[CLS]` and `[SEP]`), and a
//! normalized vector has norm 1 unless it was all zeros (divided by
//! `max(norm, 1e-12)` like `torch.nn.functional.normalize`).

use std::ops::Range;

use crate::config::PoolingMode;

/// Pools the rows `r` of `hidden` (`[rows, h]`) into one vector.
pub(crate) fn pool(hidden: &[f32], h: usize, r: Range<usize>, mode: PoolingMode) -> Vec<f32> {
    let rows = || hidden[r.start * h..r.end * h].chunks_exact(h);
    let n = r.len() as f64;
    match mode {
        PoolingMode::Cls => hidden[r.start * h..][..h].to_vec(),
        PoolingMode::Max => {
            let mut out = vec![f32::NEG_INFINITY; h];
            for row in rows() {
                out.iter_mut().zip(row).for_each(|(o, v)| *o = o.max(*v));
            }
            out
        }
        PoolingMode::Mean | PoolingMode::MeanSqrtLen => {
            let mut sum = vec![0.0f64; h];
            for row in rows() {
                sum.iter_mut().zip(row).for_each(|(s, v)| *s += *v as f64);
            }
            let div = if mode == PoolingMode::Mean { n } else { n.sqrt() };
            sum.iter().map(|s| (s / div) as f32).collect()
        }
    }
}

/// Scales `v` to unit L2 norm (an all-zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
}

/// Cosine similarity of two equally long vectors (0 if either is all zeros).
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "cosine of vectors of different lengths");
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        ab += x as f64 * y as f64;
        aa += x as f64 * x as f64;
        bb += y as f64 * y as f64;
    }
    if aa == 0.0 || bb == 0.0 {
        return 0.0;
    }
    (ab / (aa.sqrt() * bb.sqrt())) as f32
}

/// Consecutive batches of `seqs` (as index ranges, in order, covering all of them) of at most
/// `max_tokens` tokens each; a longer sequence makes a batch alone.
pub fn token_batches<T>(seqs: &[Vec<T>], max_tokens: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < seqs.len() {
        let (mut end, mut tokens) = (start, 0);
        while end < seqs.len() && (end == start || tokens + seqs[end].len() <= max_tokens) {
            tokens += seqs[end].len();
            end += 1;
        }
        out.push(start..end);
        start = end;
    }
    out
}
