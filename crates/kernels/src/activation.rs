//! The SwiGLU activation of a gated feed-forward block, `gate = silu(gate) · up`, over f32
//! rows, vectorized: a prefill applies it to every token's intermediate row (5,632 values per
//! token and layer in a 1B Llama), on the calling thread between two matmuls, so a scalar
//! `expf` per element was ~8% of a Q6_K prefill's wall time at two threads on Zen 4.
//!
//! `silu(x) = x / (1 + e^-x)` is computed as `num / (1 + e) · up` with `e = e^-|x|` from
//! [`crate::attn_rows::exp_approx`] (the softmax's polynomial) and `num = x` for `x >= 0`,
//! `x · e` below (the same quotient, without ever evaluating `e^x` for large `x`).
//!
//! Invariant: each output element depends only on its own `gate` and `up` values, and the
//! AVX2 lanes evaluate exactly the scalar operations (no fused multiply-add, IEEE division),
//! so results are bitwise the same on both paths, whatever the slice length or position —
//! one token (decode) or many (prefill) agree bitwise.

use crate::attn_rows::exp_approx;

/// `gate[i] = silu(gate[i]) · up[i]` for every `i` (`up` at least as long as `gate`).
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len(), "swiglu: {} up values for {} gate values", up.len(), gate.len());
    #[cfg(target_arch = "x86_64")]
    if crate::attn_rows::avx2() {
        // SAFETY: AVX2 and FMA are present; lengths checked above.
        unsafe { swiglu_avx2(gate, up) };
        return;
    }
    swiglu_scalar(gate, up);
}

/// The scalar reference of [`swiglu`].
pub fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let e = exp_approx(-x.abs());
        let num = if x >= 0.0 { x } else { x * e };
        *g = num / (1.0 + e) * u;
    }
}

/// [`swiglu`] 8 lanes at a time; the tail runs through a zero-padded register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn swiglu_avx2(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let n = gate.len();
    let mut i = 0;
    while i + 8 <= n {
        let y = lane(_mm256_loadu_ps(gate.as_ptr().add(i)), _mm256_loadu_ps(up.as_ptr().add(i)));
        _mm256_storeu_ps(gate.as_mut_ptr().add(i), y);
        i += 8;
    }
    if i < n {
        let (mut g, mut u) = ([0f32; 8], [0f32; 8]);
        g[..n - i].copy_from_slice(&gate[i..]);
        u[..n - i].copy_from_slice(&up[i..n]);
        let y = lane(_mm256_loadu_ps(g.as_ptr()), _mm256_loadu_ps(u.as_ptr()));
        _mm256_storeu_ps(g.as_mut_ptr(), y);
        gate[i..].copy_from_slice(&g[..n - i]);
    }
}

/// 8 lanes of [`swiglu_scalar`]'s operations.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn lane(x: std::arch::x86_64::__m256, u: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let abs = _mm256_andnot_ps(_mm256_set1_ps(-0.0), x);
    let e = crate::attn_rows::x86::exp8(_mm256_sub_ps(_mm256_setzero_ps(), abs));
    let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_setzero_ps());
    let num = _mm256_blendv_ps(x, _mm256_mul_ps(x, e), neg);
    _mm256_mul_ps(_mm256_div_ps(num, _mm256_add_ps(_mm256_set1_ps(1.0), e)), u)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gate values over the whole float range that matters, specials included.
    fn gates() -> Vec<f32> {
        let mut v: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.05).collect();
        v.extend([0.0, -0.0, 1e-30, -1e-30, 87.5, -87.5, 88.8, -88.8, 200.0, -200.0, 1e30, -1e30]);
        v.extend([f32::INFINITY, f32::NEG_INFINITY, f32::MIN_POSITIVE, -f32::MIN_POSITIVE]);
        v
    }

    #[test]
    fn vector_path_is_bitwise_the_scalar_one_at_every_length() {
        let g = gates();
        let u: Vec<f32> = (0..g.len()).map(|i| ((i * 7919) % 200) as f32 / 50.0 - 2.0).collect();
        let mut want = g.clone();
        swiglu_scalar(&mut want, &u);
        for len in [0, 1, 7, 8, 9, 15, 16, 17, g.len()] {
            let mut got = g[..len].to_vec();
            swiglu(&mut got, &u);
            for i in 0..len {
                assert!(got[i].to_bits() == want[i].to_bits() || (got[i].is_nan() && want[i].is_nan()), "len {len} at {i}: {} vs {}", got[i], want[i]);
            }
        }
    }

    #[test]
    fn matches_the_libm_formula_to_a_few_ulp() {
        for &x in &gates() {
            let mut g = [x];
            swiglu(&mut g, &[1.5]);
            let want = (x as f64 / (1.0 + (-x as f64).exp()) * 1.5) as f32;
            if want.is_nan() || x.is_infinite() {
                continue;
            }
            let err = (g[0] - want).abs();
            // Below x = -87 the exponential is flushed to 0: silu is then -0 against |silu| < 1e-35.
            assert!(err <= 4.0 * f32::EPSILON * want.abs() + 1e-35, "x {x}: {} vs {want}", g[0]);
        }
    }
}
