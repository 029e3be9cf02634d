//! The row-wise pieces of a BERT layer: linear layers (the kernels' matmul
//! plus a bias), LayerNorm, exact GELU, and attention of each sequence over
//! its own rows.
//!
//! Invariant: every function works row by row (or sequence by sequence for
//! attention) with the same operations in the same order whatever else is in
//! the batch, so a sentence's result never depends on its batch mates; the
//! kernels' matmul gives the same guarantee bitwise
//! (`engram_kernels::matmul`'s row-independence invariant).

use std::ops::Range;

use rayon::prelude::*;

use crate::weights::Tensor;

/// Rows per parallel task for the element-wise passes.
const ROWS_PER_TASK: usize = 16;

/// `y = x · Wᵀ + b`, a `torch.nn.Linear`.
pub(crate) struct Linear {
    pub weight: Tensor,
    pub bias: Vec<f32>,
}

impl Linear {
    /// Output features.
    pub fn rows(&self) -> usize {
        self.weight.rows
    }

    /// `out[t] = x[t] · Wᵀ + b` for `n` rows of `x`.
    pub fn forward(&self, x: &[f32], n: usize, out: &mut [f32]) {
        engram_kernels::matmul(&self.weight.matrix(), x, n, out);
        let b = &self.bias;
        par_rows(out, b.len(), |row| row.iter_mut().zip(b).for_each(|(o, b)| *o += b));
    }
}

/// Runs `f` on every `width`-long row of `x`, in parallel on the kernels' pool.
pub(crate) fn par_rows(x: &mut [f32], width: usize, f: impl Fn(&mut [f32]) + Sync) {
    engram_kernels::pool().install(|| x.par_chunks_mut(width * ROWS_PER_TASK).for_each(|c| c.chunks_exact_mut(width).for_each(&f)));
}

/// `torch.nn.LayerNorm` over rows of `w.len()`; statistics in f64.
pub(crate) struct LayerNorm {
    pub weight: Vec<f32>,
    pub bias: Vec<f32>,
    pub eps: f64,
}

impl LayerNorm {
    /// Normalizes every row of `x` in place.
    pub fn forward(&self, x: &mut [f32]) {
        par_rows(x, self.weight.len(), |row| self.row(row));
    }

    /// `x = LayerNorm(x + residual)`, row by row.
    pub fn forward_residual(&self, x: &mut [f32], residual: &[f32]) {
        let h = self.weight.len();
        engram_kernels::pool().install(|| {
            x.par_chunks_mut(h * ROWS_PER_TASK).zip(residual.par_chunks(h * ROWS_PER_TASK)).for_each(|(xc, rc)| {
                for (row, res) in xc.chunks_exact_mut(h).zip(rc.chunks_exact(h)) {
                    row.iter_mut().zip(res).for_each(|(x, r)| *x += r);
                    self.row(row);
                }
            })
        });
    }

    fn row(&self, row: &mut [f32]) {
        let n = row.len() as f64;
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        let inv = 1.0 / (var + self.eps).sqrt();
        for ((v, w), b) in row.iter_mut().zip(&self.weight).zip(&self.bias) {
            *v = ((*v as f64 - mean) * inv) as f32 * w + b;
        }
    }
}

/// BERT's exact GELU, `x/2 · (1 + erf(x/√2))`, in place.
pub(crate) fn gelu(x: &mut [f32], width: usize) {
    par_rows(x, width, |row| {
        for v in row {
            *v = 0.5 * *v * (1.0 + libm::erff(*v * std::f32::consts::FRAC_1_SQRT_2));
        }
    });
}

/// Multi-head self-attention of each sequence over its own rows only (so
/// padding never exists to be masked): `q`, `k`, `v` are `[rows, heads·dh]`,
/// `seqs` the row range of each sequence; `out` gets softmax(q·kᵀ/√dh)·v.
pub(crate) fn attention(q: &[f32], k: &[f32], v: &[f32], seqs: &[Range<usize>], heads: usize, dh: usize, out: &mut [f32]) {
    let width = heads * dh;
    let scale = 1.0 / (dh as f32).sqrt();
    let jobs: Vec<(usize, usize)> = (0..seqs.len()).flat_map(|s| (0..heads).map(move |h| (s, h))).collect();
    let blocks: Vec<Vec<f32>> = engram_kernels::pool().install(|| {
        jobs.par_iter()
            .map(|&(s, h)| {
                let r = seqs[s].clone();
                let gather = |m: &[f32]| -> Vec<f32> { r.clone().flat_map(|t| m[t * width + h * dh..][..dh].iter().copied()).collect() };
                let (kh, vh) = (gather(k), gather(v));
                let n = r.len();
                let mut o = vec![0.0f32; n * dh];
                let mut p = vec![0.0f32; n];
                for (i, t) in r.clone().enumerate() {
                    let qi = &q[t * width + h * dh..][..dh];
                    let mut max = f32::NEG_INFINITY;
                    for (j, pj) in p.iter_mut().enumerate() {
                        *pj = dot(qi, &kh[j * dh..][..dh]) * scale;
                        max = max.max(*pj);
                    }
                    let mut sum = 0.0f32;
                    for pj in p.iter_mut() {
                        *pj = (*pj - max).exp();
                        sum += *pj;
                    }
                    let oi = &mut o[i * dh..][..dh];
                    for (j, pj) in p.iter().enumerate() {
                        let w = pj / sum;
                        oi.iter_mut().zip(&vh[j * dh..][..dh]).for_each(|(o, v)| *o += w * v);
                    }
                }
                o
            })
            .collect()
    });
    for (&(s, h), o) in jobs.iter().zip(blocks) {
        for (i, t) in seqs[s].clone().enumerate() {
            out[t * width + h * dh..][..dh].copy_from_slice(&o[i * dh..][..dh]);
        }
    }
}

/// A dot product with 8 independent accumulators (vectorizes; fixed order).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = acc.iter().sum::<f32>();
    for (x, y) in ar.iter().zip(br) {
        s += x * y;
    }
    s
}
