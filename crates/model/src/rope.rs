//! Rotary position embeddings, in both pairings (see [`RopeStyle`]), over the
//! first `rotary_dim` dimensions of each head (all of them but for Phi-3's
//! partial rotary; the rest pass through unchanged).
//!
//! Invariant: rotating by position `p` then by `q` equals rotating by `p + q`
//! up to float rounding; the KV store relies on this to move cached keys.
//!
//! YaRN's frequencies ([`YarnScaling`]) are resolved here into `inv_freq`, so the tables
//! and shifts treat them as any other RoPE; its attention factor rides on the table
//! ([`RopeTable::scaled`]).

use crate::config::{ModelConfig, RopeConfig, RopeStyle};

/// The RoPE each layer's keys were rotated with, for moving cached keys: one [`RopeConfig`]
/// for every layer, or a [`ModelConfig`]'s per-layer choice (Gemma 3's sliding layers use
/// their own base). Invariant: `rope_of(layer)` is the table the forward pass rotated that
/// layer's keys with (for a `RopeConfig`, only true of models with one RoPE).
pub trait LayerRopes {
    /// The RoPE of `layer`.
    fn rope_of(&self, layer: usize) -> &RopeConfig;
}

impl LayerRopes for RopeConfig {
    fn rope_of(&self, _layer: usize) -> &RopeConfig {
        self
    }
}

impl LayerRopes for ModelConfig {
    fn rope_of(&self, layer: usize) -> &RopeConfig {
        self.layer_rope(layer)
    }
}

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

    /// This table with every cos and sin multiplied by `factor` (LongRoPE's attention
    /// scaling, as transformers multiplies them): rotating then scales the rotated dimensions.
    /// Only new tokens are rotated with it; [`shift`] moves stored keys without it.
    pub fn scaled(mut self, factor: f32) -> RopeTable {
        if factor != 1.0 {
            self.cos.iter_mut().chain(self.sin.iter_mut()).for_each(|x| *x *= factor);
        }
        self
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

/// YaRN RoPE scaling (HF `rope_type: "yarn"`, GGUF `rope.scaling.type = yarn`): each
/// frequency is a blend of the plain one (extrapolation) and it divided by `factor`
/// (interpolation), by a linear ramp over the pair index between the dimensions that turn
/// `beta_fast` and `beta_slow` times over `original_max_positions`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct YarnScaling {
    pub factor: f32,
    pub original_max_positions: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// Round the ramp's ends outwards to whole dimensions (transformers' `truncate`, default
    /// true; llama.cpp's `ggml_rope_yarn_corr_dims` always does).
    pub truncate: bool,
}

impl YarnScaling {
    /// The factor on cos/sin: `0.1 · ln(factor) + 1` (1 for `factor <= 1`), as transformers'
    /// `get_mscale` and llama.cpp's `rope_yarn` compute it without `mscale` keys.
    pub fn attention_factor(&self) -> f32 {
        if self.factor <= 1.0 {
            1.0
        } else {
            (0.1 * (self.factor as f64).ln() + 1.0) as f32
        }
    }

    /// `rotary_dim / 2` frequencies for base `theta`, as transformers'
    /// `_compute_yarn_parameters` computes them (ramp ends in f64, the blend in f32).
    pub fn inv_freq(&self, theta: f32, rotary_dim: usize) -> Vec<f32> {
        let dim = rotary_dim as f64;
        let correction_dim = |rotations: f64| {
            dim * (self.original_max_positions as f64 / (rotations * 2.0 * std::f64::consts::PI)).ln() / (2.0 * (theta as f64).ln())
        };
        let (mut low, mut high) = (correction_dim(self.beta_fast as f64), correction_dim(self.beta_slow as f64));
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        let (low, mut high) = (low.max(0.0) as f32, high.min(dim - 1.0) as f32);
        if low == high {
            high += 0.001;
        }
        (0..rotary_dim / 2)
            .map(|i| {
                let pos_freq = theta.powf((2 * i) as f32 / rotary_dim as f32);
                let (extrapolated, interpolated) = (1.0 / pos_freq, 1.0 / (self.factor * pos_freq));
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let keep = 1.0 - ramp;
                interpolated * (1.0 - keep) + extrapolated * keep
            })
            .collect()
    }
}

