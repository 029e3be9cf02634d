//! AVX2 tile kernels of the 256-element formats beyond Q4_K/Q6_K: Q5_K, Q3_K, Q2_K, IQ4_XS,
//! IQ3_XXS and IQ3_S, against Q8_K activations ([`ActQ8K`]) as llama.cpp's `ggml_vec_dot_*_q8_K` pair them. Up to 4
//! weight rows × 1 token, or 1 row × up to 4 tokens, per tile (a decoded super-block takes 16
//! registers); the rows of a one-token tile finish their super-block sums together.
//!
//! Per super-block, the weights are decoded once into 8 registers of 32 values in element
//! order, then per token: `vpmaddubsw` with the activations (unsigned values: Q5_K 0..32, Q2_K
//! 0..4, Q3_K shifted to 0..8; IQ4_XS table values and IQ3 grid values by the sign trick),
//! `vpmaddwd` with the
//! sub-block scales (one per 32 or per 16 elements: the low and high 128-bit lanes then carry
//! different scales), integer adds over the super-block. Constant terms come from the Q8_K
//! block sums: Q5_K / Q2_K mins (a float term, as the scalar reference), Q3_K's −4 shift
//! (subtracted in integers, so the block's sum equals the reference's exactly). One-token calls
//! of the IQ3 formats take their own one-row tile ([`iq3_row`]).
//!
//! Invariant (see `simd/mod.rs`): per super-block the 8 lanes are summed to the reference's
//! exact integer and the float term is the scalar reference's ([`block_term`], done for the
//! tile's rows lane by lane by [`add_block_terms`]), so each (row, token) is bitwise the scalar
//! path's whatever the tile's shape.

use super::avx2_q32::{nibbles, table};
use crate::blocks::*;
use crate::dtype::DType;
use crate::quantize::ActQ8K;
use std::arch::x86_64::*;

/// Format tags for the const-generic kernels ([`tag`]).
pub(crate) const Q5K: u8 = 0;
/// Q3_K's tag.
pub(crate) const Q3K: u8 = 1;
/// Q2_K's tag.
pub(crate) const Q2K: u8 = 2;
/// IQ4_XS's tag.
pub(crate) const IQ4XS: u8 = 3;
/// IQ3_XXS's tag.
pub(crate) const IQ3XXS: u8 = 4;
/// IQ3_S's tag.
pub(crate) const IQ3S: u8 = 5;

/// The format of IQ3 tag `k` (IQ3XXS or IQ3S).
pub(crate) const fn iq3_dtype(k: u8) -> DType {
    if k == IQ3XXS {
        DType::IQ3XXS
    } else {
        DType::IQ3S
    }
}

/// Whether format `K`'s decoded values are signed (IQ4_XS's table values, the IQ3 formats'
/// signed grid values): multiplied by the sign trick, with no block-sum term.
pub(crate) const fn signed(k: u8) -> bool {
    matches!(k, IQ4XS | IQ3XXS | IQ3S)
}

/// The tag of a format this module handles.
pub(crate) fn tag(d: DType) -> Option<u8> {
    match d {
        DType::Q5K => Some(Q5K),
        DType::Q3K => Some(Q3K),
        DType::Q2K => Some(Q2K),
        DType::IQ4XS => Some(IQ4XS),
        DType::IQ3XXS => Some(IQ3XXS),
        DType::IQ3S => Some(IQ3S),
        _ => None,
    }
}

/// Whether this module handles `d`.
pub(crate) fn handles(d: DType) -> bool {
    tag(d).is_some()
}

