//! AVX2 kernels over Q4_0 / Q8_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 [`Packed`] weights: 8 rows × up
//! to 4 tokens per call (Q4_K / Q6_K packings go on to `avx2_packed_k.rs`). AVX-512 CPUs run
//! these kernels for every packing the 512-bit ones do not take.
//!
//! Per group-block and token: the 8 rows' exact integer dot products end in one register with
//! vertical adds only (lane `r` = row `r`, activation bytes broadcast). Q4_0 / Q4_1: 8
//! `vpmaddubsw`, i16 adds, one `vpmaddwd`; Q5_0 / Q5_1: the same with each register's fifth
//! bits or-ed in by one shift, and two `vpmaddwd` (the four share one kernel, [`nibble_group`]);
//! MXFP4: its table plus 12 (unsigned) looked up, then as Q5_0's values; Q8_0 / IQ4_NL (signed
//! values): 8 × (sign trick, `vpmaddubsw`, `vpmaddwd`). Then one conversion, the scales
//! `d_w · d_x` for all 8 rows in one multiply, one multiply and one add. Integer multiplies are
//! what bound these kernels on AVX2 machines with one vector multiply port (Zen 1: 2 µops per
//! 256-bit multiply); horizontal adds and lane swaps, which the older pair layout needed per
//! token, are gone.
//!
//! Invariant: per (row, token) the arithmetic is the scalar reference's — `acc += (d_w · d_x)
//! · isum` with `isum` the block's exact integer sum (Q4_0: `Σ q·x − 8·Σx`), blocks in order,
//! `acc` from +0.0, no fused multiply-add — so the result is bitwise the scalar path's, for
//! any tile.

use super::avx2_q32::table;
use super::prefetch::{group_block_ahead, AHEAD_Q};
use super::{Acts, TileCtx};
use crate::blocks::QK;
use crate::blocks::{KVALUES_IQ4NL, KVALUES_MXFP4};
use crate::dtype::DType;
use crate::quantize::ActQ8;
use crate::repack::{fifth_bits_at, group_block_bytes, head_bytes, Packed, GROUP_ROWS};
use std::arch::x86_64::*;

/// Largest token tile of one call.
pub(crate) const MAX_TOKENS: usize = 4;

/// Computes output rows `r0..r1` (multiples of 8) for every token of the call (any packed
/// format).
///
/// # Safety
/// AVX2/FMA/F16C available; `p` is the packing of `c.w`; no other thread writes those rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn run_rows(c: &TileCtx, p: &Packed, r0: usize, r1: usize, n_tokens: usize) {
    let a = match c.acts {
        Acts::Q8(a) => a,
        Acts::Q8K(a) => return super::avx2_packed_k::run_rows(c, a, p, r0, r1, n_tokens),
        Acts::F32(_) => unreachable!("float weights are never packed"),
    };
    debug_assert!(r0 % GROUP_ROWS == 0 && r1 % GROUP_ROWS == 0);
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = super::even_pass(n_tokens - t0, MAX_TOKENS);
        debug_assert!((1..=MAX_TOKENS).contains(&nt));
        for g in r0 / GROUP_ROWS..r1 / GROUP_ROWS {
            let gp = p.group(g).as_ptr();
            let out = c.out.add(t0 * c.ldo + g * GROUP_ROWS);
            // The kernel `$f` of this format, for this pass's token count (1..=MAX_TOKENS).
            macro_rules! by_tokens {
                ($f:ident $(, $c:expr)*) => {
                    match nt {
                        1 => $f::<1 $(, $c)*>(gp, a, t0, out, c.ldo),
                        2 => $f::<2 $(, $c)*>(gp, a, t0, out, c.ldo),
                        3 => $f::<3 $(, $c)*>(gp, a, t0, out, c.ldo),
                        _ => $f::<4 $(, $c)*>(gp, a, t0, out, c.ldo),
                    }
                };
            }
            match p.dtype() {
                DType::Q4_0 => by_tokens!(nibble_group, false, false),
                DType::Q4_1 => by_tokens!(nibble_group, false, true),
                DType::Q5_0 => by_tokens!(nibble_group, true, false),
                DType::Q5_1 => by_tokens!(nibble_group, true, true),
                DType::Q8_0 => by_tokens!(q8_group),
                DType::IQ4NL => by_tokens!(iq4nl_group),
                DType::MXFP4 => by_tokens!(mxfp4_group),
                _ => unreachable!("only the 32-element formats are packed here"),
            }
        }
        t0 += nt;
    }
}

