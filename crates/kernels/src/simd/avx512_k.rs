//! AVX-512 VNNI decode tiles (up to 4 rows × 1 token) of Q3_K and IQ4_XS against Q8_K
//! activations: the per-token GEMV of these formats, which `avx2_k`'s tiles run with ~3× the
//! instructions (256-bit `vpmaddubsw` + `vpmaddwd` per 32 values, sign tricks, per-group scale
//! broadcasts).
//!
//! Per super-block and row, 64 values per instruction, in unsigned byte codes `u` multiplied
//! with the activation bytes into exact integer sums:
//! * IQ4_XS: `u` = table value + 128 (one `vpshufb` of the nibbles in a biased table; `vpdpbusd`
//!   sums of 4 products, ≤ 4·241·127, in i32), four
//!   32-value groups per register pair (low nibbles, high nibbles; one group per 128-bit
//!   lane), the activations brought into that arrangement by one `vshufi64x2` per 64 values.
//!   Per 4 groups one `vpmulld` applies the 6-bit scales; the bias comes back as
//!   `−128·Σ_g ls_g·S_g` (`S_g` the group's activation sum from the Q8_K block sums).
//! * Q3_K: `u = q + 4` (2 low bits, plus 4 where the `hmask` bit is set); each register holds
//!   64 consecutive values (four 16-value groups, one per 128-bit lane): `vpmaddubsw` (exact
//!   i16 pairs), then one `vpdpwssd` with the groups' scales; the offset is
//!   `−4·Σ_j sc_j·bsum_j`.
//!
//! Per row the 16 lanes fold to 8 and the rows' sums are formed together (`avx2_k::hsum_rows`);
//! the float term is `avx2_k::add_block_terms`, the scalar reference's operations lane by lane.
//!
//! Invariant: each (row, token, super-block) integer is exactly the scalar reference's (all
//! intermediate sums stay within i32: IQ4_XS |Σ| ≤ 8·32·32·241·127 < 2^31), and the float
//! operations are the reference's, so the result is bitwise the scalar path's (and the AVX2
//! tiles', the prefill kernels') for any tile.

use super::avx2_k::{add_block_terms, block_bytes, hsum_rows, store_rows, IQ4XS, Q3K, RUN};
use crate::blocks::*;
use crate::dtype::DType;
use crate::quantize::ActQ8K;
use std::arch::x86_64::*;

/// Whether this module has a decode tile for `d`.
pub(crate) fn handles(d: DType) -> bool {
    matches!(d, DType::Q3K | DType::IQ4XS)
}

/// Runs rows `0..nr` (1..=4; `w` the first row's first block, rows `rb` bytes apart) × the one
/// token `t0` of format `d` ([`handles`]).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI available; `w` holds `nr` rows of `a.blocks_per_row` blocks; `out[r]`
/// writable for `r < nr`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_tile(d: DType, nr: usize, w: *const u8, rb: usize, a: &ActQ8K, t0: usize, out: *mut f32) {
    macro_rules! rows {
        ($k:expr) => {
            match nr {
                // Rows longer than a run: one row at a time (sequential reads; see `tile`).
                _ if a.blocks_per_row > RUN => {
                    for r in 0..nr {
                        tile::<$k, 1>(w.add(r * rb), rb, a, t0, out.add(r))
                    }
                }
                1 => tile::<$k, 1>(w, rb, a, t0, out),
                2 => tile::<$k, 2>(w, rb, a, t0, out),
                3 => tile::<$k, 3>(w, rb, a, t0, out),
                _ => tile::<$k, 4>(w, rb, a, t0, out),
            }
        };
    }
    if d == DType::Q3K {
        rows!(Q3K)
    } else {
        rows!(IQ4XS)
    }
}

/// The 8 IQ4_XS sub-block scale codes of block `b` (0..64, before the −32) as bytes 0..8 of a
/// u64: low 4 bits from the nibbles of `scales_l`, high 2 from the bit pairs of `scales_h`.
#[inline(always)]
pub(crate) fn iq4xs_scale_codes(b: *const u8) -> u64 {
    // SAFETY (of the reads): the caller passes a whole IQ4_XS block (136 bytes).
    let (sh, sl) = unsafe { ((b.add(2) as *const u16).read_unaligned() as u64, (b.add(4) as *const u32).read_unaligned() as u64) };
    // Spread the 8 nibbles to one per byte, and the 8 bit pairs to one per byte.
    let mut lo = (sl | (sl << 16)) & 0x0000_FFFF_0000_FFFF;
    lo = (lo | (lo << 8)) & 0x00FF_00FF_00FF_00FF;
    lo = (lo | (lo << 4)) & 0x0F0F_0F0F_0F0F_0F0F;
    let mut hi = (sh | (sh << 24)) & 0x0000_00FF_0000_00FF;
    hi = (hi | (hi << 12)) & 0x000F_000F_000F_000F;
    hi = (hi | (hi << 6)) & 0x0303_0303_0303_0303;
    lo | (hi << 4)
}

