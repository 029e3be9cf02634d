//! AVX2 + FMA + F16C kernels (8 f32 lanes, 16 registers).
//!
//! * Float weights: each step converts 8 weights per row once (`vcvtph2ps` for F16, a 16-bit
//!   shift for BF16) and FMAs them into an `NR × NT` grid of accumulators. One-token F16
//!   tiles (decode) prefetch the next tile's rows.
//! * Q4_0: nibbles are unsigned (0..15), so `vpmaddubsw(q, x)` gives exact i16 pair sums
//!   (|15·127·2| < 2^15); the `−8·Σx` offset comes from the precomputed activation bias.
//! * Q8_0: signed × signed via the sign trick `vpmaddubsw(|w|, sign(x, w))` (|128·127·2| < 2^15).
//! * Q4_K / Q6_K: `vpmaddubsw` on the 4-/6-bit values, then `vpmaddwd` with the sub-block
//!   scales, integer accumulation over the super-block, one FMA per super-block; the min /
//!   −32 offset terms are one `vpmaddwd` of the Q8_K block sums with the mins / scales.
//!
//! * Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4: `avx2_q32`; Q5_K, Q3_K, Q2_K, IQ4_XS: `avx2_k`.
//!
//! Invariant: see `simd/mod.rs` — per-accumulator operation order is independent of the tile.

use super::{tile_dispatch, Acts, TileCtx};
use crate::blocks::*;
use crate::dtype::DType;
use std::arch::x86_64::*;

/// Dispatches a tile to the kernel for the weight format.
#[target_feature(enable = "avx2,fma,f16c")]
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
        (DType::Q4K, Acts::Q8K(a)) => {
            for r in 0..nr {
                ktile_dispatch(nt, false, wp.add(r * rb), rb, a, t0, out.add(r), c.ldo)
            }
        }
        (DType::Q6K, Acts::Q8K(a)) => {
            for r in 0..nr {
                ktile_dispatch(nt, true, wp.add(r * rb), rb, a, t0, out.add(r), c.ldo)
            }
        }
        (d, Acts::Q8(a)) if super::avx2_q32::tag(d).is_some() => {
            let k = super::avx2_q32::tag(d).unwrap_or_default();
            super::avx2_q32::tile_dispatch(k, nr, nt, wp, rb, a, t0, out, c.ldo)
        }
        (d, Acts::Q8K(a)) if super::avx2_k::handles(d) => super::avx2_k::rows_tile(d, nr, nt, wp, rb, a, t0, out, c.ldo),
        _ => unreachable!("activations prepared for the wrong dtype"),
    }
}

/// K-quant tiles are one row × up to 4 tokens (the decoded super-block needs 8 registers).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn ktile_dispatch(
    nt: usize,
    q6: bool,
    w: *const u8,
    rb: usize,
    a: &crate::quantize::ActQ8K,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    match (q6, nt) {
        (false, 1) => q4k_tile::<1>(w, rb, a, t0, out, ldo),
        (false, 2) => q4k_tile::<2>(w, rb, a, t0, out, ldo),
        (false, 3) => q4k_tile::<3>(w, rb, a, t0, out, ldo),
        (false, 4) => q4k_tile::<4>(w, rb, a, t0, out, ldo),
        (true, 1) => q6k_tile::<1>(w, rb, a, t0, out, ldo),
        (true, 2) => q6k_tile::<2>(w, rb, a, t0, out, ldo),
        (true, 3) => q6k_tile::<3>(w, rb, a, t0, out, ldo),
        (true, 4) => q6k_tile::<4>(w, rb, a, t0, out, ldo),
        _ => unreachable!(),
    }
}

/// Horizontal sum of 8 lanes in a fixed order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Exact wrapping sum of 8 i32 lanes (integer, so the order does not matter).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01));
    _mm_cvtsi128_si32(s)
}

/// f16 bits at `p` (unaligned) → f32, using F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_load(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// The f16 at `p` (unaligned) → f32 in all 8 lanes: one broadcast load and one conversion
/// (the same value as `_mm256_set1_ps(f16_load(p))`, in two instructions instead of four).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_bcast(p: *const u8) -> __m256 {
    _mm256_cvtph_ps(_mm_set1_epi16((p as *const i16).read_unaligned()))
}

