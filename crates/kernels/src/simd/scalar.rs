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
    /// Σ q·x over 32 unsigned nibbles (`qs[..16]` in the Q4_0 arrangement): Q4_1.
    fn nib32(qs: &[u8], xq: &[i8]) -> i32 {
        (0..16).map(|j| (qs[j] & 0xF) as i32 * xq[j] as i32 + (qs[j] >> 4) as i32 * xq[j + 16] as i32).sum()
    }
    /// Σ q·x over 32 five-bit values (nibbles `qs`, fifth bits `qh`): Q5_0 / Q5_1.
    fn q5(qh: u32, qs: &[u8], xq: &[i8]) -> i32 {
        (0..16)
            .map(|j| {
                let lo = (qs[j] & 0xF) as i32 | (((qh >> j) & 1) << 4) as i32;
                let hi = (qs[j] >> 4) as i32 | (((qh >> (j + 16)) & 1) << 4) as i32;
                lo * xq[j] as i32 + hi * xq[j + 16] as i32
            })
            .sum()
    }
    /// Σ table[q]·x over 32 nibbles (`qs[..16]`, Q4_0 arrangement): IQ4_NL, MXFP4, IQ4_XS.
    fn lut32(qs: &[u8], xq: &[i8], table: &[i8; 16]) -> i32 {
        (0..16).map(|j| table[(qs[j] & 0xF) as usize] as i32 * xq[j] as i32 + table[(qs[j] >> 4) as usize] as i32 * xq[j + 16] as i32).sum()
    }
    /// Q5_K: Σ q·x over sub-block `j` (32 five-bit values) of block `b`; `xq` the whole block.
    fn q5k_group(b: &[u8], xq: &[i8], j: usize) -> i32 {
        (32 * j..32 * j + 32).map(|i| q5k_value(b, i) * xq[i] as i32).sum()
    }
    /// Q2_K: Σ q·x over 16-element group `j` (2-bit values) of block `b`; `xq` the whole block.
    fn q2k_group(b: &[u8], xq: &[i8], j: usize) -> i32 {
        (16 * j..16 * j + 16).map(|i| q2k_value(b, i) * xq[i] as i32).sum()
    }
    /// Q3_K: Σ q·x over 16-element group `j` (values −4..4) of block `b`; `xq` the whole block.
    fn q3k_group(b: &[u8], xq: &[i8], j: usize) -> i32 {
        (16 * j..16 * j + 16).map(|i| q3k_value(b, i) * xq[i] as i32).sum()
    }
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
        (DType::Q4_1 | DType::Q5_1, Acts::Q8(a)) => {
            let q5 = c.w.dtype == DType::Q5_1;
            let mut acc = 0f32;
            for (i, b) in w.chunks_exact(c.w.dtype.block_bytes()).enumerate() {
                let ab = t * a.blocks_per_row + i;
                let xq = &a.qs[ab * QK..ab * QK + QK];
                let isum = if q5 { D::q5(u32_at(b, Q5_1_QH), &b[Q5_1_QS..], xq) } else { D::nib32(&b[Q4_1_QS..], xq) };
                acc += f16_at(b, 0) * a.d[ab] * isum as f32 + f16_at(b, 2) * a.s[ab];
            }
            acc
        }
        (DType::Q5_0 | DType::IQ4NL | DType::MXFP4, Acts::Q8(a)) => {
            let mut acc = 0f32;
            for (i, b) in w.chunks_exact(c.w.dtype.block_bytes()).enumerate() {
                let ab = t * a.blocks_per_row + i;
                let xq = &a.qs[ab * QK..ab * QK + QK];
                let (d, isum) = match c.w.dtype {
                    DType::Q5_0 => (f16_at(b, 0), D::q5(u32_at(b, Q5_0_QH), &b[Q5_0_QS..], xq) - 16 * a.sum[ab]),
                    DType::IQ4NL => (f16_at(b, 0), D::lut32(&b[2..], xq, &KVALUES_IQ4NL)),
                    _ => (e8m0_half(b[0]), D::lut32(&b[1..], xq, &KVALUES_MXFP4)),
                };
                acc += d * a.d[ab] * isum as f32;
            }
            acc
        }
        (DType::Q5K, Acts::Q8K(a)) => {
            let mut acc = 0f32;
            for (i, b) in w.chunks_exact(176).enumerate() {
                let ab = t * a.blocks_per_row + i;
                let xq = &a.qs[ab * QK_K..ab * QK_K + QK_K];
                let bs = &a.bsums[ab * 16..ab * 16 + 16];
                let (sc, m) = scales_mins_k4(&b[Q4K_SCALES..]);
                let (mut isum, mut msum) = (0i32, 0i32);
                for j in 0..8 {
                    isum += sc[j] as i32 * D::q5k_group(b, xq, j);
                    msum += m[j] as i32 * (bs[2 * j] as i32 + bs[2 * j + 1] as i32);
                }
                acc += f16_at(b, 0) * a.d[ab] * isum as f32 - f16_at(b, 2) * a.d[ab] * msum as f32;
            }
            acc
        }
        (DType::Q2K, Acts::Q8K(a)) => {
            let mut acc = 0f32;
            for (i, b) in w.chunks_exact(84).enumerate() {
                let ab = t * a.blocks_per_row + i;
                let xq = &a.qs[ab * QK_K..ab * QK_K + QK_K];
                let bs = &a.bsums[ab * 16..ab * 16 + 16];
                let (mut isum, mut msum) = (0i32, 0i32);
                for j in 0..16 {
                    isum += (b[j] & 0xF) as i32 * D::q2k_group(b, xq, j);
                    msum += (b[j] >> 4) as i32 * bs[j] as i32;
                }
                acc += f16_at(b, Q2K_D) * a.d[ab] * isum as f32 - f16_at(b, Q2K_D + 2) * a.d[ab] * msum as f32;
            }
            acc
        }
        (DType::Q3K, Acts::Q8K(a)) => {
            let mut acc = 0f32;
            for (i, b) in w.chunks_exact(110).enumerate() {
                let ab = t * a.blocks_per_row + i;
                let xq = &a.qs[ab * QK_K..ab * QK_K + QK_K];
                let sc = q3k_scales(b);
                let isum: i32 = (0..16).map(|j| sc[j] as i32 * D::q3k_group(b, xq, j)).sum();
                acc += f16_at(b, Q3K_D) * a.d[ab] * isum as f32;
            }
            acc
        }
        (DType::IQ4XS, Acts::Q8K(a)) => {
            let mut acc = 0f32;
            for (i, b) in w.chunks_exact(136).enumerate() {
                let ab = t * a.blocks_per_row + i;
                let xq = &a.qs[ab * QK_K..ab * QK_K + QK_K];
                let ls = iq4xs_scales(b);
                let isum: i32 = (0..8).map(|j| ls[j] * D::lut32(&b[IQ4XS_QS + 16 * j..], &xq[32 * j..], &KVALUES_IQ4NL)).sum();
                acc += f16_at(b, 0) * a.d[ab] * isum as f32;
            }
            acc
        }
        (DType::IQ3XXS | DType::IQ3S, Acts::Q8K(a)) => {
            let d = c.w.dtype;
            let mut acc = 0f32;
            for (i, b) in w.chunks_exact(d.block_bytes()).enumerate() {
                let ab = t * a.blocks_per_row + i;
                let xq = &a.qs[ab * QK_K..ab * QK_K + QK_K];
                let v = crate::iq3::values(d, b);
                let isum: i32 = (0..8)
                    .map(|j| crate::iq3::scale(d, b, j) * (32 * j..32 * j + 32).map(|e| v[e] as i32 * xq[e] as i32).sum::<i32>())
                    .sum();
                acc += crate::iq3::d_of(d, b) * a.d[ab] * isum as f32;
            }
            acc
        }
        _ => unreachable!("activations prepared for the wrong dtype"),
    }
}
