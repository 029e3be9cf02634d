//! AVX-512 helpers of the tile path: f32/f16 → bf16 conversions and splits, row loads from the
//! stored formats, a 16×16 transpose, and `e^x` / `2^x` for the softmax.

use std::arch::x86_64::*;

use super::{Line, T};

/// Stores two 16-float vectors as line `r` of the bf16 tile at `tile`: words `a` then `b`,
/// or with `INTERLEAVED` dword `j` = `[a[j], b[j]]`. `EXACT`: split into hi (this tile) and
/// lo (the tile after it), else rounded once into this tile.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn store_bf16<const EXACT: bool, const INTERLEAVED: bool>(tile: *mut Line, r: usize, a: __m512, b: __m512) {
    if EXACT {
        let (hi, lo) = if INTERLEAVED { split_interleaved(a, b) } else { split_pair(a, b) };
        _mm512_store_si512(tile.add(r) as *mut __m512i, hi);
        _mm512_store_si512(tile.add(T + r) as *mut __m512i, lo);
    } else {
        let hi = if INTERLEAVED { bf16_interleaved(a, b) } else { bf16_pair(a, b) };
        _mm512_store_si512(tile.add(r) as *mut __m512i, hi);
    }
}

/// 32 halves (f16 bits) → two 16-float vectors (exact), word order kept.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn halves_to_ps(halves: __m512i) -> (__m512, __m512) {
    (_mm512_cvtph_ps(_mm512_castsi512_si256(halves)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(halves)))
}

/// Two 16-float vectors → one 32-word bf16 line, `a` then `b`, rounded to nearest even: the
/// `hi` of [`split_pair`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn bf16_pair(a: __m512, b: __m512) -> __m512i {
    std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(b, a))
}

/// The `hi` line of [`split_interleaved`]: dword `r` is `[bf16(x0[r]), bf16(x1[r])]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn bf16_interleaved(x0: __m512, x1: __m512) -> __m512i {
    let inter = _mm512_loadu_si512(INTERLEAVE_IDX.as_ptr() as *const _);
    _mm512_permutexvar_epi16(inter, std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(x1, x0)))
}

/// Two 16-float vectors → one (hi, lo) pair of 32-word bf16 lines, `a` then `b`: `hi` is
/// `x` rounded to nearest even (as `vcvtneps2bf16`), `lo` the rest rounded the same way, so
/// `x ≈ hi + lo` to ~16 bits (exactly for f16 values).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn split_pair(a: __m512, b: __m512) -> (__m512i, __m512i) {
    let hi = _mm512_cvtne2ps_pbh(b, a);
    let hi_bits = std::mem::transmute::<__m512bh, __m512i>(hi);
    let ha = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi_bits))));
    let hb = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(hi_bits))));
    let lo = _mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
    (hi_bits, std::mem::transmute::<__m512bh, __m512i>(lo))
}

/// Two 16-float vectors → (hi, lo) bf16 lines whose dword `r` is `[x0[r], x1[r]]` (a `B` or
/// `A` operand's pair layout), split into hi and lo as in [`split_pair`].
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn split_interleaved(x0: __m512, x1: __m512) -> (__m512i, __m512i) {
    let inter = _mm512_loadu_si512(INTERLEAVE_IDX.as_ptr() as *const _);
    // dword r = bf16(x1[r]) << 16 | bf16(x0[r]).
    let hi = _mm512_permutexvar_epi16(inter, std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(x1, x0)));
    let f0 = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(hi));
    let f1 = _mm512_castsi512_ps(_mm512_and_si512(hi, _mm512_set1_epi32(0xFFFF_0000u32 as i32)));
    let lo = _mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, f1), _mm512_sub_ps(x0, f0));
    (hi, _mm512_permutexvar_epi16(inter, std::mem::transmute::<__m512bh, __m512i>(lo)))
}

/// Loads 32 halves from `src`, of which the first `avail` exist (the rest read as zero).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn load_halves(src: *const u16, avail: usize) -> __m512i {
    if avail >= 32 {
        _mm512_loadu_si512(src as *const _)
    } else {
        _mm512_maskz_loadu_epi16((1u32 << avail) - 1, src as *const i16)
    }
}

/// Dims `16·c .. 16·c + 16` of row `key` of `rows` as floats (dims past `hd` read as
/// zero), exactly the values `dequantize_row` gives for the stored format.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(super) unsafe fn load16(rows: super::Rows<'_>, key: usize, c: usize, hd: usize) -> __m512 {
    use super::Rows;
    let d0 = 16 * c;
    if d0 >= hd {
        return _mm512_setzero_ps();
    }
    match rows {
        Rows::F32(x) => _mm512_loadu_ps(x.as_ptr().add(key * hd + d0)),
        Rows::F16(x) => _mm512_cvtph_ps(_mm256_loadu_si256(x.as_ptr().add((key * hd + d0) * 2) as *const __m256i)),
        Rows::Q8_0(x) => {
            let block = x.as_ptr().add((key * hd / 32 + c / 2) * 34);
            let d = scale16(block);
            let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(block.add(2 + 16 * (c % 2)) as *const __m128i));
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(q))
        }
        Rows::Q4_0(x) => {
            let block = x.as_ptr().add((key * hd / 32 + c / 2) * 18);
            let d = scale16(block);
            let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(block.add(2) as *const __m128i));
            let nib = if c % 2 == 0 { _mm512_and_si512(bytes, _mm512_set1_epi32(0xF)) } else { _mm512_srli_epi32::<4>(bytes) };
            _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(nib, _mm512_set1_epi32(8))))
        }
    }
}