/// 8 weights at element `i` of a row of kind K (0 = f32, 1 = f16, 2 = bf16) as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8<const K: u8>(p: *const u8, i: usize) -> __m256 {
    match K {
        0 => _mm256_loadu_ps(p.add(4 * i) as *const f32),
        1 => _mm256_cvtph_ps(_mm_loadu_si128(p.add(2 * i) as *const __m128i)),
        _ => _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.add(2 * i) as *const __m128i)), 16)),
    }
}

/// One weight at element `i` as f32 (row tails).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load1<const K: u8>(p: *const u8, i: usize) -> f32 {
    match K {
        0 => (p.add(4 * i) as *const f32).read_unaligned(),
        1 => f16_load(p.add(2 * i)),
        _ => f32::from_bits(((p.add(2 * i) as *const u16).read_unaligned() as u32) << 16),
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn float_tile<const K: u8, const NR: usize, const NT: usize>(
    w: *const u8,
    rb: usize,
    x: *const f32,
    cols: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); NT]; NR];
    let n8 = cols / 8 * 8;
    let mut i = 0;
    while i < n8 {
        let mut wv = [_mm256_setzero_ps(); NR];
        for r in 0..NR {
            wv[r] = load8::<K>(w.add(r * rb), i);
        }
        // One-token F16 calls (decode): ask L2 for the next tile's rows at this column, as
        // `avx512::float_tile` does (the hardware prefetchers start over on every 4 KiB page).
        if K == 1 && NT == 1 && i % 32 == 0 {
            for r in 0..NR {
                _mm_prefetch::<_MM_HINT_T1>(w.wrapping_add((NR + r) * rb + 2 * i) as *const i8);
            }
        }
        for t in 0..NT {
            let xv = _mm256_loadu_ps(x.add(t * cols + i));
            for r in 0..NR {
                acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
        i += 8;
    }
    for r in 0..NR {
        for t in 0..NT {
            let mut s = hsum(acc[r][t]);
            for j in n8..cols {
                s += load1::<K>(w.add(r * rb), j) * *x.add(t * cols + j);
            }
            *out.add(t * ldo + r) = s;
        }
    }
}

/// Q4_0 (`Q4 = true`) or Q8_0 weights × Q8 activations.
#[target_feature(enable = "avx2,fma,f16c")]
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
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let nib_shift = _mm256_set_epi64x(4, 4, 0, 0);
    let mut acc = [[_mm256_setzero_ps(); NT]; NR];
    for i in 0..nb {
        let mut wv = [_mm256_setzero_si256(); NR];
        let mut dw = [_mm256_setzero_ps(); NR];
        for r in 0..NR {
            let b = w.add(r * rb + i * bb);
            dw[r] = f16_bcast(b);
            wv[r] = if Q4 {
                // Both lanes hold the 16 bytes; the high lane shifted right by 4 (per 64-bit
                // word: the bits crossing bytes are masked off either way) = the high nibbles.
                let v = _mm256_broadcastsi128_si256(_mm_loadu_si128(b.add(2) as *const __m128i));
                _mm256_and_si256(_mm256_srlv_epi64(v, nib_shift), m4)
            } else {
                _mm256_loadu_si256(b.add(2) as *const __m256i)
            };
        }
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            let xv = _mm256_loadu_si256(a.qs.as_ptr().add(ab * QK) as *const __m256i);
            let dx = _mm256_loadu_ps(l8.dv.as_ptr().add(ab * 8));
            let bias = _mm256_loadu_si256(l8.bias.as_ptr().add(ab * 8) as *const __m256i);
            for r in 0..NR {
                let dot = if Q4 {
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[r], xv), ones);
                    _mm256_add_epi32(p, bias)
                } else {
                    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(wv[r], wv[r]), _mm256_sign_epi8(xv, wv[r]));
                    _mm256_madd_epi16(p, ones)
                };
                acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(dw[r], dx), acc[r][t]);
            }
        }
    }
    for r in 0..NR {
        for t in 0..NT {
            *out.add(t * ldo + r) = hsum(acc[r][t]);
        }
    }
}

