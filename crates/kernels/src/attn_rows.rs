//! Row-wise attention primitives over f32 key and value rows: the portable attention path's
//! inner loops (`engram-model`'s `attend_portable`), for CPUs without the AMX tiles of
//! [`crate::flash`].
//!
//! * [`scores`]: one query row's dot products with `n` key rows;
//! * [`max`]: the largest score (the online softmax's running maximum);
//! * [`exp_shifted`]: `s[i] = e^(s[i] - max)` in place, returning the sum (the softmax step);
//! * [`accumulate`]: `acc += Σ p[i] · values[i]`.
//!
//! Invariant: each function's result for a query row depends only on that row's inputs — never
//! on how many other rows a caller processes, or on the order it calls them in — so attention
//! computed for one token (decode) or for many (prefill, chunked or not) agrees bitwise. Every
//! output element is summed in a fixed order for a given head dimension and instruction path.
//! The path follows [`crate::internal::Isa::detect`] (so `ENGRAM_SIMD=scalar` forces the
//! scalar loops here too): AVX2 + FMA where the matmul path is AVX2 or wider, else scalar.
//! The two paths agree to float rounding (tested), not bitwise.

/// `out[i] = q · keys[i]` for the `out.len()` key rows of `keys` (`[n][head_dim]`, `q` of
/// `head_dim`).
pub fn scores(q: &[f32], keys: &[f32], head_dim: usize, out: &mut [f32]) {
    let n = out.len();
    assert!(q.len() >= head_dim && keys.len() >= n * head_dim, "scores: {n} keys of {head_dim} dims need {} values", n * head_dim);
    #[cfg(target_arch = "x86_64")]
    if avx2() && head_dim % 8 == 0 {
        // SAFETY: AVX2 and FMA are present (`avx2()`); lengths checked above.
        unsafe { x86::scores(q, keys, head_dim, out) };
        return;
    }
    for (o, k) in out.iter_mut().zip(keys.chunks_exact(head_dim)) {
        *o = q[..head_dim].iter().zip(k).map(|(a, b)| a * b).sum();
    }
}

/// The largest of `s` (`-inf` when `s` is empty); NaN entries are passed over, as by
/// `f32::max`. Eight running maxima (vectorized), then the largest of them: the same value as
/// a fold in order, since `max` is exact.
pub fn max(s: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut chunks = s.chunks_exact(8);
    for c in &mut chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = m.max(x);
        }
    }
    let m = chunks.remainder().iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    lanes.iter().fold(m, |a, &b| a.max(b))
}

/// `s[i] = e^(s[i] - max)` for every `i` (with `e^-inf = 0`, and 0 below `e^-87`), returning
/// `Σ s[i]`. `max` must be finite and at least every `s[i]`.
pub fn exp_shifted(s: &mut [f32], max: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx2() {
        // SAFETY: AVX2 and FMA are present.
        return unsafe { x86::exp_shifted(s, max) };
    }
    let mut sum = 0.0;
    for x in s.iter_mut() {
        *x = exp_approx(*x - max);
        sum += *x;
    }
    sum
}

/// `acc[d] += Σ_i p[i] · values[i][d]` over the `p.len()` value rows (`[n][head_dim]`).
pub fn accumulate(acc: &mut [f32], p: &[f32], values: &[f32], head_dim: usize) {
    let n = p.len();
    assert!(acc.len() >= head_dim && values.len() >= n * head_dim, "accumulate: {n} values of {head_dim} dims");
    #[cfg(target_arch = "x86_64")]
    if avx2() && head_dim % 8 == 0 {
        // SAFETY: AVX2 and FMA are present; lengths checked above.
        unsafe { x86::accumulate(acc, p, values, head_dim) };
        return;
    }
    for (&pi, v) in p.iter().zip(values.chunks_exact(head_dim)) {
        for (a, &x) in acc[..head_dim].iter_mut().zip(v) {
            *a += pi * x;
        }
    }
}

