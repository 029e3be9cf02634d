//! Block → f32 decoding ([`dequantize_row`]). This is the readable definition of every format
//! (the kernels must agree with it) and what the tests use as ground truth.
//!
//! Invariant: output element `i` is exactly what ggml's `dequantize_row_*` produces for input
//! element `i` (same float operations: `d*q` and `d*sc*q - dmin*m`).

use crate::blocks::*;
use crate::dtype::DType;

/// Decodes one row (or any whole number of blocks) of `dtype` into `out`.
///
/// # Panics
/// If `row` is not a whole number of blocks or `out.len()` differs from the element count.
pub fn dequantize_row(dtype: DType, row: &[u8], out: &mut [f32]) {
    let (be, bb) = (dtype.block_elems(), dtype.block_bytes());
    assert!(row.len() % bb == 0, "dequantize_row: {} bytes is not whole {} blocks", row.len(), dtype);
    assert_eq!(out.len(), row.len() / bb * be, "dequantize_row: output length");
    let blocks = row.chunks_exact(bb).zip(out.chunks_exact_mut(be));
    match dtype {
        DType::F32 => blocks.for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::F16 => f16_row(row, out),
        DType::BF16 => blocks.for_each(|(b, o)| o[0] = bf16_at(b, 0)),
        #[cfg(target_arch = "x86_64")]
        DType::Q8_0 | DType::Q4_0 if is_x86_feature_detected!("avx512f") => {
            // SAFETY: AVX-512F checked; whole blocks checked above.
            unsafe { q8_q4_row_avx512(dtype == DType::Q4_0, row, out) }
        }
        DType::Q8_0 => blocks.for_each(|(b, o)| {
            let d = f16_at(b, 0);
            for j in 0..QK {
                o[j] = d * (b[2 + j] as i8) as f32;
            }
        }),
        DType::Q4_0 => blocks.for_each(|(b, o)| {
            let d = f16_at(b, 0);
            for j in 0..QK / 2 {
                o[j] = d * ((b[2 + j] & 0xF) as i32 - 8) as f32;
                o[j + 16] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
            }
        }),
        DType::Q4K => blocks.for_each(|(b, o)| dequant_q4k_block(b, o)),
        DType::Q6K => blocks.for_each(|(b, o)| dequant_q6k_block(b, o)),
        DType::Q4_1 => blocks.for_each(|(b, o)| {
            let (d, m) = (f16_at(b, 0), f16_at(b, 2));
            for (j, v) in o.iter_mut().enumerate() {
                *v = nibble32(&b[Q4_1_QS..], j) as f32 * d + m;
            }
        }),
        DType::Q5_0 => blocks.for_each(|(b, o)| {
            let (d, qh) = (f16_at(b, 0), u32_at(b, Q5_0_QH));
            for (j, v) in o.iter_mut().enumerate() {
                *v = (q5_value(qh, &b[Q5_0_QS..], j) as i32 - 16) as f32 * d;
            }
        }),
        DType::Q5_1 => blocks.for_each(|(b, o)| {
            let (d, m, qh) = (f16_at(b, 0), f16_at(b, 2), u32_at(b, Q5_1_QH));
            for (j, v) in o.iter_mut().enumerate() {
                *v = q5_value(qh, &b[Q5_1_QS..], j) as f32 * d + m;
            }
        }),
        DType::IQ4NL => blocks.for_each(|(b, o)| {
            let d = f16_at(b, 0);
            for (j, v) in o.iter_mut().enumerate() {
                *v = d * KVALUES_IQ4NL[nibble32(&b[2..], j) as usize] as f32;
            }
        }),
        DType::MXFP4 => blocks.for_each(|(b, o)| {
            let d = e8m0_half(b[0]);
            for (j, v) in o.iter_mut().enumerate() {
                *v = KVALUES_MXFP4[nibble32(&b[1..], j) as usize] as f32 * d;
            }
        }),
        DType::Q2K => blocks.for_each(|(b, o)| {
            let (d, dmin) = (f16_at(b, Q2K_D), f16_at(b, Q2K_D + 2));
            for (i, v) in o.iter_mut().enumerate() {
                let sc = b[i / 16];
                let (dl, ml) = (d * (sc & 0xF) as f32, dmin * (sc >> 4) as f32);
                *v = dl * q2k_value(b, i) as f32 - ml;
            }
        }),
        DType::Q3K => blocks.for_each(|(b, o)| {
            let d = f16_at(b, Q3K_D);
            let sc = q3k_scales(b);
            for (i, v) in o.iter_mut().enumerate() {
                *v = d * sc[i / 16] as f32 * q3k_value(b, i) as f32;
            }
        }),
        DType::Q5K => blocks.for_each(|(b, o)| {
            let (d, dmin) = (f16_at(b, 0), f16_at(b, 2));
            let (sc, m) = scales_mins_k4(&b[Q4K_SCALES..]);
            for (i, v) in o.iter_mut().enumerate() {
                let (dl, ml) = (d * sc[i / 32] as f32, dmin * m[i / 32] as f32);
                *v = dl * q5k_value(b, i) as f32 - ml;
            }
        }),
        DType::IQ4XS => blocks.for_each(|(b, o)| {
            let d = f16_at(b, 0);
            let ls = iq4xs_scales(b);
            for (i, v) in o.iter_mut().enumerate() {
                let dl = d * ls[i / 32] as f32;
                *v = dl * KVALUES_IQ4NL[nibble32(&b[IQ4XS_QS + 16 * (i / 32)..], i % 32) as usize] as f32;
            }
        }),
        DType::IQ3XXS | DType::IQ3S => blocks.for_each(|(b, o)| {
            let d = crate::iq3::d_of(dtype, b);
            let q = crate::iq3::values(dtype, b);
            for (j, (os, qs)) in o.chunks_exact_mut(32).zip(q.chunks_exact(32)).enumerate() {
                // ggml: `db = d·(2s + 1)` (IQ3_XXS: `d·(0.5 + s)·0.5`, the same float), then `db·grid·sign`.
                let db = d * crate::iq3::scale(dtype, b, j) as f32;
                for (v, q) in os.iter_mut().zip(qs) {
                    *v = db * *q as f32;
                }
            }
        }),
    }
}

