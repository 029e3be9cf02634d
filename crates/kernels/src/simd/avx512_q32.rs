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

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const K: u8, const NR: usize, const NT: usize>(w: *const u8, rb: usize, a: &ActQ8, t0: usize, out: *mut f32, ldo: usize) {
    let bb = match K {
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        IQ4NL => 18,
        _ => 17,
    };
    let has_min = K == Q4_1 || K == Q5_1;
    let lut = if K == IQ4NL { table(&KVALUES_IQ4NL) } else { table(&KVALUES_MXFP4) };
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
            let lo = _mm512_castsi256_si512(block_u8::<K>(b0, lut));
            if two {
                let b1 = b0.add(bb);
                wv[r] = _mm512_inserti64x4(lo, block_u8::<K>(b1, lut), 1);
                dw[r] = join(scale::<K>(b0), scale::<K>(b1));
                if has_min {
                    mw[r] = join(super::avx2::f16_bcast(b0.add(2)), super::avx2::f16_bcast(b1.add(2)));
                }
            } else {
                wv[r] = _mm512_inserti64x4(lo, _mm256_setzero_si256(), 1);
                dw[r] = join(scale::<K>(b0), zero8);
                if has_min {
                    mw[r] = join(super::avx2::f16_bcast(b0.add(2)), zero8);
                }
            }
        }
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            let (xq, xb, xd, xs) =
                (a.qs.as_ptr().add(ab * QK), a.bias.as_ptr().add(ab * 8), a.dv.as_ptr().add(ab * 8), a.sv.as_ptr().add(ab * 8));
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
