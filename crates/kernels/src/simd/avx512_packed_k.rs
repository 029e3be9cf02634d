//! AVX-512 VNNI kernel over Q4_K [`Packed`] weights (layout: `repack_k.rs`, the one
//! `avx2_packed_k.rs` streams): 8 rows × up to 8 tokens per call. (Q6_K stays on
//! `avx2_packed_k`: a VNNI version — `vpdpbusd` on the 6-bit values, a `vpmulld` per sub-block
//! for the scale, since 8 products pass i16 — measured 0.93× / 1.03× / 0.86× of it at 1 / 4 / 8
//! tokens on Zen 4, `benches/packed.rs`, and was not kept.)
//!
//! A register's nibbles are unpacked once per group-super-block and shared by the call's tokens; per token, one `vpdpbusd` per register against the
//! activation's 8 bytes broadcast sums 4 products straight into i32 (2 dwords per row of the
//! register's 4), replacing the AVX2 kernel's `vpmaddubsw` and i16 add. The sub-block scale is
//! then applied per token and sub-block by one `vpmaddwd` (a dword sums 16 products,
//! |Σ| ≤ 16·15·128 = 30,720, so it is exact as an i16 and the scale sits in the dword's low
//! word, 0 in the high word). The mins and the float term are the AVX2 kernel's.
//!
//! Invariant: per (row, token, super-block) the exact integers of the scalar reference, then
//! its float term `acc += (d·d_x)·isum − (dmin·d_x)·msum`, super-blocks in order, `acc` from
//! +0.0, no fused multiply-add: bitwise the scalar path's and `avx2_packed_k`'s result, for any
//! number of tokens in the call.

use super::prefetch::group_block_ahead;
use super::TileCtx;
use crate::blocks::QK_K;
use crate::dtype::DType;
use crate::quantize::ActQ8K;
use crate::repack::{group_block_bytes, Packed, GROUP_ROWS};
use crate::repack_k::{Q4K_P_MIN, Q4K_P_QS, Q4K_P_SC};
use std::arch::x86_64::*;

/// Largest token tile of one call.
pub(crate) const MAX_TOKENS: usize = 8;

/// Computes output rows `r0..r1` (multiples of 8) for every token of the call.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and AVX2/FMA/F16C available; `p` is the (Q4_K or Q6_K) packing of
/// `c.w`, `a` its prepared activations; no other thread writes those rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn run_rows(c: &TileCtx, a: &ActQ8K, p: &Packed, r0: usize, r1: usize, n_tokens: usize) {
    debug_assert!(r0 % GROUP_ROWS == 0 && r1 % GROUP_ROWS == 0);
    if p.dtype() == DType::Q6K {
        return super::avx2_packed_k::run_rows(c, a, p, r0, r1, n_tokens);
    }
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = MAX_TOKENS.min(n_tokens - t0);
        for g in r0 / GROUP_ROWS..r1 / GROUP_ROWS {
            let gp = p.group(g).as_ptr();
            let out = c.out.add(t0 * c.ldo + g * GROUP_ROWS);
            macro_rules! by_nt {
                ($f:ident) => {
                    match nt {
                        1 => $f::<1>(gp, a, t0, out, c.ldo),
                        2 => $f::<2>(gp, a, t0, out, c.ldo),
                        3 => $f::<3>(gp, a, t0, out, c.ldo),
                        4 => $f::<4>(gp, a, t0, out, c.ldo),
                        5 => $f::<5>(gp, a, t0, out, c.ldo),
                        6 => $f::<6>(gp, a, t0, out, c.ldo),
                        7 => $f::<7>(gp, a, t0, out, c.ldo),
                        _ => $f::<8>(gp, a, t0, out, c.ldo),
                    }
                };
            }
            match p.dtype() {
                DType::Q4K => by_nt!(q4k_group),
                _ => unreachable!("only Q4_K reaches this kernel (Q6_K runs avx2_packed_k)"),
            }
        }
        t0 += nt;
    }
}

