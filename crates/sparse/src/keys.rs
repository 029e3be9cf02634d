//! One (layer, KV head)'s stored keys as an index reads them: `len` rows of `dim` f16 values,
//! row `t` = the key of slot (= position) `t`, already rotated.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Read-only keys of one (layer, KV head). Invariant: `rows.len() == len * dim`.
#[derive(Clone, Copy)]
pub struct HeadKeys<'a> {
    rows: &'a [f16],
    dim: usize,
}

impl<'a> HeadKeys<'a> {
    /// Keys over `rows` (`rows.len()` a multiple of `dim`).
    pub fn new(rows: &'a [f16], dim: usize) -> HeadKeys<'a> {
        assert!(dim > 0 && rows.len() % dim == 0, "HeadKeys: rows must be whole keys of {dim}");
        HeadKeys { rows, dim }
    }

    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.rows.len() / self.dim
    }

    /// True when no token is stored.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Elements per key.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Decodes key `t` into `out` (`dim` floats).
    pub fn row(&self, t: usize, out: &mut [f32]) {
        self.rows[t * self.dim..(t + 1) * self.dim].convert_to_f32_slice(out);
    }

    /// Decodes keys `range` into `out` (`range.len() * dim` floats).
    pub fn rows(&self, range: std::ops::Range<usize>, out: &mut [f32]) {
        self.rows[range.start * self.dim..range.end * self.dim].convert_to_f32_slice(out);
    }
}

/// `a · b` in f32.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight lanes so the compiler vectorises without reassociation flags.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Squared distance `|a - b|²`.
#[inline]
pub fn dist2(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            let d = x[i] - y[i];
            acc[i] += d * d;
        }
    }
    let mut s: f32 = acc.iter().sum();
    for (x, y) in ra.iter().zip(rb) {
        s += (x - y) * (x - y);
    }
    s
}
