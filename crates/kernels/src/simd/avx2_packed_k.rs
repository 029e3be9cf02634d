//! AVX2 kernels over Q4_K / Q5_K / Q6_K / Q3_K / IQ4_XS / Q2_K [`Packed`] weights (layout: `repack_k.rs`):
//! 8 rows × up to 4 tokens per call. IQ4_XS and Q2_K keep the 32-element formats' one row per
//! 32-bit lane (`iq4xs_group`, `q2k_group`); Q3_K ([`q3k_group`]) runs in Q4_K's halves; Q4_K /
//! Q5_K / Q6_K are described here.
//!
//! Per 32-byte register (8 bytes of 4 rows): the nibbles split with one mask and one shift
//! (Q5_K: each nibble's fifth bit placed at bit 4 by a shift and a table lookup, [`k_values`];
//! Q6_K: the two high bits placed by a mask and, for two of the four bit pairs, a table
//! lookup of the high-bit byte's low nibble, for the other two a shift), `vpmaddubsw` against
//! the activation's 8 bytes broadcast, i16 sums of a sub-block's pieces added (exact: Q4_K
//! 4 · 2·15·127, Q5_K 4 · 2·31·128, Q6_K 2 · 2·63·127, all < 2^15), then one `vpmaddwd` with the sub-block's
//! scales for the 4 rows — built by one `vpshufb` from the unpacked scale pairs, no per-block
//! scale decoding. After a super-block, one `vphaddd` of the two halves gives the 8 rows'
//! integer sums in lane order; the Q4_K mins (Q6_K `−32` offsets) are `vpmaddwd`s of the
//! pairs with the Q8_K block sums, already in row lanes.
//!
//! Invariant: per (row, token) the arithmetic is the scalar reference's — per super-block
//! the exact integer sums, then Q4_K / Q5_K `acc += (d·d_x)·isum − (dmin·d_x)·msum`, Q6_K
//! `acc += (d·d_x)·isum` (isum including the `−32` offset), super-blocks in order, `acc`
//! from +0.0, no fused multiply-add — so the result is bitwise the scalar path's, for any tile.

use super::avx2_packed::bcast4;
use super::avx2_q32::table;
use super::prefetch::{group_block_ahead, AHEAD_K};
use super::TileCtx;
use crate::blocks::KVALUES_IQ4NL;
use crate::blocks::QK_K;
use crate::dtype::DType;
use crate::quantize::ActQ8K;
use crate::repack::{group_block_bytes, Packed, GROUP_ROWS};
use crate::repack_k::{
    q3k_hm_reg, q3k_reg, q4k_reg, q5k_qh_reg, q5k_reg, q6k_reg, IQ4XS_P_QS, IQ4XS_P_SC, Q2K_P_QS, Q2K_P_SC, Q3K_P_SC, Q4K_P_MIN, Q4K_P_SC,
    Q6K_P_SC,
};
use std::arch::x86_64::*;

/// Largest token tile of one call.
pub(crate) const MAX_TOKENS: usize = 4;

