//! AVX-512 kernels over Q4_K, Q5_K, Q6_K and IQ4_XS [`Packed`] weights (layout: `repack_k.rs`, the one
//! `avx2_packed_k.rs` streams): 8 rows × 2 to 8 tokens per call, in 512-bit registers (all 8
//! rows of a piece in one register). The matmul sends one-token calls to `avx2_packed_k` unless
//! the CPU's table row names the format in `dispatch::wide_one_token`: here the compiler may
//! hoist a block's later loads ahead of its first, and on Zen 4 a one-token call on a matrix
//! larger than the L3 then ran 2-6x slower (`bench kernels --rows 32000 --cols 2048 --tokens 1`;
//! with software prefetch 1.6x slower); on the Intel Xeon measured it ran 1.03-1.17x faster, and
//! faster again with the prefetch every first pass makes (`prefetch.rs`).
//!
//! Q4_K: a group-super-block's nibbles are unpacked once per call into 8 registers per 64-element
//! chunk (all 8 rows' 8 bytes of a piece in one register) and shared by the call's tokens; per
//! token, one `vpdpbusd` per register against the activation's 8 bytes broadcast sums 4
//! products straight into i32 (2 dwords per row), and one `vpmaddwd` per sub-block applies
//! the scale (a dword sums 16 products, |Σ| ≤ 16·15·128 = 30,720, so it is exact as an i16 and
//! the scale sits in the dword's low word, 0 in the high word). Against the 256-bit version
//! (4 rows per register) this halves the instructions per token: one broadcast, `vpdpbusd`
//! and `vpmaddwd` serve 8 rows. The mins and the float term are the AVX2 kernel's.
//!
//! Q6_K: `vpmaddubsw` of the unsigned 6-bit values against the broadcast activation bytes, the
//! two pieces of a 16-value sub-block added in i16, one `vpdpwssd` with the rows' scales (a
//! `vpdpbusd` version, whose 4-product sums must be scaled one by one with `vpmaddwd` since 8
//! products pass i16, measured 0.86–1.03× of the AVX2 kernel and was not kept).
//!
//! Invariant: per (row, token, super-block) the exact integers of the scalar reference, then
//! its float term (Q4_K `acc += (d·d_x)·isum − (dmin·d_x)·msum`, Q6_K `acc += (d·d_x)·isum`),
//! super-blocks in order, `acc` from +0.0, no fused multiply-add: bitwise the scalar path's and
//! `avx2_packed_k`'s result, for any number of tokens in the call.

use super::avx2_packed::bcast4;
use super::prefetch::{group_block_ahead, AHEAD_K};
use super::TileCtx;
use crate::blocks::{KVALUES_IQ4NL, QK_K};
use crate::dtype::DType;
use crate::quantize::ActQ8K;
use crate::repack::{group_block_bytes, Packed, GROUP_ROWS};
use crate::repack_k::{q4k_reg, q5k_qh_reg, q5k_reg, q6k_reg, HALF_ROWS, IQ4XS_P_QS, IQ4XS_P_SC, Q4K_P_MIN, Q4K_P_SC, Q6K_P_SC};
use std::arch::x86_64::*;

/// Largest token tile of one call.
pub(crate) const MAX_TOKENS: usize = 8;

/// Computes output rows `r0..r1` (multiples of 8) for every token of the call.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and AVX2/FMA/F16C available; `p` is the (Q4_K, Q5_K, Q6_K or IQ4_XS) packing of
/// `c.w`, `a` its prepared activations; no other thread writes those rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn run_rows(c: &TileCtx, a: &ActQ8K, p: &Packed, r0: usize, r1: usize, n_tokens: usize) {
    debug_assert!(r0 % GROUP_ROWS == 0 && r1 % GROUP_ROWS == 0);
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = super::even_pass(n_tokens - t0, MAX_TOKENS);
        for g in r0 / GROUP_ROWS..r1 / GROUP_ROWS {
            let gp = p.group(g).as_ptr();
            let out = c.out.add(t0 * c.ldo + g * GROUP_ROWS);
            macro_rules! by_nt {
                ($f:ident $(, $x:expr)?) => {
                    match nt {
                        1 => $f::<1 $(, $x)?>(gp, a, t0, out, c.ldo),
                        2 => $f::<2 $(, $x)?>(gp, a, t0, out, c.ldo),
                        3 => $f::<3 $(, $x)?>(gp, a, t0, out, c.ldo),
                        4 => $f::<4 $(, $x)?>(gp, a, t0, out, c.ldo),
                        5 => $f::<5 $(, $x)?>(gp, a, t0, out, c.ldo),
                        6 => $f::<6 $(, $x)?>(gp, a, t0, out, c.ldo),
                        7 => $f::<7 $(, $x)?>(gp, a, t0, out, c.ldo),
                        _ => $f::<8 $(, $x)?>(gp, a, t0, out, c.ldo),
                    }
                };
            }
            match p.dtype() {
                DType::Q4K => by_nt!(q4k_group, false),
                DType::Q5K => by_nt!(q4k_group, true),
                DType::Q6K => by_nt!(q6k_group),
                DType::IQ4XS => by_nt!(iq4xs_group),
                _ => unreachable!("only Q4_K / Q5_K / Q6_K / IQ4_XS take these kernels"),
            }
        }
        t0 += nt;
    }
}

