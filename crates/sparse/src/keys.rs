//! One (layer, KV head)'s stored keys as an index reads them: `len` rows of `dim` f16 values,
//! row `t` = the key of slot (= position) `t`, already rotated.

use half::f16;
use half::slice::HalfFloatSliceExt;

/// Keys held somewhere other than one RAM slice (an offloaded head: sinks and the recent
/// window in RAM, older keys in a file and the cluster cache). Invariant: `row(t)` yields the
/// same f16 bits that were written for position `t`, wherever they live.
pub trait RowSource: Sync {
    /// Decodes key `t` into `out` (`dim` floats).
    fn row(&self, t: usize, out: &mut [f32]);
    /// A hint that keys `tokens` (the members of cluster `unit`) are about to be read: one
    /// source reads them together (one contiguous read per run) instead of row by row.
    fn prefetch(&self, unit: u32, tokens: &[u32]);
}

#[derive(Clone, Copy)]
enum Rows<'a> {
    Ram(&'a [f16]),
    Source(&'a dyn RowSource),
}

/// Read-only keys of one (layer, KV head): `len` keys of `dim` elements, in RAM or behind a
/// [`RowSource`]. Invariant: keys `first..len` are readable (`first` is 0 but for a
/// [`HeadKeys::window`]), each the f16 bits written for it.
#[derive(Clone, Copy)]
pub struct HeadKeys<'a> {
    rows: Rows<'a>,
    /// The key `rows` starts with (RAM rows only).
    first: usize,
    len: usize,
    dim: usize,
}

impl<'a> HeadKeys<'a> {
    /// Keys over `rows` (`rows.len()` a multiple of `dim`).
    pub fn new(rows: &'a [f16], dim: usize) -> HeadKeys<'a> {
        assert!(dim > 0 && rows.len() % dim == 0, "HeadKeys: rows must be whole keys of {dim}");
        HeadKeys { rows: Rows::Ram(rows), first: 0, len: rows.len() / dim, dim }
    }

    /// Keys `first..first + rows.len() / dim` over `rows`, the keys before `first` not
    /// readable: one prefill segment's keys gathered apart (`len()` counts from 0).
    pub fn window(rows: &'a [f16], first: usize, dim: usize) -> HeadKeys<'a> {
        assert!(dim > 0 && rows.len() % dim == 0, "HeadKeys: rows must be whole keys of {dim}");
        HeadKeys { rows: Rows::Ram(rows), first, len: first + rows.len() / dim, dim }
    }

    /// `len` keys of `dim` elements read through `source`.
    pub fn from_source(source: &'a dyn RowSource, len: usize, dim: usize) -> HeadKeys<'a> {
        assert!(dim > 0, "HeadKeys: zero dim");
        HeadKeys { rows: Rows::Source(source), first: 0, len, dim }
    }

    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no token is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Elements per key.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// Decodes key `t` into `out` (`dim` floats).
    pub fn row(&self, t: usize, out: &mut [f32]) {
        match self.rows {
            Rows::Ram(r) => r[(t - self.first) * self.dim..(t - self.first + 1) * self.dim].convert_to_f32_slice(out),
            Rows::Source(s) => s.row(t, out),
        }
    }

    /// Decodes keys `range` into `out` (`range.len() * dim` floats).
    pub fn rows(&self, range: std::ops::Range<usize>, out: &mut [f32]) {
        match self.rows {
            Rows::Ram(r) => r[(range.start - self.first) * self.dim..(range.end - self.first) * self.dim].convert_to_f32_slice(out),
            Rows::Source(s) => {
                for (i, t) in range.enumerate() {
                    s.row(t, &mut out[i * self.dim..(i + 1) * self.dim]);
                }
            }
        }
    }

    /// Hints that the members of cluster `unit` are about to be read ([`RowSource::prefetch`];
    /// nothing for keys in RAM).
    pub fn prefetch(&self, unit: u32, tokens: &[u32]) {
        if let Rows::Source(s) = self.rows {
            s.prefetch(unit, tokens);
        }
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