/// Computes output rows `r0..r1` (multiples of 8) for every token of the call.
///
/// # Safety
/// AVX2/FMA/F16C available; `p` is the (Q4_K, Q5_K, Q6_K, Q3_K, IQ4_XS or Q2_K) packing of `c.w`, `a` its prepared
/// activations; no other thread writes those rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn run_rows(c: &TileCtx, a: &ActQ8K, p: &Packed, r0: usize, r1: usize, n_tokens: usize) {
    debug_assert!(r0 % GROUP_ROWS == 0 && r1 % GROUP_ROWS == 0);
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = super::even_pass(n_tokens - t0, MAX_TOKENS);
        for g in r0 / GROUP_ROWS..r1 / GROUP_ROWS {
            let gp = p.group(g).as_ptr();
            let out = c.out.add(t0 * c.ldo + g * GROUP_ROWS);
            match (p.dtype(), nt) {
                (DType::Q4K, 1) => q4k_group::<1, false>(gp, a, t0, out, c.ldo),
                (DType::Q4K, 2) => q4k_group::<2, false>(gp, a, t0, out, c.ldo),
                (DType::Q4K, 3) => q4k_group::<3, false>(gp, a, t0, out, c.ldo),
                (DType::Q4K, 4) => q4k_group::<4, false>(gp, a, t0, out, c.ldo),
                (DType::Q5K, 1) => q4k_group::<1, true>(gp, a, t0, out, c.ldo),
                (DType::Q5K, 2) => q4k_group::<2, true>(gp, a, t0, out, c.ldo),
                (DType::Q5K, 3) => q4k_group::<3, true>(gp, a, t0, out, c.ldo),
                (DType::Q5K, 4) => q4k_group::<4, true>(gp, a, t0, out, c.ldo),
                (DType::Q6K, 1) => q6k_group::<1>(gp, a, t0, out, c.ldo),
                (DType::Q6K, 2) => q6k_group::<2>(gp, a, t0, out, c.ldo),
                (DType::Q6K, 3) => q6k_group::<3>(gp, a, t0, out, c.ldo),
                (DType::Q6K, 4) => q6k_group::<4>(gp, a, t0, out, c.ldo),
                (DType::Q3K, 1) => q3k_group::<1>(gp, a, t0, out, c.ldo),
                (DType::Q3K, 2) => q3k_group::<2>(gp, a, t0, out, c.ldo),
                (DType::Q3K, 3) => q3k_group::<3>(gp, a, t0, out, c.ldo),
                (DType::Q3K, 4) => q3k_group::<4>(gp, a, t0, out, c.ldo),
                (DType::IQ4XS, 1) => iq4xs_group::<1>(gp, a, t0, out, c.ldo),
                (DType::IQ4XS, 2) => iq4xs_group::<2>(gp, a, t0, out, c.ldo),
                (DType::IQ4XS, 3) => iq4xs_group::<3>(gp, a, t0, out, c.ldo),
                (DType::IQ4XS, 4) => iq4xs_group::<4>(gp, a, t0, out, c.ldo),
                (DType::Q2K, 1) => q2k_group::<1>(gp, a, t0, out, c.ldo),
                (DType::Q2K, 2) => q2k_group::<2>(gp, a, t0, out, c.ldo),
                (DType::Q2K, 3) => q2k_group::<3>(gp, a, t0, out, c.ldo),
                (DType::Q2K, 4) => q2k_group::<4>(gp, a, t0, out, c.ldo),
                _ => unreachable!("only Q4_K / Q5_K / Q6_K / Q3_K / IQ4_XS / Q2_K reach the K-quant packed kernels"),
            }
        }
        t0 += nt;
    }
}

/// `vpshufb` control turning a scale-pair vector (dword `r` = row `r`'s pair, rows 0..4 in the
/// low lane, 4..8 in the high) into half `h`'s per-row scale of the pair's sub-block `s`:
/// i16 words 0..4 = the lane's row `2h`, words 4..8 = row `2h + 1` (see `HALF_ROWS`).
#[inline(always)]
unsafe fn scale_ctrl(h: usize, s: usize) -> __m256i {
    let b0 = (8 * h + 2 * s) as i8;
    let b1 = b0 + 4;
    let lane = _mm_setr_epi8(b0, b0 + 1, b0, b0 + 1, b0, b0 + 1, b0, b0 + 1, b1, b1 + 1, b1, b1 + 1, b1, b1 + 1, b1, b1 + 1);
    _mm256_broadcastsi128_si256(lane)
}

/// 8 activation bytes at `p` in all four 64-bit lanes.
#[inline(always)]
pub(crate) unsafe fn bcast8(p: *const i8) -> __m256i {
    _mm256_set1_epi64x((p as *const i64).read_unaligned())
}

/// The two halves' per-row integer sums → 8 lanes in row order.
#[inline(always)]
unsafe fn rows_sum(s: [__m256i; 2]) -> __m256i {
    _mm256_hadd_epi32(s[0], s[1])
}

/// `vpshufb` tables of 16 × bit 0 and 16 × bit 1 of a nibble.
struct FifthBits {
    bit0: __m256i,
    bit1: __m256i,
}

