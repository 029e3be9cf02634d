//! The SwiGLU activation of a gated feed-forward block, `gate = silu(gate) · up`, over f32
//! rows, vectorized: a prefill applies it to every token's intermediate row (5,632 values per
//! token and layer in a 1B Llama), on the calling thread between two matmuls, so a scalar
//! `expf` per element was ~8% of a Q6_K prefill's wall time at two threads on Zen 4.
//!
//! The reference is the scalar formula `g / (1 + e^-g) · up` with the C library's `expf`.
//! The AVX2 path computes the same f32 operations, with `e^-g` from [`expf8`], a vector port
//! of the `expf` that glibc (2.28 and later, from Arm's optimized-routines) runs on x86-64 CPUs
//! with FMA: `e^x = 2^(k/32) · p(r)`, `k` the nearest integer to `32x/ln 2`, the table of
//! `2^(i/32)` below, a cubic in `r`, all in f64 with fused multiply-adds exactly where that
//! build fuses them (read from its machine code), then rounded once to f32.
//!
//! Invariant: each output element depends only on its own `gate` and `up` values. On x86-64
//! Linux with glibc the vector path is bitwise the scalar one (tested over every gate value
//! from −110 to 110 in steps of 2^-12 and the special values), so vectorizing changed no
//! result; elsewhere they agree to within an ulp of `expf`. One token (decode) or many
//! (prefill) agree bitwise on either path.

/// Values per piece when a long call (a prefill's rows) is spread over the kernel threads.
const PIECE: usize = 16 * 1024;

/// `gate[i] = silu(gate[i]) · up[i]` for every `i` (`up` at least as long as `gate`). Calls of
/// at least two [`PIECE`]s run in pieces on the kernel threads (`pool::in_pieces`); each
/// element's operations are the same either way.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    assert!(up.len() >= gate.len(), "swiglu: {} up values for {} gate values", up.len(), gate.len());
    let n = gate.len();
    if n < 2 * PIECE {
        return swiglu_here(gate, up);
    }
    crate::pool::in_pieces(gate.chunks_mut(PIECE).zip(up.chunks(PIECE)), &|(g, u)| swiglu_here(g, u));
}

/// [`swiglu`] on the calling thread.
fn swiglu_here(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if crate::attn_rows::avx2() {
        // SAFETY: AVX2 and FMA are present; `swiglu` checked that `up` is long enough.
        unsafe { swiglu_avx2(gate, up) };
        return;
    }
    swiglu_scalar(gate, up);
}

/// The scalar reference of [`swiglu`] (the C library's `expf`).
pub fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
}

/// `2^(i/32)` rounded to the nearest f64, as bits, minus `i · 2^47` (so that adding `k · 2^47`
/// for `k ≡ i mod 32` scales it by `2^(k div 32)`).
#[cfg(target_arch = "x86_64")]
const EXP2_32THS: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];

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

/// 8 lanes of [`swiglu_scalar`]'s operations: `g / (1 + e^-g) · u`.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn lane(g: std::arch::x86_64::__m256, u: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let e = expf8(_mm256_xor_ps(g, _mm256_set1_ps(-0.0)));
    _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0), e)), u)
}

/// `expf` of 8 lanes, bitwise glibc's on x86-64 with FMA (see the module comment): the normal
/// range in f64 lanes, then the special cases as glibc returns them — `+inf` above
/// `0x1.62e42ep6` (and for `+inf`), `+0` below `-0x1.9fe368p6` (and for `-inf`), the smallest
/// subnormal below `-0x1.9d1d9ep6` (its "may underflow" value), NaN for NaN.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn expf8(x: std::arch::x86_64::__m256) -> std::arch::x86_64::__m256 {
    use std::arch::x86_64::*;
    let lo = expf4_core(_mm256_castps256_ps128(x));
    let hi = expf4_core(_mm256_extractf128_ps::<1>(x));
    let y = _mm256_set_m128(hi, lo);
    let over = _mm256_cmp_ps::<_CMP_GT_OQ>(x, _mm256_set1_ps(f32::from_bits(0x42b1_7217)));
    let under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(f32::from_bits(0xc2cf_f1b4)));
    let may_under = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(f32::from_bits(0xc2ce_8ecf)));
    let nan = _mm256_cmp_ps::<_CMP_UNORD_Q>(x, x);
    let y = _mm256_blendv_ps(y, _mm256_set1_ps(f32::from_bits(1)), may_under);
    let y = _mm256_blendv_ps(y, _mm256_setzero_ps(), under);
    let y = _mm256_blendv_ps(y, _mm256_set1_ps(f32::INFINITY), over);
    _mm256_blendv_ps(y, _mm256_add_ps(x, x), nan)
}