/// The 16 Q3_K scale codes of block `b` (0..64, before the −32), bytes in scale order
/// (ggml's kmask arrangement: four 32-bit words of 4 scales each).
#[inline(always)]
pub(crate) fn q3k_scale_codes(b: *const u8) -> [u32; 4] {
    const M2: u32 = 0x0f0f_0f0f;
    const M1: u32 = 0x0303_0303;
    // SAFETY (of the reads): the caller passes a whole Q3_K block (110 bytes).
    let u = |i: usize| unsafe { (b.add(Q3K_SCALES + 4 * i) as *const u32).read_unaligned() };
    let (a0, a1, a2) = (u(0), u(1), u(2));
    [
        (a0 & M2) | ((a2 & M1) << 4),
        (a1 & M2) | (((a2 >> 2) & M1) << 4),
        ((a0 >> 4) & M2) | (((a2 >> 4) & M1) << 4),
        ((a1 >> 4) & M2) | (((a2 >> 6) & M1) << 4),
    ]
}

/// `NR` rows × 1 token; see the module doc. Rows are read one after another through runs of
/// `avx2_k::RUN` super-blocks (sequential streams for the prefetchers, as `avx2_k`'s tiles;
/// [`rows_tile`] sends rows longer than a run one at a time).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const K: u8, const NR: usize>(w: *const u8, rb: usize, a: &ActQ8K, t0: usize, out: *mut f32) {
    let bb = block_bytes(K);
    let nb = a.blocks_per_row;
    let run = if NR == 1 { 1 } else { RUN };
    let mut acc = _mm_setzero_ps();
    let mut i0 = 0;
    while i0 < nb {
        let n = run.min(nb - i0);
        let mut isum = [[_mm256_setzero_si256(); NR]; RUN];
        let mut d = [[0f32; 4]; RUN];
        for r in 0..NR {
            for k in 0..n {
                let ab = t0 * nb + i0 + k;
                let xp = a.qs.as_ptr().add(ab * QK_K);
                let bsv = _mm256_loadu_si256(a.bsums.as_ptr().add(ab * 16) as *const __m256i);
                let b = w.add(r * rb + (i0 + k) * bb);
                let s = if K == Q3K { q3k_block(b, xp, bsv) } else { iq4xs_block(b, xp, bsv) };
                isum[k][r] = _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s));
                d[k][r] = f16_scalar(b.add(if K == Q3K { Q3K_D } else { 0 }));
            }
        }
        for k in 0..n {
            let dx = *a.d.get_unchecked(t0 * nb + i0 + k);
            acc = add_block_terms::<K>(
                acc,
                _mm_loadu_ps(d[k].as_ptr()),
                _mm_setzero_ps(),
                _mm_set1_ps(dx),
                hsum_rows(&isum[k]),
                _mm_setzero_si128(),
            );
        }
        i0 += n;
    }
    store_rows::<NR>(acc, out);
}

/// The f16 at `p` as f32 (hardware conversion; exact, as `f16_at`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn f16_scalar(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((p as *const u16).read_unaligned() as i32)))
}

/// 16 lanes whose sum is block `b`'s exact IQ4_XS integer `Σ_g ls_g·Σ table[q]·x` against the
/// activation block at `xp` (block sums `bsv`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4xs_block(b: *const u8, xp: *const i8, bsv: __m256i) -> __m512i {
    let m4 = _mm512_set1_epi8(0x0F);
    let tabu = super::avx512::table_plus_128(&KVALUES_IQ4NL);
    let ls = _mm_sub_epi8(_mm_cvtsi64_si128(iq4xs_scale_codes(b) as i64), _mm_set1_epi8(32));
    // Scales per 128-bit lane: groups 4h..4h+4 of half h, one group per lane.
    let sc = [
        _mm512_cvtepi8_epi32(_mm_shuffle_epi8(ls, _mm_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3))),
        _mm512_cvtepi8_epi32(_mm_shuffle_epi8(ls, _mm_setr_epi8(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7))),
    ];
    let mut s = _mm512_setzero_si512();
    for h in 0..2 {
        // Nibble bytes of groups 4h..4h+4 (16 per group: low nibbles = the group's values
        // 0..16, high = 16..32), one group per 128-bit lane.
        let v = _mm512_loadu_si512(b.add(IQ4XS_QS + 64 * h) as *const __m512i);
        let tl = _mm512_shuffle_epi8(tabu, _mm512_and_si512(v, m4));
        let th = _mm512_shuffle_epi8(tabu, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4));
        // The activations in the same arrangement: lane j = group 4h + j's first / second 16.
        let x0 = _mm512_loadu_si512(xp.add(128 * h) as *const __m512i);
        let x1 = _mm512_loadu_si512(xp.add(128 * h + 64) as *const __m512i);
        let xl = _mm512_shuffle_i64x2::<0b10_00_10_00>(x0, x1);
        let xh = _mm512_shuffle_i64x2::<0b11_01_11_01>(x0, x1);
        let dot = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), tl, xl), th, xh);
        s = _mm512_add_epi32(s, _mm512_mullo_epi32(dot, sc[h]));
    }
    // The +128 bias: 128 · Σ_g ls_g · (bsum_2g + bsum_2g+1).
    let ls16 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(ls, ls));
    let corr = _mm256_slli_epi32::<7>(_mm256_madd_epi16(bsv, ls16));
    _mm512_sub_epi32(s, _mm512_zextsi256_si512(corr))
}

