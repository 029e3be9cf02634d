//! AVX-512 VNNI kernels over Q4_0 / Q8_0 / Q4_1 / IQ4_NL [`Packed`] weights (the AVX2 kernels' layout,
//! `repack.rs`): 8 rows × up to 16 tokens per pass, taking calls of 2 or more tokens, and one-token
//! calls where the CPU's table row says so (`dispatch::wide_one_token`; elsewhere the matmul
//! sends them to `avx2_packed.rs`); Q4_K / Q6_K packings go on to `avx512_packed_k.rs`.
//! Two consecutive groups go through one pass as 16 rows in 512-bit registers, so one broadcast
//! activation load and one float epilogue serve 16 rows.
//!
//! The weights of a group-block are unpacked **once per call** into byte registers kept across
//! the call's tokens (Q4_0 / Q4_1: the nibbles as unsigned bytes 0..15, 8 registers; Q8_0:
//! `w ^ 0x80` = `w + 128`, 8 registers; IQ4_NL: each nibble's table value + 128, one `vpshufb`
//! per register), and each token then costs one `vpdpbusd` per register
//! (its 4 activation bytes broadcast from memory, 32 multiply-adds straight into the rows' i32
//! lanes) and the float epilogue: against the AVX2 kernels' `vpmaddubsw` + i16 add per register
//! and `vpmaddwd` per block (Q8_0: sign trick, `vpmaddubsw`, `vpmaddwd`, add) that is about half
//! the instructions per extra token, and with 32 registers 16 tokens' accumulators stay live.
//!
//! Invariant: the same integers as the AVX2 kernels and the scalar reference (`vpdpbusd` adds
//! exact products into i32 without saturation; Q4_0 `Σ q·x − 8·Σx`, Q8_0 and IQ4_NL
//! `Σ (w+128)·x − 128·Σx` = `Σ w·x`, the offsets being the prepared activations' `bias`), then per (row, token)
//! the reference's float operations in its order — `acc += (d_w · d_x) · isum` (Q4_1: `acc +
//! ((d_w · d_x) · isum + m_w · s_x)`), blocks in order, `acc` from +0.0, no fused multiply-add
//! — so the result is bitwise the scalar path's and the AVX2 packed kernels', for any number of
//! tokens in the call.

use super::prefetch::{group_block_at, pair_ahead};
use super::{Acts, TileCtx};
use crate::blocks::{KVALUES_IQ4NL, QK};
use crate::dtype::DType;
use crate::quantize::ActQ8;
use crate::repack::{group_block_bytes, Packed, GROUP_ROWS};
use std::arch::x86_64::*;

/// Whether these kernels take packed matrices of `dtype` (Q4_0 / Q8_0 / Q4_1 / IQ4_NL, and the
/// K-quants through `avx512_packed_k`); other packings run the AVX2 kernels on AVX-512 CPUs.
pub(crate) fn takes(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_0 | DType::Q8_0 | DType::Q4_1 | DType::IQ4NL | DType::Q4K | DType::Q5K | DType::Q6K | DType::IQ4XS)
}

/// Most tokens of one pass (16 tokens' float accumulators, the 8 unpacked weight registers and
/// one token's integer sums fit the 32 vector registers). The weights are unpacked once per
/// pass: a 9-row step (a tree of 8 drafts) of the llama-1b Q4_0 file in one pass instead of
/// 5 + 4 cost 7-10% less time on the AMX Xeon (docs/cpu-kernels.md).
pub(crate) const MAX_TOKENS: usize = 16;