/// `acc += (d_w · d_x) · isum` for the 8 rows (lanes) of one group-block and one token.
#[inline(always)]
unsafe fn accumulate(acc: __m256, dw: __m256, a: &ActQ8, ab: usize, isum: __m256i) -> __m256 {
    let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(ab)));
    _mm256_add_ps(acc, _mm256_mul_ps(scale, _mm256_cvtepi32_ps(isum)))
}

/// The activation's bytes `at..at + 4` (as one i32) in all 8 lanes.
#[inline(always)]
pub(crate) unsafe fn bcast4(xp: *const i8, at: usize) -> __m256i {
    _mm256_set1_epi32((xp.add(at) as *const i32).read_unaligned())
}

/// The nibble formats, one 8-row group, NT tokens: Q4_0 (`FIFTH`, `MIN` false), Q4_1 (`MIN`),
/// Q5_0 (`FIFTH`), Q5_1 (both). Register `j` of a group-block holds, in lane `r`, row `r`'s
/// nibble bytes `4j..4j+4` (elements `4j..4j+4` low, `16+4j..16+4j+4` high), so one
/// `vpmaddubsw` per nibble half and broadcast activation gives 8 rows' i16 pair sums, with no
/// horizontal sum. Five-bit formats or each byte's fifth bit in ([`fifth_bit`]; values 0..32).
///
/// The registers' sums stay in i16 until one `vpmaddwd` widens them: all 4 registers for the
/// four-bit formats (|15·127·2| · 2 · 4 = 30,480 < 2^15), 2 for the five-bit ones (|31·127·2|
/// · 4 = 31,496), exact either way — 8 + 1 (or 8 + 2) multiplies per token and group-block.
/// Q4_0 / Q5_0 add the activation's `−8·Σx` / `−16·Σx` (`bias1`) to the integer sum, as the
/// scalar reference's `isum`; Q4_1 / Q5_1 add `m_w · s_x` per lane as it does (the min's 8 rows'
/// f16s follow the `d`s).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibble_group<const NT: usize, const FIFTH: bool, const MIN: bool>(
    gp: *const u8,
    a: &ActQ8,
    t0: usize,
    out: *mut f32,
    ldo: usize,
) {
    let dtype = match (FIFTH, MIN) {
        (false, false) => DType::Q4_0,
        (false, true) => DType::Q4_1,
        (true, false) => DType::Q5_0,
        (true, true) => DType::Q5_1,
    };
    // Registers whose products share one i16 sum.
    let per_sum = if FIFTH { 2 } else { 4 };
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(dtype);
    let quants = 8 * head_bytes(dtype);
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if NT > 1 && t0 == 0 {
            group_block_ahead::<AHEAD_Q>(b, gbb);
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        let hb = if FIFTH { _mm256_loadu_si256(b.add(fifth_bits_at(dtype)) as *const __m256i) } else { _mm256_setzero_si256() };
        let mut s = [_mm256_setzero_si256(); NT];
        for part in 0..4 / per_sum {
            let mut s16 = [_mm256_setzero_si256(); NT];
            for j in part * per_sum..(part + 1) * per_sum {
                let v = _mm256_loadu_si256(b.add(quants + 32 * j) as *const __m256i);
                let mut lo = _mm256_and_si256(v, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                if FIFTH {
                    lo = _mm256_or_si256(lo, fifth_bit::<false>(hb, j));
                    hi = _mm256_or_si256(hi, fifth_bit::<true>(hb, j));
                }
                for t in 0..NT {
                    let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK);
                    let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xp, 4 * j)), _mm256_maddubs_epi16(hi, bcast4(xp, 16 + 4 * j)));
                    s16[t] = _mm256_add_epi16(s16[t], p);
                }
            }
            for t in 0..NT {
                s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(s16[t], ones));
            }
        }
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            if MIN {
                let mw = _mm256_cvtph_ps(_mm_loadu_si128(b.add(16) as *const __m128i));
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(ab)));
                let min = _mm256_mul_ps(mw, _mm256_set1_ps(*a.s.get_unchecked(ab)));
                acc[t] = _mm256_add_ps(acc[t], _mm256_add_ps(_mm256_mul_ps(scale, _mm256_cvtepi32_ps(s[t])), min));
            } else {
                let isum = _mm256_add_epi32(s[t], _mm256_set1_epi32(*a.bias1.get_unchecked(ab)));
                acc[t] = accumulate(acc[t], dw, a, ab, isum);
            }
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}