/// 16 lanes whose sum is block `b`'s exact Q3_K integer `Σ_j sc_j·Σ q·x` (q in −4..4) against
/// the activation block at `xp` (block sums `bsv`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q3k_block(b: *const u8, xp: *const i8, bsv: __m256i) -> __m512i {
    let m3 = _mm512_set1_epi8(3);
    let four = _mm512_set1_epi8(4);
    let c = q3k_scale_codes(b);
    let sc = _mm_sub_epi8(_mm_setr_epi32(c[0] as i32, c[1] as i32, c[2] as i32, c[3] as i32), _mm_set1_epi8(32));
    let sc16 = _mm256_cvtepi8_epi16(sc);
    let scz = _mm512_zextsi256_si512(sc16);
    let hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(b as *const __m256i));
    let mut s = _mm512_setzero_si512();
    for n in 0..2 {
        let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(b.add(Q3K_QS + 32 * n) as *const __m256i));
        for h in 0..2 {
            // Values 64m..64m+64 (m = 2n + h): shifts k = 2h, 2h + 1 in the two 256-bit halves.
            let m = 2 * n + h;
            let (k0, k1) = (2 * h as i64, 2 * h as i64 + 1);
            let cnt = _mm512_setr_epi64(2 * k0, 2 * k0, 2 * k0, 2 * k0, 2 * k1, 2 * k1, 2 * k1, 2 * k1);
            let lo = _mm512_and_si512(_mm512_srlv_epi64(q, cnt), m3);
            let (b0, b1) = (1i8 << (4 * n as i64 + k0), 1i8 << (4 * n as i64 + k1));
            let sel = _mm512_inserti64x4::<1>(_mm512_set1_epi8(b0), _mm256_set1_epi8(b1));
            let u = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(hm, sel), lo, four);
            // Exact i16 pair sums (|2·7·127| < 2^15), then the scales of the 4 groups (one per
            // 128-bit lane, i16 words picked by one `vpermw`) in one `vpdpwssd`.
            let p = _mm512_maddubs_epi16(u, _mm512_loadu_si512(xp.add(64 * m) as *const __m512i));
            let w = |j: usize| ((4 * m + j) as i64) * 0x0001_0001_0001_0001;
            let scm = _mm512_permutexvar_epi16(_mm512_set_epi64(w(3), w(3), w(2), w(2), w(1), w(1), w(0), w(0)), scz);
            s = _mm512_dpwssd_epi32(s, p, scm);
        }
    }
    // The +4 offset: 4 · Σ_j sc_j · bsum_j.
    let corr = _mm256_slli_epi32::<2>(_mm256_madd_epi16(bsv, sc16));
    _mm512_sub_epi32(s, _mm512_zextsi256_si512(corr))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    #[test]
    fn scale_codes_match_the_reference_unpacking() {
        for s in 1..500u32 {
            let b = bytes(136, s);
            let c = iq4xs_scale_codes(b.as_ptr()).to_le_bytes();
            let want = iq4xs_scales(&b);
            for j in 0..8 {
                assert_eq!(c[j] as i32 - 32, want[j], "iq4_xs seed {s} j {j}");
            }
            let c3: Vec<u8> = q3k_scale_codes(b.as_ptr()).iter().flat_map(|w| w.to_le_bytes()).collect();
            let want3 = q3k_scales(&b);
            for j in 0..16 {
                assert_eq!(c3[j] as i32 - 32, want3[j] as i32, "q3_k seed {s} j {j}");
            }
        }
    }
}