/// glibc's `expf` body for 4 lanes in the range where it computes (no special cases).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn expf4_core(x: std::arch::x86_64::__m128) -> std::arch::x86_64::__m128 {
    use std::arch::x86_64::*;
    let pd = |bits: u64| _mm256_set1_pd(f64::from_bits(bits));
    // 32/ln 2, 1.5·2^52 (adding it rounds to an integer), and the cubic's coefficients scaled
    // for r in units of 1/32: 0x1.c6af84b912394p-5/32³, 0x1.ebfce50fac4f3p-3/32², 0x1.62e42ff0c52d6p-1/32.
    let (inv_ln2_n, shift) = (pd(0x4047_1547_652b_82fe), pd(0x4338_0000_0000_0000));
    let (c0, c1, c2) = (pd(0x3ebc_6af8_4b91_2394), pd(0x3f2e_bfce_50fa_c4f3), pd(0x3f96_2e42_ff0c_52d6));
    let xd = _mm256_cvtps_pd(x);
    // kd = round(32x/ln 2) (fused as glibc's build fuses it), r = 32x/ln 2 − kd.
    let shifted = _mm256_fmadd_pd(inv_ln2_n, xd, shift);
    let ki = _mm256_castpd_si256(shifted);
    let kd = _mm256_sub_pd(shifted, shift);
    let r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);
    // s = 2^(k/32): the table entry for k mod 32, its exponent raised by k div 32.
    let idx = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
    let t = _mm256_i64gather_epi64::<8>(EXP2_32THS.as_ptr() as *const i64, idx);
    let s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64::<47>(ki)));
    // y = s · (C0·r³ + C1·r² + C2·r + 1) as (r·C0 + C1)·r² + (r·C2 + 1).
    let z = _mm256_fmadd_pd(r, c0, c1);
    let r2 = _mm256_mul_pd(r, r);
    let y = _mm256_fmadd_pd(r, c2, _mm256_set1_pd(1.0));
    let y = _mm256_fmadd_pd(z, r2, y);
    _mm256_cvtpd_ps(_mm256_mul_pd(y, s))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gate values over the range that matters, specials included.
    fn gates(step: f32) -> Vec<f32> {
        let mut v: Vec<f32> = Vec::new();
        let mut x = -110.0f32;
        while x <= 110.0 {
            v.push(x);
            x += step;
        }
        v.extend([0.0, -0.0, 1e-30, -1e-30, 88.72283, -88.72283, 88.7229, -88.7229, 103.27893, 103.97208, 103.9721]);
        v.extend([200.0, -200.0, 1e30, -1e30, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, f32::MIN_POSITIVE, -f32::MIN_POSITIVE]);
        v.extend([f32::from_bits(1), f32::MAX, f32::MIN]);
        v
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn every_length_and_position_gives_the_same_bits() {
        let g = gates(1.0 / 256.0);
        let u: Vec<f32> = (0..g.len()).map(|i| ((i * 7919) % 200) as f32 / 50.0 - 2.0).collect();
        let mut whole = g.clone();
        swiglu(&mut whole, &u);
        assert!(g.len() > 2 * PIECE, "the whole call runs in pieces");
        for len in [0, 1, 7, 8, 9, 15, 16, 17, g.len()] {
            for start in [0, 3] {
                let end = (start + len).min(g.len());
                let mut part = g[start..end].to_vec();
                swiglu(&mut part, &u[start..end]);
                for (i, (a, b)) in part.iter().zip(&whole[start..end]).enumerate() {
                    assert!(same(*a, *b), "len {len} start {start} at {i}: {a} vs {b}");
                }
            }
        }
    }

    /// Where the C library is glibc on x86-64, the vector path is its `expf` bit for bit.
    #[test]
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    fn vector_path_is_bitwise_the_libc_formula() {
        if !crate::attn_rows::avx2() {
            return;
        }
        let g = gates(1.0 / 4096.0);
        let u: Vec<f32> = (0..g.len()).map(|i| ((i * 7919) % 200) as f32 / 50.0 - 2.0).collect();
        let mut want = g.clone();
        swiglu_scalar(&mut want, &u);
        let mut got = g.clone();
        swiglu(&mut got, &u);
        for i in 0..g.len() {
            assert!(same(got[i], want[i]), "gate {}: {} vs {}", g[i], got[i], want[i]);
        }
    }

    /// Every f32 (4.3 G values, ~12 s on two Zen 4 cores):
    /// `cargo test --release -p engram-kernels --lib expf8_is_libc -- --ignored`.
    #[test]
    #[ignore]
    #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
    fn expf8_is_libc_expf_on_every_float() {
        use std::arch::x86_64::*;
        if !crate::attn_rows::avx2() {
            return;
        }
        let bad = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|sc| {
            for part in 0..2u64 {
                let bad = &bad;
                sc.spawn(move || {
                    let (mut x, mut y) = ([0f32; 8], [0f32; 8]);
                    let mut b = part << 31;
                    while b < (part + 1) << 31 {
                        for (j, v) in x.iter_mut().enumerate() {
                            *v = f32::from_bits((b + j as u64) as u32);
                        }
                        // SAFETY: AVX2 and FMA checked above.
                        unsafe { _mm256_storeu_ps(y.as_mut_ptr(), expf8(_mm256_loadu_ps(x.as_ptr()))) };
                        for j in 0..8 {
                            if !same(y[j], x[j].exp()) {
                                bad.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            }
                        }
                        b += 8;
                    }
                });
            }
        });
        assert_eq!(bad.into_inner(), 0);
    }

    #[test]
    fn table_holds_the_powers_of_two() {
        #[cfg(target_arch = "x86_64")]
        for (i, &t) in EXP2_32THS.iter().enumerate() {
            let want = 2f64.powf(i as f64 / 32.0);
            assert!((f64::from_bits(t + ((i as u64) << 47)) - want).abs() <= f64::EPSILON * want, "entry {i}");
        }
    }
}