impl FifthBits {
    #[inline(always)]
    unsafe fn new() -> FifthBits {
        let table = |b: u8| {
            let v: [u8; 16] = std::array::from_fn(|i| ((i as u8 >> b) & 1) << 4);
            _mm256_broadcastsi128_si256(_mm_loadu_si128(v.as_ptr() as *const __m128i))
        };
        FifthBits { bit0: table(0), bit1: table(1) }
    }
}

/// A piece register's two 4-row value registers (low and high nibbles; with `FIFTH`, Q5_K's
/// fifth bits or-ed in from the piece's fifth-bit register at `qh`: bits `2c`, `2c + 1` of
/// each byte, brought to bits 0-1 by one shift and placed at bit 4 by two table lookups).
#[inline(always)]
unsafe fn k_values<const FIFTH: bool>(w: __m256i, qh: *const u8, c: usize, m4: __m256i, k: &FifthBits) -> (__m256i, __m256i) {
    let lo = _mm256_and_si256(w, m4);
    let hi = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
    if !FIFTH {
        return (lo, hi);
    }
    let qh = _mm256_loadu_si256(qh as *const __m256i);
    let bits = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * c as i32)), m4);
    (_mm256_or_si256(lo, _mm256_shuffle_epi8(k.bit0, bits)), _mm256_or_si256(hi, _mm256_shuffle_epi8(k.bit1, bits)))
}

/// Q4_K (`FIFTH = false`) or Q5_K (`FIFTH = true`: the same scales, mins and nibbles, plus a
/// fifth bit per value), one 8-row group, NT tokens.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_group<const NT: usize, const FIFTH: bool>(gp: *const u8, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(if FIFTH { DType::Q5K } else { DType::Q4K });
    let reg = |c: usize, m: usize, h: usize| if FIFTH { q5k_reg(c, m, h) } else { q4k_reg(c, m, h) };
    let m4 = _mm256_set1_epi8(0x0F);
    let fifth = FifthBits::new();
    let ones = _mm256_set1_epi16(1);
    let ctrl = [[scale_ctrl(0, 0), scale_ctrl(0, 1)], [scale_ctrl(1, 0), scale_ctrl(1, 1)]];
    // The (S_2p, S_2p+1) dword of the packed block sums, for pair p.
    let pair_idx = [0, 1, 4, 5];
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if NT > 1 && t0 == 0 {
            group_block_ahead::<AHEAD_K>(b, gbb);
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
            if NT <= 2 {
                // Both halves per piece: each token's two broadcasts serve 8 rows, not 4 (one
                // token, L3-resident weights on Zen 1: 101-106 -> 92-96 ns per 2048-column
                // row). More tokens keep a half's pieces together: their 4·NT sums would spill.
                let mut plo = [[_mm256_setzero_si256(); NT]; 2];
                let mut phi = [[_mm256_setzero_si256(); NT]; 2];
                for m in 0..4 {
                    let mut xlo = [_mm256_setzero_si256(); NT];
                    let mut xhi = [_mm256_setzero_si256(); NT];
                    for t in 0..NT {
                        let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K + 64 * c + 8 * m);
                        xlo[t] = bcast8(xp);
                        xhi[t] = bcast8(xp.add(32));
                    }
                    for h in 0..2 {
                        let w = _mm256_loadu_si256(b.add(reg(c, m, h)) as *const __m256i);
                        let (lo, hi) = k_values::<FIFTH>(w, b.add(q5k_qh_reg(m, h)), c, m4, &fifth);
                        for t in 0..NT {
                            plo[h][t] = _mm256_add_epi16(plo[h][t], _mm256_maddubs_epi16(lo, xlo[t]));
                            phi[h][t] = _mm256_add_epi16(phi[h][t], _mm256_maddubs_epi16(hi, xhi[t]));
                        }
                    }
                }
                for h in 0..2 {
                    let (slo, shi) = (_mm256_shuffle_epi8(sc, ctrl[h][0]), _mm256_shuffle_epi8(sc, ctrl[h][1]));
                    for t in 0..NT {
                        let s = _mm256_add_epi32(_mm256_madd_epi16(plo[h][t], slo), _mm256_madd_epi16(phi[h][t], shi));
                        isum[t][h] = _mm256_add_epi32(isum[t][h], s);
                    }
                }
            } else {
                for h in 0..2 {
                    let mut plo = [_mm256_setzero_si256(); NT];
                    let mut phi = [_mm256_setzero_si256(); NT];
                    for m in 0..4 {
                        let w = _mm256_loadu_si256(b.add(reg(c, m, h)) as *const __m256i);
                        let (lo, hi) = k_values::<FIFTH>(w, b.add(q5k_qh_reg(m, h)), c, m4, &fifth);
                        for t in 0..NT {
                            let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K + 64 * c + 8 * m);
                            plo[t] = _mm256_add_epi16(plo[t], _mm256_maddubs_epi16(lo, bcast8(xp)));
                            phi[t] = _mm256_add_epi16(phi[t], _mm256_maddubs_epi16(hi, bcast8(xp.add(32))));
                        }
                    }
                    let (slo, shi) = (_mm256_shuffle_epi8(sc, ctrl[h][0]), _mm256_shuffle_epi8(sc, ctrl[h][1]));
                    for t in 0..NT {
                        let s = _mm256_add_epi32(_mm256_madd_epi16(plo[t], slo), _mm256_madd_epi16(phi[t], shi));
                        isum[t][h] = _mm256_add_epi32(isum[t][h], s);
                    }
                }
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(b.add(16) as *const __m128i));
        for t in 0..NT {
            let dx = _mm256_set1_ps(*a.d.get_unchecked((t0 + t) * nb + i));
            let x1 = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(rows_sum(isum[t])));
            let x2 = _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(msum[t]));
            acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(x1, x2));
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}