/// Q4_K × Q8_K, one row, NT tokens.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_tile<const NT: usize>(w: *const u8, _rb: usize, a: &crate::quantize::ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = [_mm256_setzero_ps(); NT];
    let mut macc = [0f32; NT];
    for i in 0..nb {
        let b = w.add(i * 144);
        let d = f16_load(b);
        let dmin = f16_load(b.add(2));
        let (sc, m) = scales_mins_k4(std::slice::from_raw_parts(b.add(Q4K_SCALES), 12));
        // Σ_j m_j·(bsum[2j] + bsum[2j+1]) as one `vpmaddwd`: m_j repeated in i16 lanes 2j, 2j+1.
        let m8 = _mm_loadl_epi64(m.as_ptr() as *const __m128i);
        let mv = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
        let mut q = [_mm256_setzero_si256(); 8];
        for c in 0..4 {
            let v = _mm256_loadu_si256(b.add(Q4K_QS + 32 * c) as *const __m256i);
            q[2 * c] = _mm256_and_si256(v, m4);
            q[2 * c + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
        }
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            let xp = a.qs.as_ptr().add(ab * QK_K);
            let mut isum = _mm256_setzero_si256();
            for j in 0..8 {
                let xv = _mm256_loadu_si256(xp.add(32 * j) as *const __m256i);
                let p = _mm256_maddubs_epi16(q[j], xv);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_set1_epi16(sc[j] as i16)));
            }
            let bs = _mm256_loadu_si256(a.bsums.as_ptr().add(ab * 16) as *const __m256i);
            let msum = hsum_i32(_mm256_madd_epi16(bs, mv));
            let dx = *a.d.get_unchecked(ab);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d * dx), acc[t]);
            macc[t] += dmin * dx * msum as f32;
        }
    }
    for t in 0..NT {
        *out.add(t * ldo) = hsum(acc[t]) - macc[t];
    }
}

/// Q6_K × Q8_K, one row, NT tokens.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_tile<const NT: usize>(w: *const u8, _rb: usize, a: &crate::quantize::ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    // `vpshufb` controls picking byte 2g (low lane) / 2g+1 (high lane) into both bytes of every i16.
    let mut sctrl = [_mm256_setzero_si256(); 8];
    for g in 0..8 {
        sctrl[g] = _mm256_set_m128i(_mm_set1_epi8(2 * g as i8 + 1), _mm_set1_epi8(2 * g as i8));
    }
    let mut acc = [_mm256_setzero_ps(); NT];
    let mut macc = [0f32; NT];
    for i in 0..nb {
        let b = w.add(i * 210);
        let d = f16_load(b.add(Q6K_D));
        let sc = std::slice::from_raw_parts(b.add(Q6K_SCALES) as *const i8, 16);
        // q[g] holds elements 32g..32g+32 (sub-blocks 2g, 2g+1) as unsigned 0..63.
        let mut q = [_mm256_setzero_si256(); 8];
        let mut s = [_mm256_setzero_si256(); 8];
        for h in 0..2 {
            let ql0 = _mm256_loadu_si256(b.add(64 * h) as *const __m256i);
            let ql1 = _mm256_loadu_si256(b.add(64 * h + 32) as *const __m256i);
            let qh = _mm256_loadu_si256(b.add(Q6K_QH + 32 * h) as *const __m256i);
            q[4 * h] = _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30));
            q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(ql1, m4), _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30));
            q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4), _mm256_and_si256(qh, m30));
            q[4 * h + 3] =
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
        }
        // The 16 sub-block scales as i16, for Σ_j sc_j·bsum_j in one `vpmaddwd`.
        let sc8 = _mm_loadu_si128(sc.as_ptr() as *const __m128i);
        let scv = _mm256_cvtepi8_epi16(sc8);
        // s[g]: sc[2g] in the low lane's i16s, sc[2g+1] in the high lane's: each byte doubled
        // into an i16 by `vpshufb`, then sign-extended by an arithmetic shift.
        let sc2 = _mm256_broadcastsi128_si256(sc8);
        for g in 0..8 {
            s[g] = _mm256_srai_epi16(_mm256_shuffle_epi8(sc2, sctrl[g]), 8);
        }
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            let xp = a.qs.as_ptr().add(ab * QK_K);
            let mut isum = _mm256_setzero_si256();
            for g in 0..8 {
                let xv = _mm256_loadu_si256(xp.add(32 * g) as *const __m256i);
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(_mm256_maddubs_epi16(q[g], xv), s[g]));
            }
            let bs = _mm256_loadu_si256(a.bsums.as_ptr().add(ab * 16) as *const __m256i);
            let corr = hsum_i32(_mm256_madd_epi16(bs, scv));
            let dd = d * *a.d.get_unchecked(ab);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(dd), acc[t]);
            macc[t] += dd * (32 * corr) as f32;
        }
    }
    for t in 0..NT {
        *out.add(t * ldo) = hsum(acc[t]) - macc[t];
    }
}