/// `vpshufb` control turning a scale-pair vector (dword `r` = row `r`'s pair, rows 0..4 in the
/// low lane, 4..8 in the high) into half `h`'s per-row scale of the pair's sub-block `s`:
/// i16 words 0..4 = the lane's row `2h`, words 4..8 = row `2h + 1` (as `avx2_packed_k`).
#[inline(always)]
unsafe fn scale_ctrl(h: usize, s: usize) -> __m256i {
    let b0 = (8 * h + 2 * s) as i8;
    let b1 = b0 + 4;
    let lane = _mm_setr_epi8(b0, b0 + 1, b0, b0 + 1, b0, b0 + 1, b0, b0 + 1, b1, b1 + 1, b1, b1 + 1, b1, b1 + 1, b1, b1 + 1);
    _mm256_broadcastsi128_si256(lane)
}

/// 8 activation bytes at `p` in all four 64-bit lanes.
#[inline(always)]
unsafe fn bcast8(p: *const i8) -> __m256i {
    _mm256_set1_epi64x((p as *const i64).read_unaligned())
}

/// Q4_K, one 8-row group, NT tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_group<const NT: usize>(gp: *const u8, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(DType::Q4K);
    let m4 = _mm256_set1_epi8(0x0F);
    let lo16 = _mm256_set1_epi32(0xFFFF);
    let ones = _mm256_set1_epi16(1);
    let ctrl = [[scale_ctrl(0, 0), scale_ctrl(0, 1)], [scale_ctrl(1, 0), scale_ctrl(1, 1)]];
    // The (S_2p, S_2p+1) dword of the packed block sums, for pair p.
    let pair_idx = [0, 1, 4, 5];
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if NT > 1 && t0 == 0 {
            group_block_ahead(b, gbb);
        }
        let mut isum = [[_mm256_setzero_si256(); 2]; NT];
        let mut msum = [_mm256_setzero_si256(); NT];
        let mut s16 = [_mm256_setzero_si256(); NT];
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            // S_j = bsum[2j] + bsum[2j+1] (sub-block j's 32 values, |S_j| ≤ 4064 fits i16).
            let s32 = _mm256_madd_epi16(_mm256_loadu_si256(a.bsums.as_ptr().add(ab * 16) as *const __m256i), ones);
            s16[t] = _mm256_packs_epi32(s32, s32);
        }
        for c in 0..4 {
            let sc = _mm256_cvtepu8_epi16(_mm_loadu_si128(b.add(Q4K_P_SC + 16 * c) as *const __m128i));
            let mn = _mm256_cvtepu8_epi16(_mm_loadu_si128(b.add(Q4K_P_MIN + 16 * c) as *const __m128i));
            for t in 0..NT {
                let sp = _mm256_permutevar8x32_epi32(s16[t], _mm256_set1_epi32(pair_idx[c]));
                msum[t] = _mm256_add_epi32(msum[t], _mm256_madd_epi16(mn, sp));
            }
            for h in 0..2 {
                let mut lo = [_mm256_setzero_si256(); 4];
                let mut hi = [_mm256_setzero_si256(); 4];
                for m in 0..4 {
                    let w = _mm256_loadu_si256(b.add(Q4K_P_QS + 32 * (8 * c + 4 * h + m)) as *const __m256i);
                    lo[m] = _mm256_and_si256(w, m4);
                    hi[m] = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
                }
                // Each row's scale in the low word of both its dwords, 0 in the high word.
                let slo = _mm256_and_si256(_mm256_shuffle_epi8(sc, ctrl[h][0]), lo16);
                let shi = _mm256_and_si256(_mm256_shuffle_epi8(sc, ctrl[h][1]), lo16);
                for t in 0..NT {
                    let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K + 64 * c);
                    let mut plo = _mm256_setzero_si256();
                    let mut phi = _mm256_setzero_si256();
                    for m in 0..4 {
                        plo = _mm256_dpbusd_epi32(plo, lo[m], bcast8(xp.add(8 * m)));
                        phi = _mm256_dpbusd_epi32(phi, hi[m], bcast8(xp.add(32 + 8 * m)));
                    }
                    let s = _mm256_add_epi32(_mm256_madd_epi16(plo, slo), _mm256_madd_epi16(phi, shi));
                    isum[t][h] = _mm256_add_epi32(isum[t][h], s);
                }
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(b.add(16) as *const __m128i));
        for t in 0..NT {
            let dx = _mm256_set1_ps(*a.d.get_unchecked((t0 + t) * nb + i));
            let x1 = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(_mm256_hadd_epi32(isum[t][0], isum[t][1])));
            let x2 = _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(msum[t]));
            acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(x1, x2));
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}