/// Rotates one head vector by the given cos/sin pairs: its first `2 * c.len()` dimensions
/// (the rotary part), leaving any further dimensions as they are.
#[inline]
pub fn rotate_head(style: RopeStyle, head: &mut [f32], c: &[f32], s: &[f32]) {
    let half = c.len();
    match style {
        RopeStyle::Neox => {
            let (a, b) = head[..2 * half].split_at_mut(half);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(style: RopeStyle, rotary_dim: usize) -> RopeConfig {
        RopeConfig { theta: 10000.0, style, inv_freq: RopeConfig::base_inv_freq(10000.0, rotary_dim), scaling: String::new() }
    }

    #[test]
    fn partial_rotary_leaves_the_rest_of_the_head_and_shifts_compose() {
        for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
            // head_dim 16, 12 rotated (Phi-4-mini's 0.75).
            let c = cfg(style, 12);
            let head: Vec<f32> = (0..16).map(|i| (i as f32 * 0.37).sin() + 0.1).collect();
            let mut at_7 = head.clone();
            apply(style, &RopeTable::new(&c, [7].into_iter()), &mut at_7, 16);
            assert_eq!(at_7[12..], head[12..], "{style:?}: pass-through dimensions changed");
            assert_ne!(at_7[..12], head[..12]);
            // Moving the key from position 7 to 30 by a shift equals rotating the original to 30.
            let mut at_30 = head.clone();
            apply(style, &RopeTable::new(&c, [30].into_iter()), &mut at_30, 16);
            let (cos, sin) = shift(&c, 23);
            rotate_head(style, &mut at_7, &cos, &sin);
            assert!(at_7.iter().zip(&at_30).all(|(a, b)| (a - b).abs() < 1e-5), "{style:?}: {at_7:?} vs {at_30:?}");
        }
    }

    /// gpt-oss-20b's YaRN (base 150000, factor 32 from 4096, betas 32 / 1, head 64) against
    /// transformers 5.24's `_compute_yarn_parameters`, with its `truncate: false` and with
    /// the truncation llama.cpp applies: the same outside the ramp, different inside it.
    #[test]
    fn yarn_frequencies_match_transformers() {
        let mut y = YarnScaling { factor: 32.0, original_max_positions: 4096.0, beta_fast: 32.0, beta_slow: 1.0, truncate: false };
        assert!((y.attention_factor() - 1.3465736).abs() < 1e-6);
        let at = [0, 5, 8, 9, 12, 17, 18, 31];
        let hf_exact: [f32; 8] = [1.0, 0.15532298, 0.050813273, 0.031705696, 0.006794959, 0.0001293187, 3.830881e-05, 3.0235114e-07];
        let hf_truncated: [f32; 8] = [1.0, 0.15532298, 0.050813273, 0.031620752, 0.007015714, 0.00022794784, 3.830881e-05, 3.0235114e-07];
        for (truncate, want) in [(false, hf_exact), (true, hf_truncated)] {
            y.truncate = truncate;
            let f = y.inv_freq(150000.0, 64);
            for (&i, w) in at.iter().zip(want) {
                assert!((f[i] - w).abs() <= 2e-6 * w, "truncate {truncate}: pair {i}: {} vs transformers {w}", f[i]);
            }
        }
    }

    #[test]
    fn a_scaled_table_scales_only_the_rotated_dimensions() {
        let c = cfg(RopeStyle::Neox, 4);
        let head = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let (mut plain, mut scaled) = (head.clone(), head.clone());
        apply(c.style, &RopeTable::new(&c, [5].into_iter()), &mut plain, 6);
        apply(c.style, &RopeTable::new(&c, [5].into_iter()).scaled(1.5), &mut scaled, 6);
        for i in 0..4 {
            assert!((scaled[i] - 1.5 * plain[i]).abs() < 1e-5);
        }
        assert_eq!(scaled[4..], head[4..]);
    }
}