/// A quantized block's f16 scale (its first two bytes, little-endian) in all 16 lanes, by
/// the hardware conversion.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn scale16(block: *const u8) -> __m512 {
    _mm512_cvtph_ps(_mm256_set1_epi16(i16::from_le_bytes([*block, *block.add(1)])))
}

/// Transposes a 16×16 f32 matrix held as 16 row vectors: four butterfly stages, each
/// swapping the off-diagonal `s × s` sub-blocks (s = 8, 4, 2, 1) with two-source permutes.
/// (One const-generic stage each, so every loop unrolls and the rows stay in registers.)
/// Callers must enable AVX-512F (every caller here is a `target_feature` function it is
/// inlined into).
#[inline(always)]
pub(super) unsafe fn transpose16(r: &mut [__m512; 16]) {
    transpose_stage::<8, 0>(r);
    transpose_stage::<4, 1>(r);
    transpose_stage::<2, 2>(r);
    transpose_stage::<1, 3>(r);
}

/// One stage of [`transpose16`]: rows `i` and `i + S` (for `i & S == 0`) exchange their
/// off-diagonal `S`-lane blocks, with the indices of stage `K`.
#[inline(always)]
unsafe fn transpose_stage<const S: usize, const K: usize>(r: &mut [__m512; 16]) {
    let lo = _mm512_loadu_si512(TRANSPOSE_IDX[K][0].as_ptr() as *const _);
    let hi = _mm512_loadu_si512(TRANSPOSE_IDX[K][1].as_ptr() as *const _);
    for i in 0..16 {
        if i & S == 0 {
            let (a, b) = (r[i], r[i + S]);
            r[i] = _mm512_permutex2var_ps(a, lo, b);
            r[i + S] = _mm512_permutex2var_ps(a, hi, b);
        }
    }
}

/// `permutex2var` indices of [`transpose16`]'s stages (s = 8, 4, 2, 1): for the upper row of
/// a pair, lane `j` keeps its own element if `j & s == 0`, else takes the lower row's `j - s`;
/// the lower row takes the upper's `j + s`, or keeps its own.
pub(super) static TRANSPOSE_IDX: [[[i32; 16]; 2]; 4] = transpose_idx();

pub(super) const fn transpose_idx() -> [[[i32; 16]; 2]; 4] {
    let mut t = [[[0i32; 16]; 2]; 4];
    let mut k = 0;
    while k < 4 {
        let s = 8 >> k;
        let mut j = 0;
        while j < 16 {
            if j & s == 0 {
                t[k][0][j] = j as i32;
                t[k][1][j] = (j + s) as i32;
            } else {
                t[k][0][j] = (j - s) as i32 | 16;
                t[k][1][j] = j as i32 | 16;
            }
            j += 1;
        }
        k += 1;
    }
    t
}

/// Word permutation taking `[a0..a15, b0..b15]` to `[a0, b0, a1, b1, ..]`.
pub(super) static INTERLEAVE_IDX: [i16; 32] = {
    let mut idx = [0i16; 32];
    let mut r = 0;
    while r < 16 {
        idx[2 * r] = r as i16;
        idx[2 * r + 1] = 16 + r as i16;
        r += 1;
    }
    idx
};

/// `e^x` on 16 lanes for softmax arguments (`x <= 0`): the same range reduction and degree-6
/// polynomial as the model's scalar `exp_approx`, with `vscalefps` for `2^n`. `GUARD` maps
/// `-inf` (and anything below -87) to exactly 0, as `exp_approx` does; without it the
/// arguments must be finite, and those below -87 give at most a denormal, which adds nothing
/// to a row sum of at least 1 and which the tile unit reads as zero — the same result bits.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn exp16<const GUARD: bool>(x: __m512) -> __m512 {
    let xc = if GUARD { _mm512_max_ps(x, _mm512_set1_ps(-87.0)) } else { x };
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
        xc,
        _mm512_set1_ps(std::f32::consts::LOG2_E),
    ));
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), xc);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
    let mut p = _mm512_set1_ps(0.001_393_3);
    for c in [0.008_333_452f32, 0.041_666_51, 0.166_666_67, 0.5, 1.0, 1.0] {
        p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
    }
    let y = _mm512_scalef_ps(p, n);
    if GUARD {
        _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(-87.0)), y)
    } else {
        y
    }
}

/// `2^x` on 16 lanes for the bf16 softmax (`x <= 0`): `x - floor(x)` by `vreduceps`, a
/// degree-3 polynomial on [0, 1) with `p(0) = 1` exactly (so an unmoved maximum rescales by
/// exactly 1), relative error < 9e-5, and `vscalefps` for `2^floor(x)`. `GUARD` as in
/// [`exp16`] (below -126: exactly 0).
#[inline]
#[target_feature(enable = "avx512f,avx512dq")]
pub(super) unsafe fn exp2_16<const GUARD: bool>(x: __m512) -> __m512 {
    let xc = if GUARD { _mm512_max_ps(x, _mm512_set1_ps(-126.0)) } else { x };
    let f = _mm512_reduce_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(xc);
    let mut p = _mm512_set1_ps(0.077_067_085);
    for c in [0.227_644_95f32, 0.695_116_8, 1.0] {
        p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
    }
    let y = _mm512_scalef_ps(p, xc);
    if GUARD {
        _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(-126.0)), y)
    } else {
        y
    }
}