/// Runs rows `0..nr` (1..=4; `w` the first row's first block, rows `rb` bytes apart) ×
/// `nt` tokens (1..=4) of format `d`.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_tile(d: DType, nr: usize, nt: usize, w: *const u8, rb: usize, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    macro_rules! shape {
        ($k:expr) => {
            match (nr, nt) {
                // Rows longer than a run: one row at a time (sequential reads; see `tile`).
                (_, 1) if a.blocks_per_row > RUN => {
                    for r in 0..nr {
                        tile::<$k, 1, 1>(w.add(r * rb), rb, a, t0, out.add(r), ldo)
                    }
                }
                (1, 1) => tile::<$k, 1, 1>(w, rb, a, t0, out, ldo),
                (1, 2) => tile::<$k, 1, 2>(w, rb, a, t0, out, ldo),
                (1, 3) => tile::<$k, 1, 3>(w, rb, a, t0, out, ldo),
                (1, _) => tile::<$k, 1, 4>(w, rb, a, t0, out, ldo),
                (2, 1) => tile::<$k, 2, 1>(w, rb, a, t0, out, ldo),
                (3, 1) => tile::<$k, 3, 1>(w, rb, a, t0, out, ldo),
                (_, 1) => tile::<$k, 4, 1>(w, rb, a, t0, out, ldo),
                // Several tokens: one row at a time (a decoded super-block takes 16 registers,
                // so several rows × tokens would spill); bitwise the same per (row, token).
                _ => {
                    for r in 0..nr {
                        match nt {
                            2 => tile::<$k, 1, 2>(w.add(r * rb), rb, a, t0, out.add(r), ldo),
                            3 => tile::<$k, 1, 3>(w.add(r * rb), rb, a, t0, out.add(r), ldo),
                            _ => tile::<$k, 1, 4>(w.add(r * rb), rb, a, t0, out.add(r), ldo),
                        }
                    }
                }
            }
        };
    }
    // One token of an IQ3 format: its own one-row tile, row by row.
    macro_rules! iq3_rows {
        ($k:expr) => {
            for r in 0..nr {
                *out.add(r) = iq3_row::<$k>(w.add(r * rb), a, t0);
            }
        };
    }
    match d {
        DType::Q5K => shape!(Q5K),
        DType::Q3K => shape!(Q3K),
        DType::Q2K => shape!(Q2K),
        DType::IQ3XXS if nt == 1 => iq3_rows!(IQ3XXS),
        DType::IQ3S if nt == 1 => iq3_rows!(IQ3S),
        DType::IQ3XXS => shape!(IQ3XXS),
        DType::IQ3S => shape!(IQ3S),
        _ => shape!(IQ4XS),
    }
}

/// Bit `b` of every byte of `v` as the value `VAL` (a power of two) or 0, with no shift per
/// bit (a shift is two µops on Zen 1's one vector-shift pipe, and the decode ran out of that
/// pipe first): bits at or above `VAL`'s are masked and clamped to `VAL` by `vpminub`; lower
/// bits are taken from `up`, which is `v` shifted left (16-bit lanes) by `VAL`'s bit index,
/// so each byte's bit `b` sits at bit `b + log2(VAL)` of the same byte (what crosses in from
/// the neighbour byte lands below that and is masked off).
#[inline(always)]
unsafe fn bit_value<const VAL: u8>(v: __m256i, up: __m256i, b: u32) -> __m256i {
    let shift = VAL.trailing_zeros();
    let (src, mask) = if b >= shift { (v, 1u32 << b) } else { (up, 1u32 << (b + shift)) };
    let x = _mm256_and_si256(src, _mm256_set1_epi8(mask as u8 as i8));
    if mask == VAL as u32 {
        x
    } else {
        _mm256_min_epu8(x, _mm256_set1_epi8(VAL as i8))
    }
}

/// The 8 registers of i16 scales for `vpmaddwd`, from 16 i16 sub-block scales `sc` (scales
/// 0..8 in the low 128-bit lane, 8..16 in the high one): register `g` holds `sc[2g]` in its
/// low lane and `sc[2g + 1]` in its high one (one shuffle each, no shift).
#[inline(always)]
unsafe fn scale_pairs(sc: __m256i) -> [__m256i; 8] {
    let halves = [_mm256_permute4x64_epi64::<0x44>(sc), _mm256_permute4x64_epi64::<0xEE>(sc)];
    let mut s = [_mm256_setzero_si256(); 8];
    for (g, sg) in s.iter_mut().enumerate() {
        // Bytes of i16 lane 2·(g % 4) (low 128-bit lane) and 2·(g % 4) + 1 (high one).
        let lo = (4 * (g % 4)) as i16;
        let ctrl = _mm256_set_m128i(_mm_set1_epi16(((lo + 3) << 8) | (lo + 2)), _mm_set1_epi16(((lo + 1) << 8) | lo));
        *sg = _mm256_shuffle_epi8(halves[g / 4], ctrl);
    }
    s
}

/// Bytes of one super-block of format `K`.
pub(crate) const fn block_bytes(k: u8) -> usize {
    match k {
        Q5K => 176,
        Q3K => 110,
        Q2K => 84,
        IQ3XXS => 98,
        IQ3S => 110,
        _ => 136,
    }
}

