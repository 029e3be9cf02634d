//! Rotary position embeddings, in both pairings (see [`RopeStyle`]).
//!
//! Invariant: rotating by position `p` then by `q` equals rotating by `p + q`
//! up to float rounding; the KV store relies on this to move cached keys.

use crate::config::{RopeConfig, RopeStyle};

/// `cos`/`sin` of `pos * inv_freq[i]` for each pair, for a list of positions.
pub struct RopeTable {
    pub half: usize,
    pub cos: Vec<f32>,
    pub sin: Vec<f32>,
}

impl RopeTable {
    /// Computes the table for `positions`; angles in f64 so large positions stay accurate.
    pub fn new(cfg: &RopeConfig, positions: impl Iterator<Item = usize>) -> RopeTable {
        let half = cfg.inv_freq.len();
        let (mut cos, mut sin) = (Vec::new(), Vec::new());
        for p in positions {
            for &f in &cfg.inv_freq {
                // transformers computes (inv_freq * pos) in f32, then cos/sin in f32.
                let angle = f * p as f32;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        RopeTable { half, cos, sin }
    }
}

/// `cos`/`sin` of `delta * inv_freq[i]` for a signed position shift: rotating
/// a key stored at position `p` by these gives (up to rounding) the key at `p + delta`.
pub fn shift(cfg: &RopeConfig, delta: i64) -> (Vec<f32>, Vec<f32>) {
    cfg.inv_freq.iter().map(|&f| ((f as f64 * delta as f64).cos() as f32, (f as f64 * delta as f64).sin() as f32)).unzip()
}

/// Rotates every head of each row of `x` (`[rows, num_heads * head_dim]`), row `r` by table row `r`.
pub fn apply(style: RopeStyle, table: &RopeTable, x: &mut [f32], head_dim: usize) {
    let half = table.half;
    let width = x.len() / (table.cos.len() / half).max(1);
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        let (c, s) = (&table.cos[r * half..(r + 1) * half], &table.sin[r * half..(r + 1) * half]);
        for head in row.chunks_exact_mut(head_dim) {
            rotate_head(style, head, c, s);
        }
    }
}

/// Rotates one head vector by the given cos/sin pairs.
#[inline]
pub fn rotate_head(style: RopeStyle, head: &mut [f32], c: &[f32], s: &[f32]) {
    let half = c.len();
    match style {
        RopeStyle::Neox => {
            let (a, b) = head.split_at_mut(half);
            for i in 0..half {
                let (x0, x1) = (a[i], b[i]);
                a[i] = x0 * c[i] - x1 * s[i];
                b[i] = x1 * c[i] + x0 * s[i];
            }
        }
        RopeStyle::Interleaved => {
            for i in 0..half {
                let (x0, x1) = (head[2 * i], head[2 * i + 1]);
                head[2 * i] = x0 * c[i] - x1 * s[i];
                head[2 * i + 1] = x1 * c[i] + x0 * s[i];
            }
        }
    }
}
