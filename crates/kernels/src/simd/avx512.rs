//! AVX-512 (F/BW/VL) + VNNI kernels (16 f32 lanes, 32 registers).
//!
//! * Float weights: 16 columns per step, masked loads for the row tail (so any `cols` works
//!   without a scalar epilogue). One-token F16 tiles (decode) prefetch the next tile's rows.
//! * Q4_0 / Q8_0: two 32-element blocks per 512-bit register; `vpdpbusd(bias, u, x)` computes
//!   `Σ u·x − k·Σx` exactly, where `u` = weights made unsigned (Q4_0 nibbles as-is, k = 8;
//!   Q8_0 `w ^ 0x80` = w + 128, k = 128) and `bias` comes precomputed with the activations.
//!   Lanes 0–7 belong to the first block, 8–15 to the second, so the per-block scales are two
//!   broadcast halves. An odd last block is zero-padded via masked loads.
//! * Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4: the same scheme in `avx512_q32`.
//! * Q3_K / IQ4_XS one-token tiles: `avx512_k` (VNNI, up to 4 rows per call); IQ3_XXS / IQ3_S
//!   tiles of 1–4 tokens: `avx512_iq3` (gathered grid entries).
//! * Q4_K / Q6_K and the formats of `avx2_k` (Q5_K, Q3_K, Q2_K, IQ4_XS) otherwise reuse the
//!   AVX2 kernels (not yet widened to 512 bits).
//!
//! Invariant: see `simd/mod.rs` — per-accumulator operation order is independent of the tile.

use super::{tile_dispatch, Acts, TileCtx};
use crate::blocks::*;
use crate::dtype::DType;
use std::arch::x86_64::*;

/// Dispatches a tile to the kernel for the weight format.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn tile(c: &TileCtx, r0: usize, nr: usize, t0: usize, nt: usize) {
    let w = c.w;
    let rb = w.row_bytes();
    let wp = w.data.as_ptr().add(r0 * rb);
    let out = c.out.add(t0 * c.ldo + r0);
    match (w.dtype, c.acts) {
        (DType::F32, Acts::F32(x)) => {
            tile_dispatch!(nr, nt, float_tile[0](wp, rb, x.as_ptr().add(t0 * w.cols), w.cols, out, c.ldo))
        }
        (DType::F16, Acts::F32(x)) => {
            tile_dispatch!(nr, nt, float_tile[1](wp, rb, x.as_ptr().add(t0 * w.cols), w.cols, out, c.ldo))
        }
        (DType::BF16, Acts::F32(x)) => {
            tile_dispatch!(nr, nt, float_tile[2](wp, rb, x.as_ptr().add(t0 * w.cols), w.cols, out, c.ldo))
        }
        (DType::Q4_0, Acts::Q8(a)) => tile_dispatch!(nr, nt, q8_tile[true](wp, rb, a, t0, out, c.ldo)),
        (DType::Q8_0, Acts::Q8(a)) => tile_dispatch!(nr, nt, q8_tile[false](wp, rb, a, t0, out, c.ldo)),
        (d, Acts::Q8(a)) if super::avx2_q32::tag(d).is_some() => {
            let k = super::avx2_q32::tag(d).unwrap_or_default();
            super::avx512_q32::tile_dispatch(k, nr, nt, wp, rb, a, t0, out, c.ldo)
        }
        // IQ3_XXS / IQ3_S below the token-lane kernel's threshold: rows with gathered grid
        // entries; one-token calls (decode) of Q3_K / IQ4_XS: the VNNI row tiles (all bitwise
        // the AVX2 ones).
        (d, Acts::Q8K(a)) if super::avx512_iq3::handles(d) => super::avx512_iq3::rows_tile(d, nr, nt, wp, rb, a, t0, out, c.ldo),
        (d, Acts::Q8K(a)) if nt == 1 && super::avx512_k::handles(d) => super::avx512_k::rows_tile(d, nr, wp, rb, a, t0, out),
        // Not yet widened to 512 bits: the AVX2 kernels (bitwise the same results on both paths).
        (DType::Q4K | DType::Q6K | DType::Q2K | DType::Q3K | DType::Q5K | DType::IQ4XS, _) => super::avx2::tile(c, r0, nr, t0, nt),
        _ => unreachable!("activations prepared for the wrong dtype"),
    }
}