/// `vpshufb` control turning a Q3_K scale-pair vector (dword `r` = row `r`'s pair, rows 0..4
/// in the low lane, 4..8 in the high) into half `h`'s per-word scales: each row's 4 words
/// `[s₀, s₀, s₁, s₁]` (its piece bytes 0..4 are the pair's first sub-block, 4..8 the second),
/// the lane's row `2h` then row `2h + 1`.
#[inline(always)]
unsafe fn q3k_scale_ctrl(h: usize) -> __m256i {
    let row = |r: usize| {
        let b = (4 * r) as i8;
        [b, b + 1, b, b + 1, b + 2, b + 3, b + 2, b + 3]
    };
    let (r0, r1) = (row(2 * h), row(2 * h + 1));
    let lane: [i8; 16] = std::array::from_fn(|i| if i < 8 { r0[i] } else { r1[i - 8] });
    _mm256_broadcastsi128_si256(_mm_loadu_si128(lane.as_ptr() as *const __m128i))
}

/// Q3_K, one 8-row group, NT tokens, in Q4_K's halves. Value register (`n`, `j`, `m`, `h`)
/// holds, per row, elements `128n + 32j + 4m..+4` and `128n + 32j + 16 + 4m..+4` (sub-blocks
/// `8n + 2j` and `8n + 2j + 1`): crumb `j` of the crumb register by one mask (`j ≥ 2` after
/// one shift by 4; odd `j` left in place, 4× its value, as Q2_K's), the high bit or-ed in at
/// bit 2 (odd `j`: bit 4) by one table lookup of the high-bit register's nibble `n`, so the
/// unsigned value `u = q + 4` (0..7) costs no shift per bit. The activation's matching 8
/// bytes are one broadcast from [`ActQ8K::q3k_pieces`]. A crumb's four pieces sum in i16 (≤ 4 · 2·28·128 =
/// 28,672, exact) before one `vpmaddwd` with per-word scales (each row's two sub-blocks);
/// odd crumbs' sums are divided by 4 at the end (exact: multiples of 4), and the offset is
/// `−4·Σ_j sc_j·S_j` from the Q8_K block sums. Then `acc += (d·d_x)·isum`, as the scalar
/// reference.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3k_group<const NT: usize>(gp: *const u8, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(DType::Q3K);
    let (m3, m12, m15) = (_mm256_set1_epi8(3), _mm256_set1_epi8(12), _mm256_set1_epi8(0x0F));
    // Nibble → bit j of it, at bit 2 (j even) or 4 (j odd: the crumb's place).
    let high: [__m256i; 4] = std::array::from_fn(|j| {
        let v: [u8; 16] = std::array::from_fn(|i| (((i >> j) & 1) as u8) << (if j % 2 == 0 { 2 } else { 4 }));
        _mm256_broadcastsi128_si256(_mm_loadu_si128(v.as_ptr() as *const __m128i))
    });
    let ctrl = [q3k_scale_ctrl(0), q3k_scale_ctrl(1)];
    let xq = a.q3k_pieces().as_ptr();
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        // One-token calls prefetch too: this kernel's many operations per byte leave the
        // hardware prefetchers behind (`prefetch.rs`).
        if t0 == 0 {
            group_block_ahead::<AHEAD_K>(b, gbb);
        }
        // [t][h]: even crumbs' sums, odd crumbs' (4×) sums.
        let mut even = [[_mm256_setzero_si256(); 2]; NT];
        let mut odd = [[_mm256_setzero_si256(); 2]; NT];
        let mut corr = [_mm256_setzero_si256(); NT];
        // Pair p = 4n + j: sub-blocks 8n + 2j and 8n + 2j + 1.
        let pair_scales = |p: usize| _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(Q3K_P_SC + 16 * p) as *const __m128i));
        let x_at = |t: usize, n: usize, j: usize, m: usize| bcast8(xq.add(((t0 + t) * nb + i) * QK_K + 128 * n + 32 * j + 8 * m));
        for p in 0..8 {
            let sc = pair_scales(p);
            for t in 0..NT {
                let bs = a.bsums.as_ptr().add(((t0 + t) * nb + i) * 16 + 2 * p);
                corr[t] = _mm256_add_epi32(corr[t], _mm256_madd_epi16(sc, _mm256_set1_epi32((bs as *const i32).read_unaligned())));
            }
        }
        let mut flush = |j: usize, ps: &[[__m256i; NT]; 2], sc: __m256i| {
            for h in 0..2 {
                let scl = _mm256_shuffle_epi8(sc, ctrl[h]);
                for t in 0..NT {
                    let prod = _mm256_madd_epi16(ps[h][t], scl);
                    if j % 2 == 0 {
                        even[t][h] = _mm256_add_epi32(even[t][h], prod);
                    } else {
                        odd[t][h] = _mm256_add_epi32(odd[t][h], prod);
                    }
                }
            }
        };
        // Piece (m, h)'s high-bit nibble of half-block n, and value register j from the crumb
        // register `src` (already shifted by 4 for j ≥ 2) and that nibble.
        let nibble = |n: usize, m: usize, h: usize| {
            let hm = _mm256_loadu_si256(b.add(q3k_hm_reg(m, h)) as *const __m256i);
            _mm256_and_si256(if n == 1 { _mm256_srli_epi16(hm, 4) } else { hm }, m15)
        };
        let value = |src: __m256i, nib: __m256i, j: usize| {
            _mm256_or_si256(_mm256_and_si256(src, if j % 2 == 0 { m3 } else { m12 }), _mm256_shuffle_epi8(high[j], nib))
        };
        if NT == 1 {
            // A piece's crumb and high-bit registers serve its four crumbs in turn (one shift and
            // mask each, not one per value register).
            for n in 0..2 {
                let mut ps = [[[_mm256_setzero_si256(); NT]; 2]; 4];
                for m in 0..4 {
                    let xm: [__m256i; 4] = std::array::from_fn(|j| x_at(0, n, j, m));
                    for h in 0..2 {
                        let q = _mm256_loadu_si256(b.add(q3k_reg(n, m, h)) as *const __m256i);
                        let q4 = _mm256_srli_epi16(q, 4);
                        let nib = nibble(n, m, h);
                        for j in 0..4 {
                            let v = value(if j >= 2 { q4 } else { q }, nib, j);
                            ps[j][h][0] = _mm256_add_epi16(ps[j][h][0], _mm256_maddubs_epi16(v, xm[j]));
                        }
                    }
                }
                for j in 0..4 {
                    flush(j, &ps[j], pair_scales(4 * n + j));
                }
            }
        } else {
            for n in 0..2 {
                for j in 0..4 {
                    let mut ps = [[_mm256_setzero_si256(); NT]; 2];
                    for m in 0..4 {
                        let xm: [__m256i; NT] = std::array::from_fn(|t| x_at(t, n, j, m));
                        for h in 0..2 {
                            let q = _mm256_loadu_si256(b.add(q3k_reg(n, m, h)) as *const __m256i);
                            let v = value(if j >= 2 { _mm256_srli_epi16(q, 4) } else { q }, nibble(n, m, h), j);
                            for t in 0..NT {
                                ps[h][t] = _mm256_add_epi16(ps[h][t], _mm256_maddubs_epi16(v, xm[t]));
                            }
                        }
                    }
                    flush(j, &ps, pair_scales(4 * n + j));
                }
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        for t in 0..NT {
            let isum = _mm256_add_epi32(rows_sum(even[t]), _mm256_srai_epi32::<2>(rows_sum(odd[t])));
            let isum = _mm256_sub_epi32(isum, _mm256_slli_epi32::<2>(corr[t]));
            let dx = _mm256_set1_ps(*a.d.get_unchecked((t0 + t) * nb + i));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum)));
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}

