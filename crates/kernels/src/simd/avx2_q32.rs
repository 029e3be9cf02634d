//! AVX2 tile kernels of the 32-element formats beyond Q4_0/Q8_0: Q4_1, Q5_0, Q5_1, IQ4_NL and
//! MXFP4, against Q8_0-style activations ([`ActQ8`]) as llama.cpp's `ggml_vec_dot_*` pair them
//! (its Q8_1 for Q4_1 / Q5_1 is our `ActQ8` with the block sums `s`).
//!
//! Each weight block is decoded once per tile into 32 bytes in element order ([`decode`]):
//! * unsigned values (Q4_1 nibbles 0..16; Q5_0 / Q5_1 five-bit values 0..32, the fifth bits
//!   spread from `qh` with ggml's `bytes_from_bits_32` trick): `vpmaddubsw(q, x)` is exact
//!   (|31·127·2| < 2^15); Q5_0's `−16·Σx` comes as the activation bias (prepared with k = 16);
//! * table values (IQ4_NL −127..113, MXFP4 −12..12, looked up by `vpshufb`): signed × signed
//!   by the sign trick `vpmaddubsw(|w|, sign(x, w))` (|127·127·2| < 2^15).
//!
//! The integer block sum is exact, so every lane sum equals the scalar reference's; each block
//! then adds `fma(f32(lanes), d_w·d_x)` (and Q4_1 / Q5_1 the min term `m · s` in lane 0) to the
//! (row, token) accumulator. Invariant (see `simd/mod.rs`): that per-accumulator sequence does
//! not depend on the tile's shape, so results are bitwise independent of the token count.

use super::avx2::{f16_bcast, hsum};
use crate::blocks::*;
use crate::dtype::DType;
use crate::quantize::ActQ8;
use std::arch::x86_64::*;

/// Format tags for the const-generic kernel.
pub(crate) const Q4_1: u8 = 0;
/// Q5_0 tag.
pub(crate) const Q5_0: u8 = 1;
/// Q5_1 tag.
pub(crate) const Q5_1: u8 = 2;
/// IQ4_NL tag.
pub(crate) const IQ4NL: u8 = 3;
/// MXFP4 tag.
pub(crate) const MXFP4: u8 = 4;

/// The tag of a format this module handles.
pub(crate) fn tag(d: DType) -> Option<u8> {
    Some(match d {
        DType::Q4_1 => Q4_1,
        DType::Q5_0 => Q5_0,
        DType::Q5_1 => Q5_1,
        DType::IQ4NL => IQ4NL,
        DType::MXFP4 => MXFP4,
        _ => return None,
    })
}

/// 32 nibbles of `qs[..16]` in element order (low nibbles, then high nibbles).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn nibbles(qs: *const u8) -> __m256i {
    let v = _mm_loadu_si128(qs as *const __m128i);
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F))
}

/// Byte `j` = 0x10 where bit `j` of the little-endian u32 at `p` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn fifth_bits(p: *const u8) -> __m256i {
    let x32 = (p as *const i32).read_unaligned();
    let shuf = _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32), shuf);
    let bit_mask = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    let set = _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit_mask), _mm256_set1_epi64x(-1));
    _mm256_and_si256(set, _mm256_set1_epi8(0x10))
}

/// A 16-entry `i8` table in both 128-bit lanes, for `vpshufb` lookups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn table(t: &[i8; 16]) -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i))
}

/// Block `b`'s 32 values in element order (unsigned for Q4_1/Q5_*, signed for the tables).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn decode<const K: u8>(b: *const u8, lut: __m256i) -> __m256i {
    match K {
        Q4_1 => nibbles(b.add(Q4_1_QS)),
        Q5_0 => _mm256_or_si256(nibbles(b.add(Q5_0_QS)), fifth_bits(b.add(Q5_0_QH))),
        Q5_1 => _mm256_or_si256(nibbles(b.add(Q5_1_QS)), fifth_bits(b.add(Q5_1_QH))),
        IQ4NL => _mm256_shuffle_epi8(lut, nibbles(b.add(2))),
        _ => _mm256_shuffle_epi8(lut, nibbles(b.add(1))),
    }
}