/// `vpshufb` control picking, for byte `k` of an `N`-byte vector, the scale of sub-block `j`
/// of row [`REG_ROWS`]`[k · 8 / N]` from a pair's 16 scale bytes (`[r][j]`, `repack_k.rs`;
/// for `N` = 32, in both 128-bit lanes). Widened, element `k` then holds the scale of the row
/// whose 64-bit lane holds element `k` of a 512-bit product register: Q4_K `vpmovzxbd` (16
/// dwords, scale in the low word, 0 in the high word, as `vpmaddwd` takes it), Q6_K
/// `vpmovsxbw` (32 i16 words, as `vpdpwssd` takes them).
const fn scale_ctrl<const N: usize>(j: usize) -> [u8; N] {
    let mut c = [0u8; N];
    let mut k = 0;
    while k < N {
        c[k] = (2 * REG_ROWS[k * 8 / N] + j) as u8;
        k += 1;
    }
    c
}

/// Dword of `vpackssdw(S, S)` (S: the 8 sub-block sums as i32) holding the i16 pair of
/// sub-blocks `2p, 2p + 1` (`vpackssdw` works per 128-bit lane).
const PAIR_DWORD: [i32; 4] = [0, 1, 4, 5];

/// [`scale_ctrl`] of the pair's sub-blocks 0 and 1, for Q4_K's dwords.
const Q4K_CTRL: [[u8; 16]; 2] = [scale_ctrl(0), scale_ctrl(1)];

/// Row of each 64-bit lane of a 512-bit nibble register: half 0 (`HALF_ROWS[0]`) in the low
/// 256 bits, half 1 in the high.
const REG_ROWS: [usize; 8] = [
    HALF_ROWS[0][0],
    HALF_ROWS[0][1],
    HALF_ROWS[0][2],
    HALF_ROWS[0][3],
    HALF_ROWS[1][0],
    HALF_ROWS[1][1],
    HALF_ROWS[1][2],
    HALF_ROWS[1][3],
];