/// Computes output rows `r0..r1` (multiples of 8) for every token of the call (any packed
/// format).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and AVX2/FMA/F16C available; `p` is the packing of `c.w`; no other
/// thread writes those rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn run_rows(c: &TileCtx, p: &Packed, r0: usize, r1: usize, n_tokens: usize) {
    let a = match c.acts {
        Acts::Q8(a) => a,
        Acts::Q8K(a) => return super::avx512_packed_k::run_rows(c, a, p, r0, r1, n_tokens),
        Acts::F32(_) => unreachable!("float weights are never packed"),
    };
    debug_assert!(r0 % GROUP_ROWS == 0 && r1 % GROUP_ROWS == 0);
    let ahead = pair_ahead(a.blocks_per_row * group_block_bytes(p.dtype()));
    let mut t0 = 0;
    while t0 < n_tokens {
        let nt = super::even_pass(n_tokens - t0, MAX_TOKENS);
        let (g0, g1) = (r0 / GROUP_ROWS, r1 / GROUP_ROWS);
        let mut g = g0;
        while g < g1 {
            // Two groups (16 rows) per pass while there are two; a last odd group alone.
            let two = g + 1 < g1;
            let gp = p.group(g).as_ptr();
            let gq = if two { p.group(g + 1).as_ptr() } else { gp };
            let out = c.out.add(t0 * c.ldo + g * GROUP_ROWS);
            // One kernel instance per token count of a pass (1..=MAX_TOKENS).
            macro_rules! by_nt {
                ($f:ident, $k:expr, ($($arg:expr),*)) => {
                    match nt {
                        1 => $f::<$k, 1>($($arg),*),
                        2 => $f::<$k, 2>($($arg),*),
                        3 => $f::<$k, 3>($($arg),*),
                        4 => $f::<$k, 4>($($arg),*),
                        5 => $f::<$k, 5>($($arg),*),
                        6 => $f::<$k, 6>($($arg),*),
                        7 => $f::<$k, 7>($($arg),*),
                        8 => $f::<$k, 8>($($arg),*),
                        9 => $f::<$k, 9>($($arg),*),
                        10 => $f::<$k, 10>($($arg),*),
                        11 => $f::<$k, 11>($($arg),*),
                        12 => $f::<$k, 12>($($arg),*),
                        13 => $f::<$k, 13>($($arg),*),
                        14 => $f::<$k, 14>($($arg),*),
                        15 => $f::<$k, 15>($($arg),*),
                        _ => $f::<$k, 16>($($arg),*),
                    }
                };
            }
            match (p.dtype(), two) {
                (DType::Q4_0, true) => by_nt!(group2, Q4_0, (gp, gq, a, t0, out, c.ldo, ahead)),
                (DType::Q4_1, true) => by_nt!(group2, Q4_1, (gp, gq, a, t0, out, c.ldo, ahead)),
                (DType::Q8_0, true) => by_nt!(group2, Q8_0, (gp, gq, a, t0, out, c.ldo, ahead)),
                (DType::IQ4NL, true) => by_nt!(group2, IQ4NL, (gp, gq, a, t0, out, c.ldo, ahead)),
                (DType::Q4_0, false) => by_nt!(group, Q4_0, (gp, a, t0, out, c.ldo, ahead)),
                (DType::Q4_1, false) => by_nt!(group, Q4_1, (gp, a, t0, out, c.ldo, ahead)),
                (DType::Q8_0, false) => by_nt!(group, Q8_0, (gp, a, t0, out, c.ldo, ahead)),
                (DType::IQ4NL, false) => by_nt!(group, IQ4NL, (gp, a, t0, out, c.ldo, ahead)),
                _ => unreachable!("only Q4_0 / Q8_0 / Q4_1 / IQ4_NL are packed here"),
            }
            g += if two { 2 } else { 1 };
        }
        t0 += nt;
    }
}

/// Format tags of [`group`].
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q8_0: u8 = 2;
const IQ4NL: u8 = 3;

/// The format of tag `k`.
const fn dtype_of(k: u8) -> DType {
    match k {
        Q4_0 => DType::Q4_0,
        Q4_1 => DType::Q4_1,
        IQ4NL => DType::IQ4NL,
        _ => DType::Q8_0,
    }
}

/// The activation's bytes `at..at + 4` (as one i32) in all 8 lanes.
#[inline(always)]
unsafe fn bcast4(xp: *const i8, at: usize) -> __m256i {
    _mm256_set1_epi32((xp.add(at) as *const i32).read_unaligned())
}

/// One 8-row group, NT tokens, format `K`. Unsigned weight register `k` (0..8) holds in lane
/// `r` row `r`'s 4 values at elements `E(k)..E(k)+4`: Q4_0 / Q4_1 register `j` of the packing
/// gives `k = j` (low nibbles, elements `4j..`) and `k = 4 + j` (high nibbles, `16 + 4j..`);
/// Q8_0 register `k` holds elements `4k..`. Both equal `E(k) = 4k`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group<const K: u8, const NT: usize>(gp: *const u8, a: &ActQ8, t0: usize, out: *mut f32, ldo: usize, ahead: usize) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(dtype_of(K));
    // Quant registers start after the 8 rows' f16 `d`s (Q4_1: and their `m`s).
    let q0 = if K == Q4_1 { 32 } else { 16 };
    let m4 = _mm256_set1_epi8(0x0F);
    let flip = _mm256_set1_epi8(-128);
    let mut acc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = gp.add(i * gbb);
        if t0 == 0 {
            group_block_at(b, ahead, gbb);
        }
        let mut u = [_mm256_setzero_si256(); 8];
        if K == Q8_0 {
            for (k, u) in u.iter_mut().enumerate() {
                *u = _mm256_xor_si256(_mm256_loadu_si256(b.add(q0 + 32 * k) as *const __m256i), flip);
            }
        } else {
            for j in 0..4 {
                let v = _mm256_loadu_si256(b.add(q0 + 32 * j) as *const __m256i);
                u[j] = _mm256_and_si256(v, m4);
                u[4 + j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            }
            if K == IQ4NL {
                // Each nibble's table value + 128; the activations' bias (−128·Σx, prepared as
                // for Q8_0) takes the 128 back.
                let lut = _mm512_castsi512_si256(super::avx512::table_plus_128(&KVALUES_IQ4NL));
                u = u.map(|n| _mm256_shuffle_epi8(lut, n));
            }
        }
        let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            let xp = a.qs.as_ptr().add(ab * QK);
            // Two independent chains (elements 0..16 and 16..32) for a 1-token call's latency;
            // the integer sum is exact in any order. Q4_1 has no offset (bias 0).
            let mut s0 = _mm256_set1_epi32(*a.bias1.get_unchecked(ab));
            let mut s1 = _mm256_setzero_si256();
            for k in 0..4 {
                s0 = _mm256_dpbusd_epi32(s0, u[k], bcast4(xp, 4 * k));
                s1 = _mm256_dpbusd_epi32(s1, u[4 + k], bcast4(xp, 16 + 4 * k));
            }
            let isum = _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1));
            let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*a.d.get_unchecked(ab)));
            if K == Q4_1 {
                let mw = _mm256_cvtph_ps(_mm_loadu_si128(b.add(16) as *const __m128i));
                let min = _mm256_mul_ps(mw, _mm256_set1_ps(*a.s.get_unchecked(ab)));
                acc[t] = _mm256_add_ps(acc[t], _mm256_add_ps(_mm256_mul_ps(scale, isum), min));
            } else {
                acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(scale, isum));
            }
        }
    }
    for t in 0..NT {
        _mm256_storeu_ps(out.add(t * ldo), acc[t]);
    }
}