/// IQ4_XS, one 8-row group, NT tokens, one row per 32-bit lane: per sub-block `j`, its 4
/// registers' nibbles looked up in the table (`vpshufb`, values −127..113), the sign trick's
/// `vpmaddubsw` per nibble half and token (|127·127·2| < 2^15, exact), and each widened by a
/// `vpmaddwd` with the 8 rows' sub-block scales (`ls − 32` in both words of the row's lane),
/// so the scale costs no multiply of its own; the i32 sums stay exact (|Σ| ≤ 8 · 32 · 32 ·
/// 127² < 2^31). Then `acc += (d·d_x)·isum`, as the scalar reference.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4xs_group<const NT: usize>(gp: *const u8, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(DType::IQ4XS);
    let m4 = _mm256_set1_epi8(0x0F);
    let lut = table(&KVALUES_IQ4NL);
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if NT > 1 && t0 == 0 {
            group_block_ahead::<AHEAD_K>(b, gbb);
        }
        let mut isum = [_mm256_setzero_si256(); NT];
        for j in 0..8 {
            // Row r's scale in both i16 words of lane r.
            let s32 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(IQ4XS_P_SC + 8 * j) as *const __m128i));
            let sc = _mm256_blend_epi16::<0xAA>(s32, _mm256_slli_epi32::<16>(s32));
            for k in 0..4 {
                let v = _mm256_loadu_si256(b.add(IQ4XS_P_QS + 32 * (4 * j + k)) as *const __m256i);
                let lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
                let hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
                let (alo, ahi) = (_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(hi, hi));
                for t in 0..NT {
                    let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K + 32 * j);
                    let plo = _mm256_maddubs_epi16(alo, _mm256_sign_epi8(bcast4(xp, 4 * k), lo));
                    let phi = _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(bcast4(xp, 16 + 4 * k), hi));
                    isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_madd_epi16(plo, sc), _mm256_madd_epi16(phi, sc)));
                }
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        for t in 0..NT {
            let dx = _mm256_set1_ps(*a.d.get_unchecked((t0 + t) * nb + i));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum[t])));
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}