/// One super-block decoded for the `vpmaddubsw` dots: `q[g]` the values of elements
/// 32g..32g+32 (unsigned, or the signed values of IQ4_XS's table and the IQ3 formats' grids),
/// `s[g]` the i16 scales of `q[g]`'s byte pairs, `corr_w` the 16 i16 weights of the block-sum
/// term (mins, or Q3_K's scales; zero for the signed formats), `d` / `dmin` the super-block
/// scales.
#[derive(Clone, Copy)]
pub(crate) struct KBlock {
    pub q: [__m256i; 8],
    pub s: [__m256i; 8],
    pub corr_w: __m256i,
    pub d: f32,
    pub dmin: f32,
}

/// The body of [`decode_block`]: the super-block at `$b` (`*const u8`) of format `$k` as a
/// [`KBlock`]. A macro so the decode tiles get it inline whatever the inliner decides (a call
/// per super-block costs the 1-token GEMV); use it only inside an AVX2 `target_feature` fn.
macro_rules! decode_block_body {
    ($k:expr, $b:expr) => {{
        let b: *const u8 = $b;
        let bs = std::slice::from_raw_parts(b, block_bytes($k));
        let m3 = _mm256_set1_epi8(3);
        let mut q = [_mm256_setzero_si256(); 8];
        let mut s = [_mm256_setzero_si256(); 8];
        let mut corr_w = _mm256_setzero_si256();
        let (d, dmin);
        match $k {
            Q5K => {
                d = f16_at(bs, 0);
                dmin = f16_at(bs, 2);
                let (sc, m) = scales_mins_k4(&bs[Q4K_SCALES..]);
                let m8 = _mm_loadl_epi64(m.as_ptr() as *const __m128i);
                corr_w = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));
                let qh = _mm256_loadu_si256(b.add(Q5K_QH) as *const __m256i);
                let qh_up = _mm256_slli_epi16::<4>(qh);
                for c in 0..4 {
                    let v = _mm256_loadu_si256(b.add(Q5K_QS + 32 * c) as *const __m256i);
                    let lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
                    let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
                    q[2 * c] = _mm256_or_si256(lo, bit_value::<16>(qh, qh_up, 2 * c as u32));
                    q[2 * c + 1] = _mm256_or_si256(hi, bit_value::<16>(qh, qh_up, 2 * c as u32 + 1));
                    s[2 * c] = _mm256_set1_epi16(sc[2 * c] as i16);
                    s[2 * c + 1] = _mm256_set1_epi16(sc[2 * c + 1] as i16);
                }
            }
            Q2K => {
                d = f16_at(bs, Q2K_D);
                dmin = f16_at(bs, Q2K_D + 2);
                let sm = _mm_loadu_si128(b as *const __m128i);
                s = scale_pairs(_mm256_cvtepu8_epi16(_mm_and_si128(sm, _mm_set1_epi8(0x0F))));
                corr_w = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sm, 4), _mm_set1_epi8(0x0F)));
                for n in 0..2 {
                    let v = _mm256_loadu_si256(b.add(Q2K_QS + 32 * n) as *const __m256i);
                    for k in 0..4 {
                        q[4 * n + k] = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k as i32)), m3);
                    }
                }
            }
            Q3K => {
                d = f16_at(bs, Q3K_D);
                dmin = 0.0;
                // The scales as 16 bytes in one register (a byte array would be built byte
                // by byte), minus 32.
                let sc = q3k_scale_words(bs);
                let sc8 = _mm_sub_epi8(_mm_loadu_si128(sc.as_ptr() as *const __m128i), _mm_set1_epi8(32));
                corr_w = _mm256_cvtepi8_epi16(sc8);
                s = scale_pairs(corr_w);
                let hm = _mm256_loadu_si256(b as *const __m256i);
                let hm_up = _mm256_slli_epi16::<2>(hm);
                for n in 0..2 {
                    let v = _mm256_loadu_si256(b.add(Q3K_QS + 32 * n) as *const __m256i);
                    for k in 0..4 {
                        let g = 4 * n + k;
                        let lo = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k as i32)), m3);
                        q[g] = _mm256_or_si256(lo, bit_value::<4>(hm, hm_up, g as u32));
                    }
                }
            }
            IQ3XXS | IQ3S => {
                let dt = iq3_dtype($k);
                d = crate::iq3::d_of(dt, bs);
                dmin = 0.0;
                for j in 0..8 {
                    q[j] = iq3_register(dt, bs, j);
                    s[j] = _mm256_set1_epi16(crate::iq3::scale(dt, bs, j) as i16);
                }
            }
            _ => {
                d = f16_at(bs, 0);
                dmin = 0.0;
                let ls = iq4xs_scales(bs);
                for j in 0..8 {
                    q[j] = _mm256_shuffle_epi8(table(&KVALUES_IQ4NL), nibbles(b.add(IQ4XS_QS + 16 * j)));
                    s[j] = _mm256_set1_epi16(ls[j] as i16);
                }
            }
        }
        KBlock { q, s, corr_w, d, dmin }
    }};
}

