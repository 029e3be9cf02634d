//! AVX-512 VNNI tile kernels of the 32-element formats beyond Q4_0/Q8_0 (Q4_1, Q5_0, Q5_1,
//! IQ4_NL, MXFP4), shaped like `avx512::q8_tile`: two blocks per 512-bit register, one
//! `vpdpbusd(bias, u, x)` per block pair and token, where `u` are the weights made unsigned
//! (Q4_1 / Q5_1 / Q5_0 values as they are, table values + 128) and `bias` the activation
//! block's precomputed `−k·Σx` (k = 0, 16 or 128 to match), so each block's integer sum is
//! exact. Then `fma(f32(lanes), d_w·d_x)` and, for Q4_1 / Q5_1, `fma(m, [s, 0, …])` per block
//! pair. Lanes 0–7 belong to the first block, 8–15 to the second; an odd last block is
//! zero-padded by masked loads.
//!
//! Invariant (see `simd/mod.rs`): the per-accumulator sequence does not depend on the tile.

use super::avx2_q32::table;
use super::avx2_q32::{decode, scale, IQ4NL, MXFP4, Q4_1, Q5_0, Q5_1};
use crate::blocks::*;
use crate::quantize::ActQ8;
use std::arch::x86_64::*;

/// Dispatches an `nr × nt` tile (each 1..=4) of the format tagged `k` (`avx2_q32` tags).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn tile_dispatch(k: u8, nr: usize, nt: usize, w: *const u8, rb: usize, a: &ActQ8, t0: usize, out: *mut f32, ldo: usize) {
    match k {
        Q4_1 => super::tile_dispatch!(nr, nt, tile[Q4_1](w, rb, a, t0, out, ldo)),
        Q5_0 => super::tile_dispatch!(nr, nt, tile[Q5_0](w, rb, a, t0, out, ldo)),
        Q5_1 => super::tile_dispatch!(nr, nt, tile[Q5_1](w, rb, a, t0, out, ldo)),
        IQ4NL => super::tile_dispatch!(nr, nt, tile[IQ4NL](w, rb, a, t0, out, ldo)),
        _ => super::tile_dispatch!(nr, nt, tile[MXFP4](w, rb, a, t0, out, ldo)),
    }
}

/// Block `b`'s 32 values made unsigned for `vpdpbusd`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn block_u8<const K: u8>(b: *const u8, lut: __m256i) -> __m256i {
    let v = decode::<K>(b, lut);
    if K == IQ4NL || K == MXFP4 {
        _mm256_xor_si256(v, _mm256_set1_epi8(-128))
    } else {
        v
    }
}

/// `[a; 8] ++ [b; 8]` from two 8-lane vectors.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn join(a: __m256, b: __m256) -> __m512 {
    _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(a)), _mm256_castps_pd(b), 1))
}