/// Q2_K, one 8-row group, NT tokens, one row per 32-bit lane. Crumb `j` of a register comes
/// out with one mask (`j` odd: left in place, 4× its value, so no shift) after at most one
/// shift by 4; a 16-element sub-block's 4 registers sum in i16 (≤ 4 · 2·12·127 = 12,192,
/// exact) before one `vpmaddwd` with the rows' scales (both words of the row's lane), and the
/// odd crumbs' sums are divided by 4 at the end (exact: multiples of 4). The mins are one
/// `vpmaddwd` per sub-block pair with the Q8_K block sums. Then `acc += (d·d_x)·isum −
/// (dmin·d_x)·msum`, as the scalar reference: per 256 weights and token 8 `vpmaddubsw` and
/// 2 + 1 `vpmaddwd`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2k_group<const NT: usize>(gp: *const u8, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(DType::Q2K);
    let (m3, m12, m15) = (_mm256_set1_epi8(3), _mm256_set1_epi8(12), _mm256_set1_epi16(0x0F));
    // Word 0 (h = 0) or 1 (h = 1) of every dword in both of its words.
    let dup = |h: i8| {
        let (w0, w1) = (2 * h, 2 * h + 1);
        let lane = _mm_setr_epi8(
            w0,
            w1,
            w0,
            w1,
            w0 + 4,
            w1 + 4,
            w0 + 4,
            w1 + 4,
            w0 + 8,
            w1 + 8,
            w0 + 8,
            w1 + 8,
            w0 + 12,
            w1 + 12,
            w0 + 12,
            w1 + 12,
        );
        _mm256_broadcastsi128_si256(lane)
    };
    let dups = [dup(0), dup(1)];
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        // One-token calls prefetch too: this kernel's many operations per byte leave the
        // hardware prefetchers behind (`prefetch.rs`).
        if t0 == 0 {
            group_block_ahead::<AHEAD_K>(b, gbb);
        }
        let mut even = [_mm256_setzero_si256(); NT];
        let mut odd = [_mm256_setzero_si256(); NT];
        let mut msum = [_mm256_setzero_si256(); NT];
        for n in 0..2 {
            for j in 0..4 {
                // Sub-blocks 8n + 2j (registers 8n..8n+4) and 8n + 2j + 1 (8n+4..8n+8): pair 4n + j.
                let p = 4 * n + j;
                let pr = _mm256_cvtepu8_epi16(_mm_loadu_si128(b.add(Q2K_P_SC + 16 * p) as *const __m128i));
                let sc = _mm256_and_si256(pr, m15);
                let mn = _mm256_srli_epi16(pr, 4);
                for t in 0..NT {
                    let bs = a.bsums.as_ptr().add(((t0 + t) * nb + i) * 16 + 2 * p);
                    msum[t] = _mm256_add_epi32(msum[t], _mm256_madd_epi16(mn, _mm256_set1_epi32((bs as *const i32).read_unaligned())));
                }
                for h in 0..2 {
                    let sh = _mm256_shuffle_epi8(sc, dups[h]);
                    let mut s16 = [_mm256_setzero_si256(); NT];
                    for k in 4 * h..4 * h + 4 {
                        let v = _mm256_loadu_si256(b.add(Q2K_P_QS + 32 * (8 * n + k)) as *const __m256i);
                        let v = if j >= 2 { _mm256_srli_epi16(v, 4) } else { v };
                        let q = _mm256_and_si256(v, if j % 2 == 0 { m3 } else { m12 });
                        for t in 0..NT {
                            let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K + 128 * n + 32 * j);
                            s16[t] = _mm256_add_epi16(s16[t], _mm256_maddubs_epi16(q, bcast4(xp, 4 * k)));
                        }
                    }
                    for t in 0..NT {
                        let s = _mm256_madd_epi16(s16[t], sh);
                        if j % 2 == 0 {
                            even[t] = _mm256_add_epi32(even[t], s);
                        } else {
                            odd[t] = _mm256_add_epi32(odd[t], s);
                        }
                    }
                }
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(b.add(16) as *const __m128i));
        for t in 0..NT {
            let isum = _mm256_add_epi32(even[t], _mm256_srai_epi32::<2>(odd[t]));
            let dx = _mm256_set1_ps(*a.d.get_unchecked((t0 + t) * nb + i));
            let x1 = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum));
            let x2 = _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(msum[t]));
            acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(x1, x2));
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}

