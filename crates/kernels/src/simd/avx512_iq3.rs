//! AVX-512 rows of IQ3_XXS and IQ3_S against Q8_K activations for calls of 1–4 tokens (decode,
//! batched and speculative steps; the token-lane kernel `vnni_k` takes longer calls), 64 values
//! per step: the 16 grid entries behind them fetched by one `vpgatherdd` (the AVX2 row builds
//! each register from 8 scalar loads and inserts) once for all the tokens, the weights' signs
//! put on each token's activations under a mask register.
//!
//! Per super-block and 64 values (two sub-blocks): the 16 grid indices widened to i32 lanes
//! (IQ3_S: bit 8 set under a mask made of the 16 `qh` bits as stored), one gather of their
//! 4-byte magnitudes; the 64 activation bytes negated where the weight's sign bit is set
//! (IQ3_S: the 64 stored sign bits are the mask; IQ3_XXS: 8 `ksigns` bytes, the block's 32
//! made at once by a few vector operations); `vpmaddubsw` of the magnitudes (unsigned, ≤ 62)
//! and the signed activations into exact i16 pairs (|·| ≤ 2·62·127), then one `vpdpwssd` with
//! the two sub-blocks' odd scales.
//!
//! Invariant: Q8_K activations lie in −127..=127 (`quantize::ActQ8K`), so negating one never
//! wraps; each (row, super-block) integer is exactly the scalar reference's
//! (|Σ| ≤ 8·32·62·127·31 < 2^31); the float term is `(d·dx)·isum`, added in block order from
//! +0.0, so every row's result is bitwise the scalar path's (and the AVX2 row's and tiles').

use super::avx2_k::{block_bytes, iq3_dtype, IQ3S, IQ3XXS};
use crate::blocks::QK_K;
use crate::dtype::DType;
use crate::iq3::{d_of, scale, IQ3S_GRID, IQ3S_QH, IQ3S_SIGNS, IQ3XXS_GRID, IQ3XXS_SS, IQ3_QS};
use crate::quantize::ActQ8K;
use std::arch::x86_64::*;

/// Whether this module has rows for `d` (the IQ3 formats).
pub(crate) fn handles(d: DType) -> bool {
    matches!(d, DType::IQ3XXS | DType::IQ3S)
}

/// Runs rows `0..nr` (`w` the first row's first block, rows `rb` bytes apart) × tokens
/// `t0..t0 + nt` (`nt` 1..=4) of IQ3 format `d` ([`handles`]), one row at a time; out `(r, t)`
/// at `out[t · ldo + r]`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI available; `w` holds `nr` rows of `a.blocks_per_row` blocks; the
/// activations hold tokens `t0..t0 + nt`; `out[t · ldo + r]` writable for `r < nr`, `t < nt`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn rows_tile(d: DType, nr: usize, nt: usize, w: *const u8, rb: usize, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    macro_rules! rows {
        ($k:expr) => {
            for r in 0..nr {
                let (wr, o) = (w.add(r * rb), out.add(r));
                match nt {
                    1 => row::<$k, 1>(wr, a, t0, o, ldo),
                    2 => row::<$k, 2>(wr, a, t0, o, ldo),
                    3 => row::<$k, 3>(wr, a, t0, o, ldo),
                    _ => row::<$k, 4>(wr, a, t0, o, ldo),
                }
            }
        };
    }
    if d == DType::IQ3XXS {
        rows!(IQ3XXS)
    } else {
        rows!(IQ3S)
    }
}

/// The 256 sign bits of an IQ3_XXS block (bit `e` of the result's bit string: element `e`;
/// `[u64; 4]`, 64 elements each): [`crate::iq3::ksigns`] of its 32 seven-bit indices, all at
/// once — index `l` of sub-block `j`'s word (bits `7l..7l + 7`) moved to byte `4j + l`, its
/// parity (one `vpshufb` per nibble) put in bit 7.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn xxs_signs(b: *const u8) -> [u64; 4] {
    let w = _mm256_loadu_si256(b.add(IQ3XXS_SS) as *const __m256i);
    let field = |l: i32| _mm256_and_si256(_mm256_sllv_epi32(w, _mm256_set1_epi32(l)), _mm256_set1_epi32(0x7F << (8 * l)));
    let seven = _mm256_or_si256(_mm256_or_si256(field(0), field(1)), _mm256_or_si256(field(2), field(3)));
    // Parity of each nibble value 0..16.
    let par = _mm256_setr_epi8(0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 0);
    let lo = _mm256_shuffle_epi8(par, _mm256_and_si256(seven, _mm256_set1_epi8(0x0F)));
    let hi = _mm256_shuffle_epi8(par, _mm256_and_si256(_mm256_srli_epi16::<4>(seven), _mm256_set1_epi8(0x0F)));
    // Each byte's parity (0 or 1) to its bit 7: a 16-bit shift by 7 keeps both bytes' bits apart.
    let signs = _mm256_or_si256(seven, _mm256_slli_epi16::<7>(_mm256_xor_si256(lo, hi)));
    let mut out = [0u64; 4];
    _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, signs);
    out
}

/// One row × `NT` tokens of IQ3 format `K`: each 64 values' magnitudes gathered once for all
/// the tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn row<const K: u8, const NT: usize>(w: *const u8, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize) {
    let dt = iq3_dtype(K);
    let (nb, bb) = (a.blocks_per_row, block_bytes(K));
    let grid = if K == IQ3XXS { IQ3XXS_GRID.as_ptr() } else { IQ3S_GRID.as_ptr() } as *const i32;
    let zero = _mm512_setzero_si512();
    let mut acc = [0.0f32; NT];
    for i in 0..nb {
        let b = w.add(i * bb);
        let bs = std::slice::from_raw_parts(b, bb);
        let mut v = [zero; NT];
        let xxs = if K == IQ3XXS { xxs_signs(b) } else { [0; 4] };
        for g in 0..4 {
            let mut idx = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.add(IQ3_QS + 16 * g) as *const __m128i));
            let neg = if K == IQ3S {
                let hi = (b.add(IQ3S_QH + 2 * g) as *const u16).read_unaligned();
                idx = _mm512_mask_or_epi32(idx, hi, idx, _mm512_set1_epi32(256));
                (b.add(IQ3S_SIGNS + 8 * g) as *const u64).read_unaligned()
            } else {
                xxs[g]
            };
            let mag = _mm512_i32gather_epi32::<4>(idx, grid);
            let (s0, s1) = (scale(dt, bs, 2 * g) as i16, scale(dt, bs, 2 * g + 1) as i16);
            let sc = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(_mm256_set1_epi16(s0)), _mm256_set1_epi16(s1));
            for (t, v) in v.iter_mut().enumerate() {
                let xp = a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K);
                let x = _mm512_loadu_si512(xp.add(64 * g) as *const _);
                let p = _mm512_maddubs_epi16(mag, _mm512_mask_sub_epi8(x, neg, zero, x));
                *v = _mm512_dpwssd_epi32(*v, p, sc);
            }
        }
        let d = d_of(dt, bs);
        for (t, acc) in acc.iter_mut().enumerate() {
            let isum = _mm512_reduce_add_epi32(v[t]);
            *acc += d * *a.d.get_unchecked((t0 + t) * nb + i) * isum as f32;
        }
    }
    for (t, acc) in acc.into_iter().enumerate() {
        *out.add(t * ldo) = acc;
    }
}