/// Two 16-byte halves (group `g` at `p`, group `g + 1` at `q`) as one 256-bit register.
#[inline(always)]
unsafe fn pair128(p: *const u8, q: *const u8) -> __m256i {
    _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(_mm_loadu_si128(p as *const __m128i)), _mm_loadu_si128(q as *const __m128i))
}

/// Two 32-byte registers (group `g` at `p`, group `g + 1` at `q`) as one 512-bit register.
#[inline(always)]
unsafe fn pair256(p: *const u8, q: *const u8) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_loadu_si256(p as *const __m256i)), _mm256_loadu_si256(q as *const __m256i))
}

/// [`group`] for two consecutive 8-row groups at once (`gp`, `gq`): 16 rows in the 16 lanes
/// of 512-bit registers (lanes 0..8 group `g`, 8..16 group `g + 1`), so each broadcast
/// activation load and each float epilogue serves 16 rows. Lane by lane the operations are
/// [`group`]'s (the same exact integers, then the same float multiplies and adds), so a row's
/// result does not depend on whether it went through a pair or a lone group.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group2<const K: u8, const NT: usize>(
    gp: *const u8,
    gq: *const u8,
    a: &ActQ8,
    t0: usize,
    out: *mut f32,
    ldo: usize,
    ahead: usize,
) {
    let nb = a.blocks_per_row;
    let gbb = group_block_bytes(dtype_of(K));
    let q0 = if K == Q4_1 { 32 } else { 16 };
    let m4 = _mm512_set1_epi8(0x0F);
    let flip = _mm512_set1_epi8(-128);
    let mut acc = [_mm512_setzero_ps(); NT];
    for i in 0..nb {
        let (b, bq) = (gp.add(i * gbb), gq.add(i * gbb));
        if t0 == 0 {
            group_block_at(b, ahead, gbb);
            group_block_at(bq, ahead, gbb);
        }
        let mut u = [_mm512_setzero_si512(); 8];
        if K == Q8_0 {
            for (k, u) in u.iter_mut().enumerate() {
                *u = _mm512_xor_si512(pair256(b.add(q0 + 32 * k), bq.add(q0 + 32 * k)), flip);
            }
        } else {
            for j in 0..4 {
                let v = pair256(b.add(q0 + 32 * j), bq.add(q0 + 32 * j));
                u[j] = _mm512_and_si512(v, m4);
                u[4 + j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
            }
            if K == IQ4NL {
                let lut = super::avx512::table_plus_128(&KVALUES_IQ4NL);
                u = u.map(|n| _mm512_shuffle_epi8(lut, n));
            }
        }
        let dw = _mm512_cvtph_ps(pair128(b, bq));
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            let xp = a.qs.as_ptr().add(ab * QK);
            let mut s0 = _mm512_set1_epi32(*a.bias1.get_unchecked(ab));
            let mut s1 = _mm512_setzero_si512();
            for k in 0..4 {
                s0 = _mm512_dpbusd_epi32(s0, u[k], _mm512_set1_epi32((xp.add(4 * k) as *const i32).read_unaligned()));
                s1 = _mm512_dpbusd_epi32(s1, u[4 + k], _mm512_set1_epi32((xp.add(16 + 4 * k) as *const i32).read_unaligned()));
            }
            let isum = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            let scale = _mm512_mul_ps(dw, _mm512_set1_ps(*a.d.get_unchecked(ab)));
            if K == Q4_1 {
                let mw = _mm512_cvtph_ps(pair128(b.add(16), bq.add(16)));
                let min = _mm512_mul_ps(mw, _mm512_set1_ps(*a.s.get_unchecked(ab)));
                acc[t] = _mm512_add_ps(acc[t], _mm512_add_ps(_mm512_mul_ps(scale, isum), min));
            } else {
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(scale, isum));
            }
        }
    }
    for t in 0..NT {
        _mm512_storeu_ps(out.add(t * ldo), acc[t]);
    }
}
