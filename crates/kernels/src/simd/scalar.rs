//! Portable scalar kernels: one (row, token) dot product at a time. They are the reference the
//! SIMD paths are tested against and the fallback on CPUs without AVX2 (and for the float
//! formats on aarch64). Integer parts are exact; floats accumulate sequentially in f32.
//! [`dot_with`] is the one float recipe: `neon` plugs its own integer dots ([`BlockDots`]) into it.

use super::{Acts, TileCtx};
use crate::blocks::*;
use crate::dequant::q6k_value;
use crate::dtype::DType;

/// Computes the tile element by element.
pub(crate) unsafe fn tile(c: &TileCtx, r0: usize, nr: usize, t0: usize, nt: usize) {
    for t in t0..t0 + nt {
        for r in r0..r0 + nr {
            *c.out.add(t * c.ldo + r) = dot(c, r, t);
        }
    }
}

/// One (row, token) dot product: the reference every SIMD path's result is compared with.
pub(crate) fn dot(c: &TileCtx, r: usize, t: usize) -> f32 {
    dot_with::<ScalarDots>(c, r, t)
}

/// The integer dot of one quantized block (or sub-block) against its activation block: what a
/// path may compute with its own instructions. Integer sums are exact in any order, so every
/// implementation gives the same numbers as [`ScalarDots`].
pub(crate) trait BlockDots {
    /// Q8_0: Σ w·x over a block's 32 `i8` weights (after the f16 scale) and `xq[..32]`.
    fn q8_0(b: &[u8], xq: &[i8]) -> i32;
    /// Q4_0: Σ q·x with `q` the block's unsigned nibbles (byte `j`: element `j` low, `j + 16`
    /// high), not yet offset by 8.
    fn q4_0(b: &[u8], xq: &[i8]) -> i32;
    /// Q4_K: Σ q·x over sub-block `j` (32 nibbles of `qs[32·(j/2)..]`, low for even `j`).
    fn q4k_group(qs: &[u8], xq: &[i8], j: usize) -> i32;
    /// Q6_K: Σ_j scale_j · Σ (q−32)·x over the block's 16 groups of 16 values.
    fn q6k(b: &[u8], xq: &[i8]) -> i32;
}

/// The reference integer dots, one element at a time.
pub(crate) struct ScalarDots;

impl BlockDots for ScalarDots {
    fn q8_0(b: &[u8], xq: &[i8]) -> i32 {
        (0..QK).map(|j| (b[2 + j] as i8) as i32 * xq[j] as i32).sum()
    }
    fn q4_0(b: &[u8], xq: &[i8]) -> i32 {
        (0..16).map(|j| (b[2 + j] & 0xF) as i32 * xq[j] as i32 + (b[2 + j] >> 4) as i32 * xq[j + 16] as i32).sum()
    }
    fn q4k_group(qs: &[u8], xq: &[i8], j: usize) -> i32 {
        let (cc, hi) = (j / 2, j % 2 == 1);
        (0..32)
            .map(|l| {
                let q = qs[32 * cc + l];
                (if hi { q >> 4 } else { q & 0xF }) as i32 * xq[32 * j + l] as i32
            })
            .sum()
    }
    fn q6k(b: &[u8], xq: &[i8]) -> i32 {
        let mut isum = 0i32;
        for j in 0..16 {
            let d: i32 = (0..16).map(|l| (q6k_value(b, 16 * j + l) - 32) * xq[16 * j + l] as i32).sum();
            isum += (b[Q6K_SCALES + j] as i8) as i32 * d;
        }
        isum
    }
}

/// [`dot`] with the quantized formats' integer dots from `D`: the float operations per block
/// — scales, order, no FMA — are these for every path that uses it, which is what makes such
/// a path bitwise the reference.
pub(crate) fn dot_with<D: BlockDots>(c: &TileCtx, r: usize, t: usize) -> f32 {
    let w = c.w.row(r);
    let cols = c.w.cols;
    match (c.w.dtype, c.acts) {
        (DType::F32, Acts::F32(x)) => {
            let x = &x[t * cols..(t + 1) * cols];
            w.chunks_exact(4).zip(x).fold(0f32, |s, (b, x)| s + f32::from_le_bytes([b[0], b[1], b[2], b[3]]) * x)
        }
        (DType::F16, Acts::F32(x)) => {
            let x = &x[t * cols..(t + 1) * cols];
            w.chunks_exact(2).zip(x).fold(0f32, |s, (b, x)| s + f16_at(b, 0) * x)
        }
        (DType::BF16, Acts::F32(x)) => {
            let x = &x[t * cols..(t + 1) * cols];
            w.chunks_exact(2).zip(x).fold(0f32, |s, (b, x)| s + bf16_at(b, 0) * x)
        }
        (DType::Q8_0 | DType::Q4_0, Acts::Q8(a)) => {
            let q4 = c.w.dtype == DType::Q4_0;
            let mut acc = 0f32;
            for (i, b) in w.chunks_exact(c.w.dtype.block_bytes()).enumerate() {
                let ab = t * a.blocks_per_row + i;
                let xq = &a.qs[ab * QK..ab * QK + QK];
                let isum: i32 = if q4 { D::q4_0(b, xq) - 8 * a.sum[ab] } else { D::q8_0(b, xq) };
                acc += f16_at(b, 0) * a.d[ab] * isum as f32;
            }
            acc
        }
        (DType::Q4K, Acts::Q8K(a)) => {
            let mut acc = 0f32;
            for (i, b) in w.chunks_exact(144).enumerate() {
                let ab = t * a.blocks_per_row + i;
                let xq = &a.qs[ab * QK_K..ab * QK_K + QK_K];
                let bs = &a.bsums[ab * 16..ab * 16 + 16];
                let (sc, m) = scales_mins_k4(&b[Q4K_SCALES..]);
                let qs = &b[Q4K_QS..];
                let (mut isum, mut msum) = (0i32, 0i32);
                for j in 0..8 {
                    isum += sc[j] as i32 * D::q4k_group(qs, xq, j);
                    msum += m[j] as i32 * (bs[2 * j] as i32 + bs[2 * j + 1] as i32);
                }
                acc += f16_at(b, 0) * a.d[ab] * isum as f32 - f16_at(b, 2) * a.d[ab] * msum as f32;
            }
            acc
        }
        (DType::Q6K, Acts::Q8K(a)) => {
            let mut acc = 0f32;
            for (i, b) in w.chunks_exact(210).enumerate() {
                let ab = t * a.blocks_per_row + i;
                let xq = &a.qs[ab * QK_K..ab * QK_K + QK_K];
                acc += f16_at(b, Q6K_D) * a.d[ab] * D::q6k(b, xq) as f32;
            }
            acc
        }
        _ => unreachable!("activations prepared for the wrong dtype"),
    }
}