/// Bit 4 of every byte of `hb` (a group-block's rearranged fifth bits, `repack::spread_qh`)
/// set where quant register `j`'s low (`HI` false) or high nibble has its fifth bit: the bit
/// sits at `2j` (+1 for the high nibble) of the same byte, and one 16-bit shift by at most 4
/// brings it to bit 4 without carrying a neighbour byte's bit there.
#[inline(always)]
unsafe fn fifth_bit<const HI: bool>(hb: __m256i, j: usize) -> __m256i {
    let moved = match (j, HI) {
        (0, false) => _mm256_slli_epi16::<4>(hb),
        (0, true) => _mm256_slli_epi16::<3>(hb),
        (1, false) => _mm256_slli_epi16::<2>(hb),
        (1, true) => _mm256_slli_epi16::<1>(hb),
        (2, false) => hb,
        (2, true) => _mm256_srli_epi16::<1>(hb),
        (3, false) => _mm256_srli_epi16::<2>(hb),
        _ => _mm256_srli_epi16::<3>(hb),
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(0x10))
}

/// IQ4_NL, one 8-row group, NT tokens: Q4_0's registers, each nibble looked up in the format's
/// table by one `vpshufb` (signed values −127..113), then Q8_0's sign trick per register and
/// token: |w| · sign(x, w) in `vpmaddubsw` (|127·127·2| < 2^15, exact) and a `vpmaddwd` each,
/// since two such sums could pass i16.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4nl_group<const NT: usize>(gp: *const u8, a: &ActQ8, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(DType::IQ4NL);
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let lut = table(&KVALUES_IQ4NL);
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if NT > 1 && t0 == 0 {
            group_block_ahead::<AHEAD_Q>(b, gbb);
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        let mut s = [_mm256_setzero_si256(); NT];
        for j in 0..4 {
            let v = _mm256_loadu_si256(b.add(16 + 32 * j) as *const __m256i);
            let lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
            let hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            let (alo, ahi) = (_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(hi, hi));
            for t in 0..NT {
                let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK);
                let plo = _mm256_maddubs_epi16(alo, _mm256_sign_epi8(bcast4(xp, 4 * j), lo));
                let phi = _mm256_maddubs_epi16(ahi, _mm256_sign_epi8(bcast4(xp, 16 + 4 * j), hi));
                s[t] = _mm256_add_epi32(s[t], _mm256_add_epi32(_mm256_madd_epi16(plo, ones), _mm256_madd_epi16(phi, ones)));
            }
        }
        for t in 0..NT {
            acc[t] = accumulate(acc[t], dw, a, (t0 + t) * nb + i, s[t]);
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}