/// Q4_K (`FIFTH`: Q5_K), one 8-row group, NT tokens. Per chunk `c` and piece `m` one 512-bit
/// register holds all 8 rows' 8 bytes ([`q4k_reg`]`(c, m, 0..2)`, adjacent), so per token one
/// `vpdpbusd` against the activation's 8 bytes broadcast to every 64-bit lane covers 8 rows × 8
/// values of a sub-block. A dword sums a row's 16 products of one sub-block over the 4 pieces
/// (|Σ| ≤ 16·15·128 = 30,720, exact as an i16), so one `vpmaddwd` with the scales applies the
/// sub-block scale. Q5_K ORs each piece's fifth bits (its register of the rows' `qh` bytes,
/// [`q5k_qh_reg`], bit `2c` / `2c + 1` to bit 4) into the nibbles; its values reach 31, so a
/// dword sums 2 pieces (|Σ| ≤ 8·31·128 = 31,744) and each sub-block takes two `vpmaddwd`. The
/// mins' term is formed per token after the chunks, from the scale bytes' mins and the tokens'
/// block sums, while the nibble registers are no longer live (8 tokens' sums and accumulators
/// fit the 32 registers).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q4k_group<const NT: usize, const FIFTH: bool>(gp: *const u8, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(if FIFTH { DType::Q5K } else { DType::Q4K });
    let m4 = _mm512_set1_epi8(0x0F);
    let b16 = _mm512_set1_epi8(0x10);
    let ones = _mm256_set1_epi16(1);
    let ctrl_lo = _mm_loadu_si128(Q4K_CTRL[0].as_ptr() as *const __m128i);
    let ctrl_hi = _mm_loadu_si128(Q4K_CTRL[1].as_ptr() as *const __m128i);
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if t0 == 0 {
            group_block_ahead::<AHEAD_K>(b, gbb);
        }
        let mut isum = [_mm512_setzero_si512(); NT];
        let mut qh = [_mm512_setzero_si512(); 4];
        if FIFTH {
            for (m, qh) in qh.iter_mut().enumerate() {
                *qh = _mm512_loadu_si512(b.add(q5k_qh_reg(m, 0)) as *const __m512i);
            }
        }
        for c in 0..4 {
            let sc = _mm_loadu_si128(b.add(Q4K_P_SC + 16 * c) as *const __m128i);
            let slo = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(sc, ctrl_lo));
            let shi = _mm512_cvtepu8_epi32(_mm_shuffle_epi8(sc, ctrl_hi));
            let mut lo = [_mm512_setzero_si512(); 4];
            let mut hi = [_mm512_setzero_si512(); 4];
            for m in 0..4 {
                let at = if FIFTH { q5k_reg(c, m, 0) } else { q4k_reg(c, m, 0) };
                let w = _mm512_loadu_si512(b.add(at) as *const __m512i);
                lo[m] = _mm512_and_si512(w, m4);
                hi[m] = _mm512_and_si512(_mm512_srli_epi16(w, 4), m4);
                if FIFTH {
                    // Bit 2c of a `qh` byte is the fifth bit of its low-nibble element, bit 2c + 1
                    // of its high-nibble one: both moved to bit 4.
                    let q = _mm512_srl_epi16(qh[m], _mm_cvtsi32_si128(2 * c as i32));
                    lo[m] = _mm512_or_si512(lo[m], _mm512_and_si512(_mm512_slli_epi16(q, 4), b16));
                    hi[m] = _mm512_or_si512(hi[m], _mm512_and_si512(_mm512_slli_epi16(q, 3), b16));
                }
            }
            for t in 0..NT {
                let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K + 64 * c);
                let s = if FIFTH {
                    // Two pieces per dword (values up to 31).
                    let mut p = [_mm512_setzero_si512(); 4];
                    for m in 0..4 {
                        p[m / 2] = _mm512_dpbusd_epi32(p[m / 2], lo[m], bcast8(xp.add(8 * m)));
                        p[2 + m / 2] = _mm512_dpbusd_epi32(p[2 + m / 2], hi[m], bcast8(xp.add(32 + 8 * m)));
                    }
                    let slo2 = _mm512_add_epi32(_mm512_madd_epi16(p[0], slo), _mm512_madd_epi16(p[1], slo));
                    _mm512_add_epi32(slo2, _mm512_add_epi32(_mm512_madd_epi16(p[2], shi), _mm512_madd_epi16(p[3], shi)))
                } else {
                    let mut plo = _mm512_setzero_si512();
                    let mut phi = _mm512_setzero_si512();
                    for m in 0..4 {
                        plo = _mm512_dpbusd_epi32(plo, lo[m], bcast8(xp.add(8 * m)));
                        phi = _mm512_dpbusd_epi32(phi, hi[m], bcast8(xp.add(32 + 8 * m)));
                    }
                    _mm512_add_epi32(_mm512_madd_epi16(plo, slo), _mm512_madd_epi16(phi, shi))
                };
                isum[t] = _mm512_add_epi32(isum[t], s);
            }
        }
        // (Plain loops, not closures: a closure does not inherit the target features, and an
        // intrinsic outside them is a function call.)
        let mut mn = [_mm256_setzero_si256(); 4];
        for (c, mn) in mn.iter_mut().enumerate() {
            *mn = _mm256_cvtepu8_epi16(_mm_loadu_si128(b.add(Q4K_P_MIN + 16 * c) as *const __m128i));
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(b.add(16) as *const __m128i));
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            // S_j = bsum[2j] + bsum[2j+1] (sub-block j's 32 values, |S_j| ≤ 4064 fits i16);
            // dword `PAIR_DWORD[p]` of `s16` is the i16 pair (S_2p, S_2p+1).
            let s32 = _mm256_madd_epi16(_mm256_loadu_si256(a.bsums.as_ptr().add(ab * 16) as *const __m256i), ones);
            let s16 = _mm256_packs_epi32(s32, s32);
            let mut msum = _mm256_setzero_si256();
            for (c, mn) in mn.iter().enumerate() {
                let sp = _mm256_permutevar8x32_epi32(s16, _mm256_set1_epi32(PAIR_DWORD[c]));
                msum = _mm256_add_epi32(msum, _mm256_madd_epi16(*mn, sp));
            }
            // The halves' row pairs summed: lane order rows 0..8 (as `avx2_packed_k`'s `vphaddd`).
            let h0 = _mm512_castsi512_si256(isum[t]);
            let h1 = _mm512_extracti64x4_epi64::<1>(isum[t]);
            let dx = _mm256_set1_ps(*a.d.get_unchecked(ab));
            let x1 = _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(_mm256_hadd_epi32(h0, h1)));
            let x2 = _mm256_mul_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(msum));
            acc[t] = _mm256_add_ps(acc[t], _mm256_sub_ps(x1, x2));
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}