/// Block `b`'s scale `d` in all 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scale<const K: u8>(b: *const u8) -> __m256 {
    if K == MXFP4 {
        _mm256_set1_ps(e8m0_half(*b))
    } else {
        f16_bcast(b)
    }
}

/// The 8 exact i32 partial sums of block values `w` (from [`decode`]) times activations `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot32<const SIGNED: bool>(w: __m256i, x: __m256i) -> __m256i {
    let p = if SIGNED { _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)) } else { _mm256_maddubs_epi16(w, x) };
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Dispatches an `nr × nt` tile (each 1..=4) of a format tagged `k`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile_dispatch(k: u8, nr: usize, nt: usize, w: *const u8, rb: usize, a: &ActQ8, t0: usize, out: *mut f32, ldo: usize) {
    match k {
        Q4_1 => super::tile_dispatch!(nr, nt, tile[Q4_1](w, rb, a, t0, out, ldo)),
        Q5_0 => super::tile_dispatch!(nr, nt, tile[Q5_0](w, rb, a, t0, out, ldo)),
        Q5_1 => super::tile_dispatch!(nr, nt, tile[Q5_1](w, rb, a, t0, out, ldo)),
        IQ4NL => super::tile_dispatch!(nr, nt, tile[IQ4NL](w, rb, a, t0, out, ldo)),
        _ => super::tile_dispatch!(nr, nt, tile[MXFP4](w, rb, a, t0, out, ldo)),
    }
}

/// `NR` rows × `NT` tokens of format `K` against Q8 activations.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const K: u8, const NR: usize, const NT: usize>(w: *const u8, rb: usize, a: &ActQ8, t0: usize, out: *mut f32, ldo: usize) {
    let l8 = a.lanes8();
    let bb = match K {
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        IQ4NL => 18,
        _ => 17,
    };
    let signed = K == IQ4NL || K == MXFP4;
    let has_min = K == Q4_1 || K == Q5_1;
    let lut = if K == IQ4NL { table(&KVALUES_IQ4NL) } else { table(&KVALUES_MXFP4) };
    let nb = a.blocks_per_row;
    let zero = _mm256_setzero_ps();
    let mut acc = [[zero; NT]; NR];
    for i in 0..nb {
        let mut wv = [_mm256_setzero_si256(); NR];
        let mut dw = [zero; NR];
        let mut mw = [zero; NR];
        for r in 0..NR {
            let b = w.add(r * rb + i * bb);
            wv[r] = decode::<K>(b, lut);
            dw[r] = scale::<K>(b);
            if has_min {
                mw[r] = f16_bcast(b.add(2));
            }
        }
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            let xv = _mm256_loadu_si256(a.qs.as_ptr().add(ab * QK) as *const __m256i);
            let dx = _mm256_loadu_ps(l8.dv.as_ptr().add(ab * 8));
            // Lane 0 = s (the activation block's d·Σq), other lanes 0.
            let sx = if has_min { _mm256_blend_ps::<1>(zero, _mm256_set1_ps(*a.s.get_unchecked(ab))) } else { zero };
            let bias = if K == Q5_0 { _mm256_loadu_si256(l8.bias.as_ptr().add(ab * 8) as *const __m256i) } else { _mm256_setzero_si256() };
            for r in 0..NR {
                let mut dot = if signed { dot32::<true>(wv[r], xv) } else { dot32::<false>(wv[r], xv) };
                if K == Q5_0 {
                    dot = _mm256_add_epi32(dot, bias);
                }
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw[r], dx), acc[r][t]);
                if has_min {
                    acc[r][t] = _mm256_fmadd_ps(mw[r], sx, acc[r][t]);
                }
            }
        }
    }
    for r in 0..NR {
        for t in 0..NT {
            *out.add(t * ldo + r) = hsum(acc[r][t]);
        }
    }
}