/// Blocks `b0` and `b0 + bb` decoded together: their 64 values made unsigned (block 0 in bytes
/// 0..32), their scales `[d0; 8] ++ [d1; 8]` and (Q4_1 / Q5_1) mins `[m0; 8] ++ [m1; 8]`. The
/// same values as [`block_u8`] / `avx2_q32::scale` per block, in fewer instructions: one
/// two-block nibble split, the fifth bits as a 64-bit mask, one f16 conversion for all scales.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pair<const K: u8>(b0: *const u8, bb: usize, lut: __m512i) -> (__m512i, __m512, __m512) {
    let b1 = b0.add(bb);
    let qs = match K {
        Q4_1 => Q4_1_QS,
        Q5_0 => Q5_0_QS,
        Q5_1 => Q5_1_QS,
        IQ4NL => 2,
        _ => 1,
    };
    let v = _mm256_loadu2_m128i(b1.add(qs) as *const __m128i, b0.add(qs) as *const __m128i);
    // [q0, q1, q0 >> 4, q1 >> 4] → [q0, q0 >> 4, q1, q1 >> 4] (128-bit lanes), low nibbles.
    let z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    let z = _mm512_and_si512(_mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 4, 5, 2, 3, 6, 7), z), _mm512_set1_epi8(0x0F));
    let u = match K {
        Q5_0 | Q5_1 => {
            let qh = if K == Q5_0 { Q5_0_QH } else { Q5_1_QH };
            let bits = (b0.add(qh) as *const u32).read_unaligned() as u64 | ((b1.add(qh) as *const u32).read_unaligned() as u64) << 32;
            _mm512_or_si512(z, _mm512_maskz_mov_epi8(bits, _mm512_set1_epi8(0x10)))
        }
        IQ4NL | MXFP4 => _mm512_shuffle_epi8(lut, z),
        _ => z,
    };
    let zero = _mm512_setzero_ps();
    if K == MXFP4 {
        let d = join(_mm256_set1_ps(e8m0_half(*b0)), _mm256_set1_ps(e8m0_half(*b1)));
        return (u, d, zero);
    }
    // f16 words [d0, m0, d1, m1] (m only read for Q4_1 / Q5_1) → f32, then spread.
    let w0 = (b0 as *const i32).read_unaligned();
    let w1 = (b1 as *const i32).read_unaligned();
    let f = _mm512_castps128_ps512(_mm_cvtph_ps(_mm_set_epi32(0, 0, w1, w0)));
    let d = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2), f);
    let m = if K == Q4_1 || K == Q5_1 {
        _mm512_permutexvar_ps(_mm512_setr_epi32(1, 1, 1, 1, 1, 1, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3), f)
    } else {
        zero
    };
    (u, d, m)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const K: u8, const NR: usize, const NT: usize>(w: *const u8, rb: usize, a: &ActQ8, t0: usize, out: *mut f32, ldo: usize) {
    let l8 = a.lanes8();
    let bb = match K {
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        IQ4NL => 18,
        _ => 17,
    };
    let has_min = K == Q4_1 || K == Q5_1;
    let values = if K == IQ4NL { &KVALUES_IQ4NL } else { &KVALUES_MXFP4 };
    let (lut, lut2) = (table(values), super::avx512::table_plus_128(values));
    let nb = a.blocks_per_row;
    let zero8 = _mm256_setzero_ps();
    let mut acc = [[_mm512_setzero_ps(); NT]; NR];
    let mut i = 0;
    while i < nb {
        let two = i + 1 < nb;
        let mut wv = [_mm512_setzero_si512(); NR];
        let mut dw = [_mm512_setzero_ps(); NR];
        let mut mw = [_mm512_setzero_ps(); NR];
        for r in 0..NR {
            let b0 = w.add(r * rb + i * bb);
            if two {
                (wv[r], dw[r], mw[r]) = pair::<K>(b0, bb, lut2);
            } else {
                wv[r] = _mm512_inserti64x4(_mm512_castsi256_si512(block_u8::<K>(b0, lut)), _mm256_setzero_si256(), 1);
                dw[r] = join(scale::<K>(b0), zero8);
                if has_min {
                    mw[r] = join(super::avx2::f16_bcast(b0.add(2)), zero8);
                }
            }
        }
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            let (xq, xb, xd, xs) =
                (a.qs.as_ptr().add(ab * QK), l8.bias.as_ptr().add(ab * 8), l8.dv.as_ptr().add(ab * 8), l8.sv.as_ptr().add(ab * 8));
            let (xv, bias, dx, sx) = if two {
                (
                    _mm512_loadu_si512(xq as *const __m512i),
                    _mm512_loadu_si512(xb as *const __m512i),
                    _mm512_loadu_ps(xd),
                    _mm512_loadu_ps(xs),
                )
            } else {
                (
                    _mm512_maskz_loadu_epi8(0xFFFF_FFFF, xq),
                    _mm512_maskz_loadu_epi32(0x00FF, xb),
                    _mm512_maskz_loadu_ps(0x00FF, xd),
                    _mm512_maskz_loadu_ps(0x00FF, xs),
                )
            };
            for r in 0..NR {
                let dot = _mm512_dpbusd_epi32(bias, wv[r], xv);
                acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dw[r], dx), acc[r][t]);
                if has_min {
                    acc[r][t] = _mm512_fmadd_ps(mw[r], sx, acc[r][t]);
                }
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