/// [`scale_ctrl`] of the pair's sub-blocks 0 and 1, for Q6_K's words.
const Q6K_CTRL: [[u8; 32]; 2] = [scale_ctrl(0), scale_ctrl(1)];

/// Q6_K, one 8-row group, NT tokens. Per chunk `c` the 6 bit registers of both halves load as
/// three 512-bit registers per piece pair `k`, and build 4 registers of unsigned 6-bit values
/// `u = q + 32` for all 8 rows (the AVX2 kernel's shifts and masks). Per token, `vpmaddubsw`
/// against the activation's broadcast 8 bytes gives i16 sums of 2 products; a sub-block's two
/// pieces add in i16 (|Σ| ≤ 4·63·128 = 32,256), and one `vpdpwssd` with the rows' i16 scales
/// accumulates them into i32. The `−32` offset, `32·Σ_j sc_j·S_j`, is formed per token after
/// the chunks from the scale pairs and the tokens' block sums.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q6k_group<const NT: usize>(gp: *const u8, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(DType::Q6K);
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let ctrl = [_mm256_loadu_si256(Q6K_CTRL[0].as_ptr() as *const __m256i), _mm256_loadu_si256(Q6K_CTRL[1].as_ptr() as *const __m256i)];
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if t0 == 0 {
            group_block_ahead::<AHEAD_K>(b, gbb);
        }
        let mut isum = [_mm512_setzero_si512(); NT];
        for c in 0..4 {
            // Pair 2c: sub-blocks 4c, 4c+1 (low nibbles); pair 2c+1: 4c+2, 4c+3 (high nibbles).
            let pa = _mm256_broadcastsi128_si256(_mm_loadu_si128(b.add(Q6K_P_SC + 32 * c) as *const __m128i));
            let pb = _mm256_broadcastsi128_si256(_mm_loadu_si128(b.add(Q6K_P_SC + 32 * c + 16) as *const __m128i));
            for k in 0..2 {
                let qh = _mm512_loadu_si512(b.add(q6k_reg(c, 3 * k, 0)) as *const __m512i);
                let w0 = _mm512_loadu_si512(b.add(q6k_reg(c, 3 * k + 1, 0)) as *const __m512i);
                let w1 = _mm512_loadu_si512(b.add(q6k_reg(c, 3 * k + 2, 0)) as *const __m512i);
                let lo0 = _mm512_or_si512(_mm512_and_si512(w0, m4), _mm512_and_si512(_mm512_slli_epi16(qh, 4), m30));
                let hi0 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w0, 4), m4), _mm512_and_si512(_mm512_slli_epi16(qh, 2), m30));
                let lo1 = _mm512_or_si512(_mm512_and_si512(w1, m4), _mm512_and_si512(qh, m30));
                let hi1 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(w1, 4), m4), _mm512_and_si512(_mm512_srli_epi16(qh, 2), m30));
                let slo = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(pa, ctrl[k]));
                let shi = _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(pb, ctrl[k]));
                for t in 0..NT {
                    let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K + 64 * c + 16 * k);
                    let plo = _mm512_add_epi16(_mm512_maddubs_epi16(lo0, bcast8(xp)), _mm512_maddubs_epi16(lo1, bcast8(xp.add(8))));
                    let phi =
                        _mm512_add_epi16(_mm512_maddubs_epi16(hi0, bcast8(xp.add(32))), _mm512_maddubs_epi16(hi1, bcast8(xp.add(40))));
                    isum[t] = _mm512_dpwssd_epi32(_mm512_dpwssd_epi32(isum[t], plo, slo), phi, shi);
                }
            }
        }
        // Dword `r` of pair `p`: row r's i16 scales of sub-blocks 2p, 2p + 1.
        let mut pairs = [_mm256_setzero_si256(); 8];
        for (p, sp) in pairs.iter_mut().enumerate() {
            *sp = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(Q6K_P_SC + 16 * p) as *const __m128i));
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            // Σ_j sc_j · bsum_j per row (the −32 offset), j over the 16 sub-blocks.
            let bs = a.bsums.as_ptr().add(ab * 16);
            let mut corr = _mm256_setzero_si256();
            for (p, sp) in pairs.iter().enumerate() {
                let bp = _mm256_set1_epi32((bs.add(2 * p) as *const i32).read_unaligned());
                corr = _mm256_add_epi32(corr, _mm256_madd_epi16(*sp, bp));
            }
            let h0 = _mm512_castsi512_si256(isum[t]);
            let h1 = _mm512_extracti64x4_epi64::<1>(isum[t]);
            let isum = _mm256_sub_epi32(_mm256_hadd_epi32(h0, h1), _mm256_slli_epi32(corr, 5));
            let dx = _mm256_set1_ps(*a.d.get_unchecked(ab));
            acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum)));
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}