/// MXFP4's table values plus 12: 0..=24, unsigned for `vpmaddubsw`.
const MXFP4_PLUS_12: [i8; 16] = {
    let mut t = [0i8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = KVALUES_MXFP4[i] + 12;
        i += 1;
    }
    t
};

/// The 8 rows' E8M0 exponent bytes at `b` as f32 scales, [`crate::blocks::e8m0_half`] per
/// lane: `(e − 1) << 23` as float bits, or the subnormal `0x0020_0000 << e` for `e < 2`.
#[inline(always)]
unsafe fn e8m0_half8(b: *const u8) -> __m256 {
    let e = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b as *const __m128i));
    let normal = _mm256_slli_epi32::<23>(_mm256_sub_epi32(e, _mm256_set1_epi32(1)));
    let subnormal = _mm256_sllv_epi32(_mm256_set1_epi32(0x0020_0000), e);
    let small = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
    _mm256_castsi256_ps(_mm256_blendv_epi8(normal, subnormal, small))
}

/// MXFP4, one 8-row group, NT tokens: Q4_0's registers, each nibble looked up in the table
/// plus 12 by one `vpshufb` (values 0..=24, shared by the tokens), then Q5_0's arithmetic: two
/// registers' `vpmaddubsw` sums stay in i16 (|24·127·2| · 4 = 24,384 < 2^15, exact) before a
/// `vpmaddwd`, and `−12·Σx` brings the block's sum back to the reference's `Σ table[q]·x`.
/// The scale is the row's E8M0 exponent as the scalar reference reads it ([`e8m0_half8`]).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mxfp4_group<const NT: usize>(gp: *const u8, a: &ActQ8, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(DType::MXFP4);
    let quants = 8 * head_bytes(DType::MXFP4);
    let m4 = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let lut = table(&MXFP4_PLUS_12);
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if NT > 1 && t0 == 0 {
            group_block_ahead::<AHEAD_Q>(b, gbb);
        }
        let dw = e8m0_half8(b);
        let mut s = [_mm256_setzero_si256(); NT];
        for half in 0..2 {
            let mut s16 = [_mm256_setzero_si256(); NT];
            for j in 2 * half..2 * half + 2 {
                let v = _mm256_loadu_si256(b.add(quants + 32 * j) as *const __m256i);
                let lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
                let hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
                for t in 0..NT {
                    let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK);
                    let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast4(xp, 4 * j)), _mm256_maddubs_epi16(hi, bcast4(xp, 16 + 4 * j)));
                    s16[t] = _mm256_add_epi16(s16[t], p);
                }
            }
            for t in 0..NT {
                s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(s16[t], ones));
            }
        }
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            let isum = _mm256_add_epi32(s[t], _mm256_set1_epi32(-12 * *a.sum.get_unchecked(ab)));
            acc[t] = accumulate(acc[t], dw, a, ab, isum);
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}

/// Q8_0, one 8-row group, NT tokens. Register `j` of a group-block holds, in lane `r`, row
/// `r`'s values `4j..4j+4`: per register and token one sign trick on the broadcast
/// activation, one `vpmaddubsw` (|w| once per register, shared by the tokens) and one
/// `vpmaddwd`, summed vertically — no horizontal sum, no lane swap.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_group<const NT: usize>(gp: *const u8, a: &ActQ8, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(DType::Q8_0);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if NT > 1 && t0 == 0 {
            group_block_ahead::<AHEAD_Q>(b, gbb);
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        let mut s = [_mm256_setzero_si256(); NT];
        for j in 0..8 {
            let w = _mm256_loadu_si256(b.add(16 + 32 * j) as *const __m256i);
            let aw = _mm256_sign_epi8(w, w);
            for t in 0..NT {
                let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK);
                // |w| × sign(x, w): |128·127·2| < 2^15, exact.
                let m = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(bcast4(xp, 4 * j), w));
                s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(m, ones));
            }
        }
        for t in 0..NT {
            acc[t] = accumulate(acc[t], dw, a, (t0 + t) * nb + i, s[t]);
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}
