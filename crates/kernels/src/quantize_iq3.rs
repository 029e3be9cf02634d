//! Quantizers of IQ3_XXS and IQ3_S (`iq3.rs` has the layouts): each 32-element sub-block's
//! scale maps its largest magnitude to the grid's largest, then every group of 4 magnitudes
//! takes the nearest grid entry (least squares, searched exhaustively: 256 or 512 entries) and
//! each element keeps its sign. IQ3_XXS stores 7 signs per 8 elements, the 8th being their
//! parity, so a group of 8 with an odd count of negatives flips its smallest element.
//!
//! Simpler than ggml's `quantize_row_iq3_*` (no importance weights, no scale refinement): its
//! output is valid for every reader, and what the tests and benchmarks need; real files come
//! from llama.cpp's quantizer. Invariant: the blocks decode (`dequant.rs`) to within the
//! error bounds that `tests/it/formats.rs` checks, and all-zero input gives zeros.

use crate::blocks::put_f16;
use crate::dtype::DType;
use crate::iq3::{d_of, grid, IQ3S_QH, IQ3S_SCALES, IQ3S_SIGNS, IQ3XXS_SS, IQ3_QS};

/// The largest grid magnitude (IQ3_XXS 62, IQ3_S 15).
fn grid_max(dtype: DType) -> f32 {
    if dtype == DType::IQ3XXS {
        62.0
    } else {
        15.0
    }
}

/// The grid entry nearest (least squares) to the magnitudes `t`.
fn nearest(dtype: DType, t: [f32; 4]) -> usize {
    let entries = if dtype == DType::IQ3XXS { 256 } else { 512 };
    let mut best = (f32::MAX, 0);
    for i in 0..entries {
        let g = grid(dtype, i).to_le_bytes();
        let e: f32 = (0..4).map(|k| (g[k] as f32 - t[k]).powi(2)).sum();
        if e < best.0 {
            best = (e, i);
        }
    }
    best.1
}

/// Quantizes one 256-element block `x` into `b` (98 bytes for IQ3_XXS, 110 for IQ3_S).
pub(crate) fn iq3_block(dtype: DType, x: &[f32], b: &mut [u8]) {
    b.fill(0);
    let gmax = grid_max(dtype);
    let amax: [f32; 8] = std::array::from_fn(|j| x[32 * j..32 * j + 32].iter().fold(0f32, |m, v| m.max(v.abs())));
    let top = amax.iter().fold(0f32, |m, v| m.max(*v));
    if top == 0.0 {
        return;
    }
    // The block scale D (what multiplies `scale · grid`): the largest sub-block needs scale 31.
    let want = top / gmax / 31.0;
    put_f16(b, 0, if dtype == DType::IQ3XXS { 4.0 * want } else { want });
    let dd = d_of(dtype, b);
    if dd == 0.0 {
        b.fill(0);
        return;
    }
    for j in 0..8 {
        // The odd scale 2s + 1 nearest to what maps this sub-block's largest magnitude to gmax.
        let s = (((amax[j] / gmax / dd) - 1.0) / 2.0).round().clamp(0.0, 15.0) as u32;
        let step = dd * (2 * s + 1) as f32;
        let xs = &x[32 * j..32 * j + 32];
        let mut idx = [0usize; 8];
        for (k, ix) in idx.iter_mut().enumerate() {
            *ix = nearest(dtype, std::array::from_fn(|e| xs[4 * k + e].abs() / step));
        }
        let mut signs = [0u8; 4];
        for (l, sb) in signs.iter_mut().enumerate() {
            let g = &xs[8 * l..8 * l + 8];
            *sb = (0..8).filter(|&e| g[e] < 0.0).fold(0u8, |m, e| m | (1 << e));
            if dtype == DType::IQ3XXS && sb.count_ones() % 2 == 1 {
                // Only even sign counts are stored: flip the element that costs least.
                let e = (0..8).min_by(|&a, &c| g[a].abs().total_cmp(&g[c].abs())).expect("8 elements");
                *sb ^= 1 << e;
            }
        }
        match dtype {
            DType::IQ3XXS => {
                for (k, ix) in idx.iter().enumerate() {
                    b[IQ3_QS + 8 * j + k] = *ix as u8;
                }
                let w = (0..4).fold(s << 28, |w, l| w | (((signs[l] & 127) as u32) << (7 * l)));
                b[IQ3XXS_SS + 4 * j..IQ3XXS_SS + 4 * j + 4].copy_from_slice(&w.to_le_bytes());
            }
            _ => {
                for (k, ix) in idx.iter().enumerate() {
                    b[IQ3_QS + 8 * j + k] = *ix as u8;
                    b[IQ3S_QH + j] |= ((ix >> 8) as u8) << k;
                }
                b[IQ3S_SIGNS + 4 * j..IQ3S_SIGNS + 4 * j + 4].copy_from_slice(&signs);
                b[IQ3S_SCALES + j / 2] |= (s as u8) << (4 * (j % 2));
            }
        }
    }
}