/// IQ4_XS, one 8-row group, NT tokens, one row per 32-bit lane (the AVX2 kernel's registers,
/// `repack_k.rs`): per sub-block `j` its 4 registers' nibbles looked up as table value + 128
/// (unsigned, one `vpshufb` each), per token 8 `vpdpbusd` against the activation's 4 bytes
/// broadcast, in two chains; `Σ (w + 128)·x − 128·S_j = Σ w·x` (`S_j` the sub-block's
/// activation sum, from the Q8_K block sums), then one `vpmulld` by the rows' scales
/// `ls − 32`. Every partial sum is exact in i32: |Σ w·x| ≤ 32·127·128 < 2^19, times |ls − 32|
/// ≤ 32, over 8 sub-blocks < 2^27. Then `acc += (d·d_x)·isum`, as the scalar reference.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn iq4xs_group<const NT: usize>(gp: *const u8, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(DType::IQ4XS);
    let m4 = _mm256_set1_epi8(0x0F);
    let lut = _mm512_castsi512_si256(super::avx512::table_plus_128(&KVALUES_IQ4NL));
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if t0 == 0 {
            group_block_ahead::<AHEAD_K>(b, gbb);
        }
        let mut isum = [_mm256_setzero_si256(); NT];
        for j in 0..8 {
            let sc = _mm256_cvtepi8_epi32(_mm_loadl_epi64(b.add(IQ4XS_P_SC + 8 * j) as *const __m128i));
            // u[k]: elements 32j + 4k..+4 (low nibbles); u[4 + k]: 32j + 16 + 4k..+4 (high).
            let mut u = [_mm256_setzero_si256(); 8];
            for k in 0..4 {
                let v = _mm256_loadu_si256(b.add(IQ4XS_P_QS + 32 * (4 * j + k)) as *const __m256i);
                u[k] = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
                u[4 + k] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
            }
            for t in 0..NT {
                let ab = (t0 + t) * nb + i;
                let xp = a.qs.as_ptr().add(ab * QK_K + 32 * j);
                let bs = a.bsums.as_ptr().add(ab * 16 + 2 * j);
                let mut s0 = _mm256_set1_epi32(-128 * (*bs as i32 + *bs.add(1) as i32));
                let mut s1 = _mm256_setzero_si256();
                for k in 0..4 {
                    s0 = _mm256_dpbusd_epi32(s0, u[k], bcast4(xp, 4 * k));
                    s1 = _mm256_dpbusd_epi32(s1, u[4 + k], bcast4(xp, 16 + 4 * k));
                }
                isum[t] = _mm256_add_epi32(isum[t], _mm256_mullo_epi32(_mm256_add_epi32(s0, s1), sc));
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

/// 8 activation bytes at `p` in all eight 64-bit lanes.
#[inline(always)]
unsafe fn bcast8(p: *const i8) -> __m512i {
    _mm512_set1_epi64((p as *const i64).read_unaligned())
}
