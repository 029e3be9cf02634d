//! aarch64 NEON kernels for the quantized formats (Q4_0, Q8_0, Q4_K, Q6_K).
//!
//! Each block's integer dot product runs on 128-bit vectors with widening multiplies
//! (`vmull_s8`, pairwise-accumulated into 32-bit lanes by `vpadalq_s16`; baseline ARMv8-A, no
//! `dotprod` extension needed), plugged into the scalar path's float recipe
//! (`scalar::dot_with`, one function for both). Integer sums are exact whatever their order, so every
//! (row, token) result is **bitwise the scalar reference** (`tests/neon.rs`, run under
//! `qemu-aarch64` by `scripts/neon-check.sh`). Float formats (F32/F16/BF16) run the scalar
//! kernel on this path.

use std::arch::aarch64::*;

use super::scalar::{dot_with, BlockDots};
use super::TileCtx;
use crate::blocks::*;

/// Computes the tile element by element (each weight block decoded once per token): the
/// scalar float recipe ([`dot_with`]) over this module's integer dots.
///
/// # Safety
/// As [`super::run_tile`]: the tile in bounds, its output elements written by no one else.
pub(crate) unsafe fn tile(c: &TileCtx, r0: usize, nr: usize, t0: usize, nt: usize) {
    for t in t0..t0 + nt {
        for r in r0..r0 + nr {
            *c.out.add(t * c.ldo + r) = dot_with::<NeonDots>(c, r, t);
        }
    }
}

/// The integer dots on NEON. Every caller passes a whole block (`b`, `qs`) and the matching
/// whole activation block (`xq`, 32 or 256 values), which every load below stays inside.
struct NeonDots;

impl BlockDots for NeonDots {
    fn q8_0(b: &[u8], xq: &[i8]) -> i32 {
        assert!(b.len() >= 34 && xq.len() >= QK);
        // SAFETY: lengths checked above; NEON is part of every aarch64 target.
        unsafe { q8_0_isum(b, xq) }
    }
    fn q4_0(b: &[u8], xq: &[i8]) -> i32 {
        assert!(b.len() >= 18 && xq.len() >= QK);
        // SAFETY: as above.
        unsafe { q4_0_isum(b, xq) }
    }
    fn q4k_group(qs: &[u8], xq: &[i8], j: usize) -> i32 {
        assert!(j < 8 && qs.len() >= 128 && xq.len() >= QK_K);
        // SAFETY: as above.
        unsafe { q4k_group(qs, xq, j) }
    }
    fn q6k(b: &[u8], xq: &[i8]) -> i32 {
        assert!(b.len() >= 210 && xq.len() >= QK_K);
        // SAFETY: as above.
        unsafe { q6k_isum(b, xq) }
    }
}

/// Σ w·x over 16 signed bytes each, added to 32-bit lanes (products fit i16: |w·x| ≤ 2^14).
#[inline(always)]
unsafe fn dot16(acc: int32x4_t, w: int8x16_t, x: int8x16_t) -> int32x4_t {
    let acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(w), vget_low_s8(x)));
    vpadalq_s16(acc, vmull_high_s8(w, x))
}

/// Q8_0: Σ w·x of one block (32 i8 weights after the f16 scale).
unsafe fn q8_0_isum(b: &[u8], xq: &[i8]) -> i32 {
    let w = b.as_ptr().add(2) as *const i8;
    let acc = dot16(vdupq_n_s32(0), vld1q_s8(w), vld1q_s8(xq.as_ptr()));
    vaddvq_s32(dot16(acc, vld1q_s8(w.add(16)), vld1q_s8(xq.as_ptr().add(16))))
}

/// Q4_0: Σ q·x of one block, q the unsigned nibbles (low nibbles are elements 0..16, high
/// 16..32); the caller subtracts 8·Σx.
unsafe fn q4_0_isum(b: &[u8], xq: &[i8]) -> i32 {
    let v = vld1q_u8(b.as_ptr().add(2));
    let lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0F)));
    let hi = vreinterpretq_s8_u8(vshrq_n_u8::<4>(v));
    let acc = dot16(vdupq_n_s32(0), lo, vld1q_s8(xq.as_ptr()));
    vaddvq_s32(dot16(acc, hi, vld1q_s8(xq.as_ptr().add(16))))
}

/// Q4_K: Σ q·x of sub-block `j` (32 values: nibbles of `qs[32·(j/2)..]`, low for even `j`).
unsafe fn q4k_group(qs: &[u8], xq: &[i8], j: usize) -> i32 {
    let (cc, hi) = (j / 2, j % 2 == 1);
    let mut acc = vdupq_n_s32(0);
    for half in 0..2 {
        let v = vld1q_u8(qs.as_ptr().add(32 * cc + 16 * half));
        let q = if hi { vshrq_n_u8::<4>(v) } else { vandq_u8(v, vdupq_n_u8(0x0F)) };
        acc = dot16(acc, vreinterpretq_s8_u8(q), vld1q_s8(xq.as_ptr().add(32 * j + 16 * half)));
    }
    vaddvq_s32(acc)
}

/// Q6_K: Σ scale_j · Σ (q−32)·x over the block's 16 groups of 16 values. Element `i` has
/// low bits from `ql[64h + l + 32(k%2)]` (low nibble for k < 2) and high bits
/// `(qh[32h + l] >> 2k) & 3`, with `h = i/128`, `k = (i%128)/32`, `l = i%32` (as
/// `dequant::q6k_value`).
unsafe fn q6k_isum(b: &[u8], xq: &[i8]) -> i32 {
    let mut isum = 0i32;
    let (m4, m3, c32) = (vdupq_n_u8(0x0F), vdupq_n_u8(3), vdupq_n_s8(32));
    for h in 0..2 {
        for l0 in [0usize, 16] {
            let ql_a = vld1q_u8(b.as_ptr().add(64 * h + l0));
            let ql_b = vld1q_u8(b.as_ptr().add(64 * h + 32 + l0));
            let qh = vld1q_u8(b.as_ptr().add(Q6K_QH + 32 * h + l0));
            let q = [
                vorrq_u8(vandq_u8(ql_a, m4), vshlq_n_u8::<4>(vandq_u8(qh, m3))),
                vorrq_u8(vandq_u8(ql_b, m4), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(qh), m3))),
                vorrq_u8(vshrq_n_u8::<4>(ql_a), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(qh), m3))),
                vorrq_u8(vshrq_n_u8::<4>(ql_b), vshlq_n_u8::<4>(vshrq_n_u8::<6>(qh))),
            ];
            for (k, q) in q.into_iter().enumerate() {
                let i = 128 * h + 32 * k + l0;
                let v = vsubq_s8(vreinterpretq_s8_u8(q), c32);
                let d = vaddvq_s32(dot16(vdupq_n_s32(0), v, vld1q_s8(xq.as_ptr().add(i))));
                isum += (b[Q6K_SCALES + i / 16] as i8) as i32 * d;
            }
        }
    }
    isum
}