/// Decodes the super-block at `b` (format `K`): the prefill panels (`k_panel`, `vnni_k`) store it, the
/// decode tiles expand the same [`decode_block_body`], so both see the same integers.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn decode_block<const K: u8>(b: *const u8) -> KBlock {
    decode_block_body!(K, b)
}

/// The 32 signed grid values of IQ3 sub-block `j` (elements `32j..32j + 32`) in one register:
/// its 8 grid entries gathered by scalar loads, their signs applied by one `vpsignb` with a
/// ±1 register (IQ3_XXS: the 4 sign indices' [`crate::iq3::KSIGNS_PM1`] patterns; IQ3_S: its
/// 4 sign bytes spread to bytes by a shuffle, a bit mask and a compare). (Keeping magnitudes
/// and signs apart in the decoded super-block, to sign the activations as ggml's kernels do,
/// ran the tiles 12–25% slower: 8 more registers; only the one-row tile [`iq3_row`] does.)
#[inline(always)]
unsafe fn iq3_register(dt: DType, bs: &[u8], j: usize) -> __m256i {
    let (mag, pm1) = iq3_parts(dt, bs, j);
    _mm256_sign_epi8(mag, pm1)
}

/// [`iq3_register`]'s two parts: the magnitudes and the ±1 signs.
#[inline(always)]
unsafe fn iq3_parts(dt: DType, bs: &[u8], j: usize) -> (__m256i, __m256i) {
    use crate::iq3::{grid, grid_index, IQ3S_SIGNS, IQ3XXS_SS, KSIGNS_PM1};
    let e = |k: usize| grid(dt, grid_index(dt, bs, 8 * j + k)) as i32;
    let mag = _mm256_setr_epi32(e(0), e(1), e(2), e(3), e(4), e(5), e(6), e(7));
    let pm1 = if dt == DType::IQ3XXS {
        let w = u32_at(bs, IQ3XXS_SS + 4 * j);
        let p = |l: u32| KSIGNS_PM1[((w >> (7 * l)) & 127) as usize] as i64;
        _mm256_setr_epi64x(p(0), p(1), p(2), p(3))
    } else {
        // Byte i of the result takes sign byte i / 8, then keeps bit i % 8 of it.
        let sb = _mm256_set1_epi32(u32_at(bs, IQ3S_SIGNS + 4 * j) as i32);
        let spread = _mm256_shuffle_epi8(sb, _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303));
        let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let neg = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
        _mm256_or_si256(neg, _mm256_set1_epi8(1))
    };
    (mag, pm1)
}

/// A super-block's float term from its exact integers, as the scalar reference forms it:
/// `(d·dx)·isum − (dmin·dx)·msum` (Q5_K, Q2_K; `corr` = msum), `(d·dx)·(isum − 4·corr)` (Q3_K;
/// `corr` = Σ_j sc_j·bsum_j), `(d·dx)·isum` (IQ4_XS, IQ3_XXS, IQ3_S). The caller adds it to its
/// accumulator.
#[inline(always)]
pub(crate) fn block_term<const K: u8>(isum: i32, corr: i32, d: f32, dmin: f32, dx: f32) -> f32 {
    match K {
        IQ4XS | IQ3XXS | IQ3S => d * dx * isum as f32,
        Q3K => d * dx * (isum - 4 * corr) as f32,
        _ => d * dx * isum as f32 - dmin * dx * corr as f32,
    }
}

/// The exact lane sums of up to four vectors: lane `r` of the result = Σ lanes of `v[r]`
/// (missing rows zero).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn hsum_rows<const NR: usize>(v: &[__m256i; NR]) -> __m128i {
    let z = _mm256_setzero_si256();
    let at = |r: usize| if r < NR { v[r] } else { z };
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(at(0), at(1)), _mm256_hadd_epi32(at(2), at(3)));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// Super-blocks a multi-row tile runs through one row after another before the next row.
pub(crate) const RUN: usize = 8;