/// f16 → f32 (exact, so every path gives the same bits), 16 lanes at a time where AVX-512 is
/// available, 8 with F16C: KV caches are decoded through here once per chunk and head in attention.
fn f16_row(row: &[u8], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F checked; lengths were checked by the caller (2 bytes per element).
        unsafe { return f16_row_avx512(row, out) }
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx") {
        // SAFETY: F16C and AVX checked; lengths as above.
        unsafe { return f16_row_f16c(row, out) }
    }
    row.chunks_exact(2).zip(out).for_each(|(b, o)| *o = f16_at(b, 0));
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn f16_row_avx512(row: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = out.len();
    let mut i = 0;
    while i + 16 <= n {
        let h = _mm256_loadu_si256(row.as_ptr().add(2 * i) as *const __m256i);
        _mm512_storeu_ps(out.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        i += 16;
    }
    for j in i..n {
        out[j] = f16_at(row, 2 * j);
    }
}

/// [`f16_row_avx512`] 8 lanes at a time (AVX2-era CPUs: F16C).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,f16c")]
unsafe fn f16_row_f16c(row: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = out.len();
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(row.as_ptr().add(2 * i) as *const __m128i);
        _mm256_storeu_ps(out.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    for j in i..n {
        out[j] = f16_at(row, 2 * j);
    }
}

/// Q8_0 / Q4_0 rows, 16 lanes at a time: the same `d * q` products as the scalar loops (the
/// integer is exact in f32), so the bits agree. Quantized KV caches are decoded through here.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn q8_q4_row_avx512(q4: bool, row: &[u8], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let bb = if q4 { 18 } else { 34 };
    for (b, o) in row.chunks_exact(bb).zip(out.chunks_exact_mut(QK)) {
        let d = _mm512_set1_ps(f16_at(b, 0));
        let (lo, hi) = if q4 {
            let x = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.as_ptr().add(2) as *const __m128i));
            let eight = _mm512_set1_epi32(8);
            let lo = _mm512_sub_epi32(_mm512_and_si512(x, _mm512_set1_epi32(0xF)), eight);
            (lo, _mm512_sub_epi32(_mm512_srli_epi32::<4>(x), eight))
        } else {
            (
                _mm512_cvtepi8_epi32(_mm_loadu_si128(b.as_ptr().add(2) as *const __m128i)),
                _mm512_cvtepi8_epi32(_mm_loadu_si128(b.as_ptr().add(18) as *const __m128i)),
            )
        };
        _mm512_storeu_ps(o.as_mut_ptr(), _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)));
        _mm512_storeu_ps(o.as_mut_ptr().add(16), _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)));
    }
}

/// `dequantize_row_q4_K` for one block.
fn dequant_q4k_block(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, 0);
    let dmin = f16_at(b, 2);
    let qs = &b[Q4K_QS..Q4K_QS + 128];
    for c in 0..4 {
        let (s1, m1) = scale_min_k4(2 * c, &b[Q4K_SCALES..]);
        let (s2, m2) = scale_min_k4(2 * c + 1, &b[Q4K_SCALES..]);
        let (d1, m1) = (d * s1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * s2 as f32, dmin * m2 as f32);
        for l in 0..32 {
            o[64 * c + l] = d1 * (qs[32 * c + l] & 0xF) as f32 - m1;
            o[64 * c + 32 + l] = d2 * (qs[32 * c + l] >> 4) as f32 - m2;
        }
    }
}

/// The 6-bit value (0..64) of element `i` of a Q6_K block: for half `h = i / 128` and
/// `r = i % 128 = 32k + l`, the low 4 bits are nibble `k / 2` of `ql[64h + l + 32(k % 2)]`
/// and the high 2 bits are bits `2k..2k+2` of `qh[32h + l]`.
#[inline(always)]
pub(crate) fn q6k_value(b: &[u8], i: usize) -> i32 {
    let (h, r) = (i / 128, i % 128);
    let (k, l) = (r / 32, r % 32);
    let ql = b[64 * h + l + 32 * (k % 2)];
    let lo = if k < 2 { ql & 0xF } else { ql >> 4 };
    let hi = (b[Q6K_QH + 32 * h + l] >> (2 * k)) & 3;
    (lo | (hi << 4)) as i32
}

/// `dequantize_row_q6_K` for one block; sub-block of 16 elements `i / 16` uses scale `i / 16`.
fn dequant_q6k_block(b: &[u8], o: &mut [f32]) {
    let d = f16_at(b, Q6K_D);
    for (i, v) in o.iter_mut().enumerate() {
        let sc = b[Q6K_SCALES + i / 16] as i8 as f32;
        *v = d * sc * (q6k_value(b, i) - 32) as f32;
    }
}