/// Up to 16 weights (mask `m`) at element `i` of a row of kind K (0 = f32, 1 = f16, 2 = bf16).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn load16<const K: u8, const MASKED: bool>(p: *const u8, i: usize, m: u16) -> __m512 {
    match K {
        0 => {
            let q = p.add(4 * i) as *const f32;
            if MASKED {
                _mm512_maskz_loadu_ps(m, q)
            } else {
                _mm512_loadu_ps(q)
            }
        }
        _ => {
            let q = p.add(2 * i) as *const __m256i;
            let h = if MASKED { _mm256_maskz_loadu_epi16(m, q as *const i16) } else { _mm256_loadu_si256(q) };
            if K == 1 {
                _mm512_cvtph_ps(h)
            } else {
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn float_tile<const K: u8, const NR: usize, const NT: usize>(
    w: *const u8,
    rb: usize,
    x: *const f32,
    cols: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); NT]; NR];
    let n16 = cols / 16 * 16;
    let mut i = 0;
    while i < n16 {
        let mut wv = [_mm512_setzero_ps(); NR];
        for r in 0..NR {
            wv[r] = load16::<K, false>(w.add(r * rb), i, 0);
        }
        // One-token F16 calls (decode) stream the weights from DRAM, `NR` rows (often one
        // 4 KiB page each) at a time, and the hardware prefetchers start over on every page:
        // ask L2 for the next tile's rows at this column, one line per row every 32 columns.
        // Loads only; nothing computed changes.
        if K == 1 && NT == 1 && i % 32 == 0 {
            for r in 0..NR {
                _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add((NR + r) * rb + 2 * i) as *const i8);
            }
        }
        for t in 0..NT {
            let xv = _mm512_loadu_ps(x.add(t * cols + i));
            for r in 0..NR {
                acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
        i += 16;
    }
    if n16 < cols {
        let m: u16 = ((1u32 << (cols - n16)) - 1) as u16;
        let mut wv = [_mm512_setzero_ps(); NR];
        for r in 0..NR {
            wv[r] = load16::<K, true>(w.add(r * rb), i, m);
        }
        for t in 0..NT {
            let xv = _mm512_maskz_loadu_ps(m, x.add(t * cols + i));
            for r in 0..NR {
                acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
    }
    for r in 0..NR {
        for t in 0..NT {
            *out.add(t * ldo + r) = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}

/// A 16-entry signed table plus 128 (`t ^ 0x80`: each value as an unsigned byte) in every 128-bit
/// lane, for one `vpshufb` lookup of nibbles into `vpdpbusd`'s unsigned operand.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn table_plus_128(t: &[i8; 16]) -> __m512i {
    _mm512_xor_si512(_mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const __m128i)), _mm512_set1_epi8(-128))
}

/// Two 8-lane halves `[a; 8] ++ [b; 8]` (AVX-512F only, no DQ needed).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn halves(a: f32, b: f32) -> __m512 {
    let lo = _mm512_castps_pd(_mm512_castps256_ps512(_mm256_set1_ps(a)));
    _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_set1_ps(b)), 1))
}

/// Decodes weight block `b` (unaligned) into 32 unsigned bytes for `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn block_u8<const Q4: bool>(b: *const u8) -> __m256i {
    if Q4 {
        let v = _mm_loadu_si128(b.add(2) as *const __m128i);
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F))
    } else {
        _mm256_xor_si256(_mm256_loadu_si256(b.add(2) as *const __m256i), _mm256_set1_epi8(-128))
    }
}

/// Q4_0 (`Q4 = true`) or Q8_0 weights × Q8 activations, two blocks per step.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q8_tile<const Q4: bool, const NR: usize, const NT: usize>(
    w: *const u8,
    rb: usize,
    a: &crate::quantize::ActQ8,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let l8 = a.lanes8();
    let bb = if Q4 { 18 } else { 34 };
    let nb = a.blocks_per_row;
    let mut acc = [[_mm512_setzero_ps(); NT]; NR];
    let mut i = 0;
    while i < nb {
        let two = i + 1 < nb;
        let mut wv = [_mm512_setzero_si512(); NR];
        let mut dw = [_mm512_setzero_ps(); NR];
        for r in 0..NR {
            let b0 = w.add(r * rb + i * bb);
            let lo = _mm512_castsi256_si512(block_u8::<Q4>(b0));
            let d0 = super::avx2::f16_load(b0);
            if two {
                let b1 = b0.add(bb);
                wv[r] = _mm512_inserti64x4(lo, block_u8::<Q4>(b1), 1);
                dw[r] = halves(d0, super::avx2::f16_load(b1));
            } else {
                wv[r] = _mm512_inserti64x4(lo, _mm256_setzero_si256(), 1);
                dw[r] = halves(d0, 0.0);
            }
        }
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            let (xq, xb, xd) = (a.qs.as_ptr().add(ab * QK), l8.bias.as_ptr().add(ab * 8), l8.dv.as_ptr().add(ab * 8));
            let (xv, bias, dx) = if two {
                (_mm512_loadu_si512(xq as *const __m512i), _mm512_loadu_si512(xb as *const __m512i), _mm512_loadu_ps(xd))
            } else {
                (_mm512_maskz_loadu_epi8(0xFFFF_FFFF, xq), _mm512_maskz_loadu_epi32(0x00FF, xb), _mm512_maskz_loadu_ps(0x00FF, xd))
            };
            for r in 0..NR {
                let dot = _mm512_dpbusd_epi32(bias, wv[r], xv);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw[r], dx), acc[r][t]);
            }
        }
        i += 2;
    }
    for r in 0..NR {
        for t in 0..NT {
            *out.add(t * ldo + r) = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}