/// `NR` rows × `NT` tokens. Per super-block and (row, token): the exact integer sums (lanes of
/// `vpmaddwd` results, summed across lanes for all rows at once by [`hsum_rows`]), then
/// [`block_term`]'s float operations on the 4-lane vector whose lane `r` is row `r` (one row
/// × several tokens: lane `t` is token `t`, all tokens' sums in one tree) — the same IEEE
/// operations in the same order as the scalar reference, so bitwise its result.
///
/// Memory order: each row is read sequentially through a run of [`RUN`] super-blocks, then the
/// next row, and the run's float terms follow in block order; rows longer than a run go one
/// at a time ([`rows_tile`]). (Reading the rows' blocks in turn, block by block, or in runs
/// shorter than the row, is interleaved streams that the hardware prefetchers did not follow:
/// decode from DRAM ran at half speed on Zen 4.)
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const K: u8, const NR: usize, const NT: usize>(w: *const u8, rb: usize, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let bb = block_bytes(K);
    let nb = a.blocks_per_row;
    // One row: a run of one block, its sums stay in registers.
    let run = if NR == 1 { 1 } else { RUN };
    let mut acc = [_mm_setzero_ps(); NT];
    // One row × several tokens: lane t is token t's accumulator.
    let mut acc_tokens = _mm_setzero_ps();
    let mut i0 = 0;
    while i0 < nb {
        let n = run.min(nb - i0);
        // isum[k][t][r]: row r's lanes of block i0 + k's integer sum against token t (Q3_K:
        // with the −4 shift folded in, exact); msum: Q5_K / Q2_K's block-sum term.
        let mut isum = [[[_mm256_setzero_si256(); NR]; NT]; RUN];
        let mut msum = [[[_mm256_setzero_si256(); NR]; NT]; RUN];
        let (mut d, mut dmin) = ([[0f32; 4]; RUN], [[0f32; 4]; RUN]);
        for r in 0..NR {
            for k in 0..n {
                let i = i0 + k;
                let KBlock { q, s, corr_w, d: dr, dmin: mr } = decode_block_body!(K, w.add(r * rb + i * bb));
                d[k][r] = dr;
                dmin[k][r] = mr;
                for t in 0..NT {
                    let ab = (t0 + t) * nb + i;
                    let xp = a.qs.as_ptr().add(ab * QK_K);
                    let mut v = _mm256_setzero_si256();
                    for g in 0..8 {
                        let xv = _mm256_loadu_si256(xp.add(32 * g) as *const __m256i);
                        let p = if signed(K) {
                            _mm256_maddubs_epi16(_mm256_sign_epi8(q[g], q[g]), _mm256_sign_epi8(xv, q[g]))
                        } else {
                            _mm256_maddubs_epi16(q[g], xv)
                        };
                        v = _mm256_add_epi32(v, _mm256_madd_epi16(p, s[g]));
                    }
                    if !signed(K) {
                        let bsv = _mm256_loadu_si256(a.bsums.as_ptr().add(ab * 16) as *const __m256i);
                        let c = _mm256_madd_epi16(bsv, corr_w);
                        if K == Q3K {
                            v = _mm256_sub_epi32(v, _mm256_slli_epi32::<2>(c));
                        } else {
                            msum[k][t][r] = c;
                        }
                    }
                    isum[k][t][r] = v;
                }
            }
        }
        if NR == 1 && NT > 1 {
            // One row, several tokens (a run of one block): the tokens' sums in the lanes of
            // one tree, and the block term for all of them at once, lane t = token t.
            let sums = |v: &[[__m256i; NR]; NT]| hsum_rows::<NT>(&std::array::from_fn(|t| v[t][0]));
            let dx: [f32; 4] = std::array::from_fn(|t| if t < NT { *a.d.get_unchecked((t0 + t) * nb + i0) } else { 0.0 });
            let (d, dmin) = (_mm_set1_ps(d[0][0]), _mm_set1_ps(dmin[0][0]));
            let mv = if K == Q5K || K == Q2K { sums(&msum[0]) } else { _mm_setzero_si128() };
            acc_tokens = add_block_terms::<K>(acc_tokens, d, dmin, _mm_loadu_ps(dx.as_ptr()), sums(&isum[0]), mv);
            i0 += n;
            continue;
        }
        for k in 0..n {
            for t in 0..NT {
                let dx = *a.d.get_unchecked((t0 + t) * nb + i0 + k);
                let (iv, mv) = if K != Q5K && K != Q2K {
                    (hsum_rows(&isum[k][t]), _mm_setzero_si128())
                } else if NR == 1 {
                    // One row: both sums in one tree (lane 0 the integer sum, lane 1 the mins').
                    let both = hsum_rows(&[isum[k][t][0], msum[k][t][0]]);
                    (both, _mm_shuffle_epi32::<1>(both))
                } else {
                    (hsum_rows(&isum[k][t]), hsum_rows(&msum[k][t]))
                };
                acc[t] = add_block_terms::<K>(acc[t], _mm_loadu_ps(d[k].as_ptr()), _mm_loadu_ps(dmin[k].as_ptr()), _mm_set1_ps(dx), iv, mv);
            }
        }
        i0 += n;
    }
    if NR == 1 && NT > 1 {
        let mut l = [0f32; 4];
        _mm_storeu_ps(l.as_mut_ptr(), acc_tokens);
        for (t, x) in l.iter().take(NT).enumerate() {
            *out.add(t * ldo) = *x;
        }
        return;
    }
    for t in 0..NT {
        store_rows::<NR>(acc[t], out.add(t * ldo));
    }
}