/// Q6_K, one 8-row group, NT tokens.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_group<const NT: usize>(gp: *const u8, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(DType::Q6K);
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    // Nibble i → (i & 3) << 4 and ((i >> 2) & 3) << 4.
    let pair01 = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 16, 32, 48, 0, 16, 32, 48, 0, 16, 32, 48, 0, 16, 32, 48));
    let pair23 = _mm256_broadcastsi128_si256(_mm_setr_epi8(0, 0, 0, 0, 16, 16, 16, 16, 32, 32, 32, 32, 48, 48, 48, 48));
    let ctrl = [[scale_ctrl(0, 0), scale_ctrl(0, 1)], [scale_ctrl(1, 0), scale_ctrl(1, 1)]];
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if NT > 1 && t0 == 0 {
            group_block_ahead::<AHEAD_K>(b, gbb);
        }
        let mut isum = [[_mm256_setzero_si256(); 2]; NT];
        // Σ_j sc_j · bsum_j per row (the −32 offset), j over the 16 sub-blocks.
        let mut corr = [_mm256_setzero_si256(); NT];
        for c in 0..4 {
            // Pair 2c: sub-blocks 4c, 4c+1 (low nibbles); pair 2c+1: 4c+2, 4c+3 (high nibbles).
            let pa = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(Q6K_P_SC + 32 * c) as *const __m128i));
            let pb = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(Q6K_P_SC + 32 * c + 16) as *const __m128i));
            for t in 0..NT {
                let bs = a.bsums.as_ptr().add(((t0 + t) * nb + i) * 16 + 4 * c);
                let ba = _mm256_set1_epi32((bs as *const i32).read_unaligned());
                let bb = _mm256_set1_epi32((bs.add(2) as *const i32).read_unaligned());
                corr[t] = _mm256_add_epi32(corr[t], _mm256_add_epi32(_mm256_madd_epi16(pa, ba), _mm256_madd_epi16(pb, bb)));
            }
            for h in 0..2 {
                for k in 0..2 {
                    let qh = _mm256_loadu_si256(b.add(q6k_reg(c, 3 * k, h)) as *const __m256i);
                    let w0 = _mm256_loadu_si256(b.add(q6k_reg(c, 3 * k + 1, h)) as *const __m256i);
                    let w1 = _mm256_loadu_si256(b.add(q6k_reg(c, 3 * k + 2, h)) as *const __m256i);
                    // Bit pairs 0-1 and 2-3 of qh placed at bits 4-5 by two table lookups of its low
                    // nibble (no shift: Zen 1 runs shifts on one pipe, `vpshufb` on two).
                    let q0f = _mm256_and_si256(qh, m4);
                    let lo0 = _mm256_or_si256(_mm256_and_si256(w0, m4), _mm256_shuffle_epi8(pair01, q0f));
                    let hi0 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w0, 4), m4), _mm256_shuffle_epi8(pair23, q0f));
                    let lo1 = _mm256_or_si256(_mm256_and_si256(w1, m4), _mm256_and_si256(qh, m30));
                    let hi1 =
                        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w1, 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30));
                    let (slo, shi) = (_mm256_shuffle_epi8(pa, ctrl[h][k]), _mm256_shuffle_epi8(pb, ctrl[h][k]));
                    for t in 0..NT {
                        let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K + 64 * c + 16 * k);
                        let plo = _mm256_add_epi16(_mm256_maddubs_epi16(lo0, bcast8(xp)), _mm256_maddubs_epi16(lo1, bcast8(xp.add(8))));
                        let phi =
                            _mm256_add_epi16(_mm256_maddubs_epi16(hi0, bcast8(xp.add(32))), _mm256_maddubs_epi16(hi1, bcast8(xp.add(40))));
                        let s = _mm256_add_epi32(_mm256_madd_epi16(plo, slo), _mm256_madd_epi16(phi, shi));
                        isum[t][h] = _mm256_add_epi32(isum[t][h], s);
                    }
                }
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        for t in 0..NT {
            let dx = _mm256_set1_ps(*a.d.get_unchecked((t0 + t) * nb + i));
            let isum = _mm256_sub_epi32(rows_sum(isum[t]), _mm256_slli_epi32(corr[t], 5));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum)));
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}