/// Asks the CPU to bring `bytes` into cache (one prefetch per 64-byte line); never changes a
/// result. Attention calls it on a chunk's key and value rows before decoding them, and on the
/// next chunk's where the cache names it, so the short per-head runs (a few KiB each, a
/// block's stride apart) arrive in parallel rather than one miss at a time.
pub fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for off in (0..bytes.len()).step_by(64) {
            // SAFETY: the address is inside `bytes`; a prefetch never faults or writes.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(bytes.as_ptr().add(off) as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// `e^x` for `x <= 0`: range reduction by `ln 2`, a degree-6 polynomial, the exponent put back
/// through the float's bits; relative error below 2e-7; `-inf` and anything below -87 give 0.
/// The AVX2 path evaluates the same polynomial lane by lane.
#[inline(always)]
pub fn exp_approx(x: f32) -> f32 {
    let xc = x.max(-87.0);
    let n = (xc * LOG2E + MAGIC) - MAGIC;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let p = 1.0 + r * (1.0 + r * (C2 + r * (C3 + r * (C4 + r * (C5 + r * C6)))));
    let bits = ((n as i32 + 127) as u32) << 23;
    let y = p * f32::from_bits(bits);
    if x < -87.0 {
        0.0
    } else {
        y
    }
}

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;
const MAGIC: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
const C2: f32 = 0.5;
const C3: f32 = 0.166_666_67;
const C4: f32 = 0.041_666_51;
const C5: f32 = 0.008_333_452;
const C6: f32 = 0.001_393_3;

/// Whether the AVX2 + FMA loops run: the kernel path ([`crate::internal::Isa::detect`]) is
/// AVX2 or wider.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx2() -> bool {
    use crate::simd::Isa;
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| matches!(Isa::detect(), Isa::Avx2 | Isa::Avx512 | Isa::Amx))
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Sum of the 8 lanes of each of `a`, `b`, `c`, `d` → lanes 0..4, each from its own
    /// vector only (so a key's score never depends on its neighbours').
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
        let ab = _mm256_hadd_ps(a, b); // a01 a23 b01 b23 | a45 a67 b45 b67
        let cd = _mm256_hadd_ps(c, d);
        let abcd = _mm256_hadd_ps(ab, cd); // a0123 b0123 c0123 d0123 | a4567 ...
        _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps::<1>(abcd))
    }

    /// Dot products of `q` with 4 keys at a time, `q` held in registers for 64-dim heads.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn scores(q: &[f32], keys: &[f32], hd: usize, out: &mut [f32]) {
        match hd {
            64 => scores_const::<8>(q, keys, out),
            128 => scores_const::<16>(q, keys, out),
            _ => scores_any(q, keys, hd, out),
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn scores_const<const NB: usize>(q: &[f32], keys: &[f32], out: &mut [f32]) {
        let hd = NB * 8;
        let mut qv = [_mm256_setzero_ps(); NB];
        for (b, v) in qv.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(q.as_ptr().add(b * 8));
        }
        let n = out.len();
        let kp = keys.as_ptr();
        let mut i = 0;
        while i + 4 <= n {
            let mut acc = [_mm256_setzero_ps(); 4];
            for b in 0..NB {
                for (k, a) in acc.iter_mut().enumerate() {
                    *a = _mm256_fmadd_ps(qv[b], _mm256_loadu_ps(kp.add((i + k) * hd + b * 8)), *a);
                }
            }
            _mm_storeu_ps(out.as_mut_ptr().add(i), hsum4(acc[0], acc[1], acc[2], acc[3]));
            i += 4;
        }
        while i < n {
            let mut a = _mm256_setzero_ps();
            for b in 0..NB {
                a = _mm256_fmadd_ps(qv[b], _mm256_loadu_ps(kp.add(i * hd + b * 8)), a);
            }
            let z = _mm256_setzero_ps();
            out[i] = _mm_cvtss_f32(hsum4(a, z, z, z));
            i += 1;
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn scores_any(q: &[f32], keys: &[f32], hd: usize, out: &mut [f32]) {
        let z = _mm256_setzero_ps();
        for (i, o) in out.iter_mut().enumerate() {
            let mut a = z;
            for b in 0..hd / 8 {
                a = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(b * 8)), _mm256_loadu_ps(keys.as_ptr().add(i * hd + b * 8)), a);
            }
            *o = _mm_cvtss_f32(hsum4(a, z, z, z));
        }
    }

    /// The scalar `exp_approx`, 8 lanes at a time; the sum is taken lane-wise, then across lanes.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn exp_shifted(s: &mut [f32], max: f32) -> f32 {
        let m = _mm256_set1_ps(max);
        let mut sum = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= s.len() {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(s.as_ptr().add(i)), m));
            _mm256_storeu_ps(s.as_mut_ptr().add(i), e);
            sum = _mm256_add_ps(sum, e);
            i += 8;
        }
        let rest = s.len() - i;
        if rest > 0 {
            let mut tail = [f32::NEG_INFINITY; 8];
            tail[..rest].copy_from_slice(&s[i..]);
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(tail.as_ptr()), m));
            _mm256_storeu_ps(tail.as_mut_ptr(), e);
            s[i..].copy_from_slice(&tail[..rest]);
            sum = _mm256_add_ps(sum, e);
        }
        let z = _mm256_setzero_ps();
        _mm_cvtss_f32(hsum4(sum, z, z, z))
    }

    /// `exp_approx` of 8 lanes (`x <= 0`, `-inf` allowed).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn exp8(x: __m256) -> __m256 {
        use super::*;
        let xc = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
        let magic = _mm256_set1_ps(MAGIC);
        let n = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(xc, _mm256_set1_ps(LOG2E)), magic), magic);
        let r = _mm256_sub_ps(_mm256_sub_ps(xc, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI))), _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)));
        let mut p = _mm256_set1_ps(C6);
        for c in [C5, C4, C3, C2, 1.0, 1.0] {
            p = _mm256_add_ps(_mm256_set1_ps(c), _mm256_mul_ps(r, p));
        }
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
        let y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
        // Lanes below -87 (and -inf) are 0.
        _mm256_and_ps(y, _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(-87.0)))
    }

    /// `acc += Σ p[i] v[i]`, 64 dims of the accumulator in registers at a time.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn accumulate(acc: &mut [f32], p: &[f32], values: &[f32], hd: usize) {
        let mut d0 = 0;
        while d0 + 64 <= hd {
            accumulate_block::<8>(acc, p, values, hd, d0);
            d0 += 64;
        }
        while d0 < hd {
            accumulate_block::<1>(acc, p, values, hd, d0);
            d0 += 8;
        }
    }

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn accumulate_block<const NB: usize>(acc: &mut [f32], p: &[f32], values: &[f32], hd: usize, d0: usize) {
        let mut a = [_mm256_setzero_ps(); NB];
        for (b, v) in a.iter_mut().enumerate() {
            *v = _mm256_loadu_ps(acc.as_ptr().add(d0 + b * 8));
        }
        let vp = values.as_ptr();
        for (i, &pi) in p.iter().enumerate() {
            let w = _mm256_set1_ps(pi);
            for (b, v) in a.iter_mut().enumerate() {
                *v = _mm256_fmadd_ps(w, _mm256_loadu_ps(vp.add(i * hd + d0 + b * 8)), *v);
            }
        }
        for (b, v) in a.iter().enumerate() {
            _mm256_storeu_ps(acc.as_mut_ptr().add(d0 + b * 8), *v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n).map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / (1u32 << 24) as f32 - 0.5).collect()
    }

    #[test]
    fn each_row_agrees_with_a_plain_f64_reference() {
        for hd in [8, 24, 64, 128] {
            for n in [1, 3, 4, 5, 32] {
                let (q, k, v) = (data(hd, 1), data(n * hd, 2), data(n * hd, 3));
                let mut s = vec![0.0; n];
                scores(&q, &k, hd, &mut s);
                for i in 0..n {
                    let r: f64 = (0..hd).map(|d| q[d] as f64 * k[i * hd + d] as f64).sum();
                    assert!((s[i] as f64 - r).abs() < 1e-5, "hd {hd} n {n} key {i}: {} vs {r}", s[i]);
                }
                let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut p = s.clone();
                p[n - 1] = f32::NEG_INFINITY;
                let sum = exp_shifted(&mut p, m);
                let want: f64 = s[..n - 1].iter().map(|&x| ((x - m) as f64).exp()).sum();
                assert!((sum as f64 - want).abs() < 1e-5 * want.max(1.0), "sum {sum} vs {want}");
                assert_eq!(p[n - 1], 0.0);
                let mut acc = data(hd, 4);
                let want: Vec<f64> =
                    (0..hd).map(|d| acc[d] as f64 + (0..n).map(|i| p[i] as f64 * v[i * hd + d] as f64).sum::<f64>()).collect();
                accumulate(&mut acc, &p, &v, hd);
                for d in 0..hd {
                    assert!((acc[d] as f64 - want[d]).abs() < 1e-5, "hd {hd} dim {d}");
                }
            }
        }
    }

    #[test]
    fn max_is_the_in_order_fold() {
        for n in [0, 1, 7, 8, 9, 31, 32, 33] {
            let mut s = data(n, 9);
            if n > 3 {
                s[2] = f32::NAN;
                s[n - 1] = f32::NEG_INFINITY;
            }
            let want = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            assert_eq!(max(&s).to_bits(), want.to_bits(), "n {n}");
        }
    }

    #[test]
    fn a_key_score_does_not_depend_on_its_neighbours() {
        let hd = 64;
        let (q, k) = (data(hd, 5), data(9 * hd, 6));
        let mut all = vec![0.0; 9];
        scores(&q, &k, hd, &mut all);
        for i in 0..9 {
            let mut one = [0.0];
            scores(&q, &k[i * hd..], hd, &mut one);
            assert_eq!(one[0].to_bits(), all[i].to_bits(), "key {i}");
        }
    }

    #[test]
    fn exp_is_the_scalar_polynomial_bitwise_and_clamps() {
        let mut xs: Vec<f32> = (0..40).map(|i| -(i as f32) * 2.3).collect();
        xs.extend([f32::NEG_INFINITY, -86.9, -87.0, -87.1, 0.0]);
        let mut e = xs.clone();
        exp_shifted(&mut e, 0.0);
        for (x, y) in xs.iter().zip(&e) {
            assert_eq!(y.to_bits(), exp_approx(*x).to_bits(), "e^{x}");
        }
    }
}