/// One row × one token of an IQ3 format (decode; [`rows_tile`] sends every one-token IQ3 call
/// here, row by row): each sub-block's register is built and multiplied at once, instead of the
/// whole super-block decoded first (16 registers, which spilled); the same integers and
/// [`block_term`] as the tile, so the same bits.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3_row<const K: u8>(w: *const u8, a: &ActQ8K, t0: usize) -> f32 {
    let dt = iq3_dtype(K);
    let (nb, bb) = (a.blocks_per_row, block_bytes(K));
    let mut acc = _mm_setzero_ps();
    for i in 0..nb {
        let bs = std::slice::from_raw_parts(w.add(i * bb), bb);
        let ab = t0 * nb + i;
        let xp = a.qs.as_ptr().add(ab * QK_K);
        let mut v = _mm256_setzero_si256();
        for j in 0..8 {
            // The activations take the weights' signs (as ggml's kernels do): |w|·(x·sign w).
            let (mag, pm1) = iq3_parts(dt, bs, j);
            let xv = _mm256_loadu_si256(xp.add(32 * j) as *const __m256i);
            let p = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(xv, pm1));
            v = _mm256_add_epi32(v, _mm256_madd_epi16(p, _mm256_set1_epi16(crate::iq3::scale(dt, bs, j) as i16)));
        }
        let (d, dx) = (_mm_set1_ps(crate::iq3::d_of(dt, bs)), _mm_set1_ps(*a.d.get_unchecked(ab)));
        acc = add_block_terms::<K>(acc, d, d, dx, hsum_rows::<1>(&[v]), _mm_setzero_si128());
    }
    _mm_cvtss_f32(acc)
}

/// `acc + block term` for 4 lanes at once — rows of one token (`d`, `dmin` per lane, `dx`
/// broadcast) or tokens of one row (`d`, `dmin` broadcast, `dx` per lane); `isum`, `msum` the
/// lanes' exact integers: [`block_term`]'s operations in its order, lane by lane — `(d·dx)·isum`,
/// minus `(dmin·dx)·msum` for Q5_K / Q2_K — so each lane is bitwise the scalar reference's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn add_block_terms<const K: u8>(
    acc: __m128,
    d: __m128,
    dmin: __m128,
    dx: __m128,
    isum: __m128i,
    msum: __m128i,
) -> __m128 {
    let term = _mm_mul_ps(_mm_mul_ps(d, dx), _mm_cvtepi32_ps(isum));
    let term = if K == Q5K || K == Q2K { _mm_sub_ps(term, _mm_mul_ps(_mm_mul_ps(dmin, dx), _mm_cvtepi32_ps(msum))) } else { term };
    _mm_add_ps(acc, term)
}

/// Writes lanes `0..NR` of `v` to `out[0..NR]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn store_rows<const NR: usize>(v: __m128, out: *mut f32) {
    let mut l = [0f32; 4];
    _mm_storeu_ps(l.as_mut_ptr(), v);
    for (r, x) in l.iter().take(NR).enumerate() {
        *out.add(r) = *x;
    }
}
