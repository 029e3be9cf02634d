//! One 32-value activation block quantized to Q8_0 codes in AVX2 registers (four 8-lane
//! vectors): its scale, its i8 codes and their sum, bitwise what the scalar reference
//! (`quantize::q8_block_scalar`) gives. The scalar loop converted, rounded and stored one
//! value at a time (a `vcvttss2si` and a `vpinsrb` per value) and took a few percent of a
//! batched or speculative step, which quantizes every token's input to every matrix.
//!
//! Invariant, value by value against the reference `((v · id).round() as i8)`:
//! * the largest magnitude is the same float (`max` is exact; a NaN value is skipped, as
//!   `f32::max` skips it; the lanes' order does not matter);
//! * `y = v · id` is the same multiply;
//! * `round` (half away from zero) is done exactly: `t = trunc(y)`, then `t ± 1` where
//!   `|y − t| ≥ 0.5` (`y − t` is exact for any float);
//! * `as i8`'s saturation is a clamp of `y` to `[−128, 127]` first (rounding a clamped value
//!   gives the saturated result), and its NaN → 0 a mask before the clamp.

use super::avx2::hsum_i32;
use std::arch::x86_64::*;

/// Quantizes the 32 values at `xb` into `qs` (32 codes); returns the scale `amax / 127` and
/// `Σ qs`.
///
/// # Safety
/// The AVX2 path available (`Isa::Avx2`: AVX2, FMA, F16C); `xb` and `qs` hold at least 32
/// values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn block(xb: *const f32, qs: *mut i8) -> (f32, i32) {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let v = [0, 8, 16, 24].map(|o| _mm256_loadu_ps(xb.add(o)));
    // `vmaxps` returns its second operand when either is NaN: the running maximum survives a
    // NaN value, as in `f32::max`.
    let mut m = _mm256_setzero_ps();
    for v in v {
        m = _mm256_max_ps(_mm256_and_ps(v, abs_mask), m);
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
    let (lo, hi) = (_mm256_set1_ps(-128.0), _mm256_set1_ps(127.0));
    let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
    let sign_mask = _mm256_set1_ps(-0.0);
    let q = v.map(|v| {
        let y = _mm256_mul_ps(v, id);
        let y = _mm256_and_ps(y, _mm256_cmp_ps::<_CMP_ORD_Q>(y, y));
        let y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
        let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(y);
        let away = _mm256_cmp_ps::<_CMP_GE_OQ>(_mm256_and_ps(_mm256_sub_ps(y, t), abs_mask), half);
        let step = _mm256_or_ps(_mm256_and_ps(y, sign_mask), one);
        _mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(away, step)))
    });
    let sum = hsum_i32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
    // The packs interleave 128-bit lanes; the permute puts the 32 codes back in order.
    let w = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
    let w = _mm256_permutevar8x32_epi32(w, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(qs as *mut __m256i, w);
    (d, sum)
}

#[cfg(test)]
mod tests {
    use crate::quantize::q8_block_scalar;

    /// Values that stress the rounding, saturation and NaN rules, then random blocks.
    #[test]
    fn block_is_bitwise_the_scalar_reference() {
        if !crate::simd::Isa::Avx2.is_available() {
            return;
        }
        let mut blocks: Vec<[f32; 32]> = vec![
            [0.0; 32],
            [-0.0; 32],
            std::array::from_fn(|i| i as f32 - 15.5),
            // Halves at every magnitude: amax 127 makes id exactly 1.
            std::array::from_fn(|i| if i == 0 { 127.0 } else { (i as f32 * 4.0 + 0.5) * if i % 2 == 0 { 1.0 } else { -1.0 } }),
            std::array::from_fn(|i| if i == 3 { f32::NAN } else { i as f32 * 0.37 - 5.0 }),
            std::array::from_fn(|i| if i == 7 { f32::INFINITY } else { i as f32 }),
            std::array::from_fn(|i| if i == 9 { f32::NEG_INFINITY } else { -(i as f32) }),
            std::array::from_fn(|i| if i % 5 == 0 { 1e-44 } else { 0.0 }),
            std::array::from_fn(|i| (i as f32 - 16.0) * 1e-40),
            std::array::from_fn(|i| (i as f32 - 16.0) * 3e38),
            [f32::NAN; 32],
        ];
        let mut s = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s
        };
        for _ in 0..20_000 {
            let scale = [1e-3f32, 0.1, 1.0, 37.0, 1e4][(next() % 5) as usize];
            blocks.push(std::array::from_fn(|_| ((next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale));
        }
        for b in &blocks {
            let (mut q_ref, mut q) = ([0i8; 32], [0i8; 32]);
            let r = q8_block_scalar(b, &mut q_ref);
            // SAFETY: the AVX2 path checked above; both hold 32 values.
            let got = unsafe { super::block(b.as_ptr(), q.as_mut_ptr()) };
            assert_eq!((r.0.to_bits(), r.1, q_ref), (got.0.to_bits(), got.1, q), "block {b:?}");
        }
    }
}
