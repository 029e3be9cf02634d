//! Shared helpers for the integration tests: deterministic data and the f64 reference matmul.
#![allow(dead_code)]

pub mod packed;

use engram_kernels::{dequantize_row, DType};

/// Deterministic pseudo-random f32s in roughly [-scale, scale] with per-32 scale variation
/// (so blocks have different maxima, like real activations/weights).
pub fn data(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut scale = 1.0;
    (0..n)
        .map(|i| {
            if i % 32 == 0 {
                scale = 0.1 + 2.0 * next();
            }
            ((2.0 * next() - 1.0) * scale) as f32
        })
        .collect()
}

/// Dequantizes a whole matrix.
pub fn dequant(dtype: DType, bytes: &[u8], rows: usize, cols: usize) -> Vec<f32> {
    let mut w = vec![0f32; rows * cols];
    let rb = dtype.row_bytes(cols).unwrap();
    for r in 0..rows {
        dequantize_row(dtype, &bytes[r * rb..(r + 1) * rb], &mut w[r * cols..(r + 1) * cols]);
    }
    w
}

/// Activation block size of the integer path for `dtype` (0 = no activation quantization).
pub fn act_block(dtype: DType) -> usize {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => 0,
        // Q8_0-style activations (ggml's Q8_0 / Q8_1 pairing).
        DType::Q4_0 | DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4NL | DType::MXFP4 => 32,
        // Q8_K activations.
        DType::Q4K | DType::Q6K | DType::Q2K | DType::Q3K | DType::Q5K | DType::IQ4XS | DType::IQ3XXS | DType::IQ3S => 256,
    }
}

/// Reference result and an honest per-element error bound for `out[t][r]`.
///
/// * `ref[t][r] = Σ_k deq(W)[r][k] · x[t][k]` accumulated in f64.
/// * bound = `1e-5 · Σ_k |W x|` (f32 accumulation) + for integer paths
///   `Σ_k |W[r][k]| · 0.5 · amax(block of x[t] containing k) / 127 · 1.01`, the worst case of
///   round-to-nearest 8-bit activation quantization (the 1% covers the float scale arithmetic).
pub fn reference(dtype: DType, w: &[f32], x: &[f32], rows: usize, cols: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let ab = act_block(dtype);
    let mut refv = vec![0f64; n * rows];
    let mut bound = vec![0f64; n * rows];
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        let err: Vec<f64> = if ab == 0 {
            vec![0.0; cols]
        } else {
            xt.chunks(ab)
                .flat_map(|b| {
                    let m = b.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
                    std::iter::repeat_n(0.5 * m / 127.0 * 1.01, b.len())
                })
                .collect()
        };
        for r in 0..rows {
            let wr = &w[r * cols..(r + 1) * cols];
            let (mut s, mut sa, mut e) = (0f64, 0f64, 0f64);
            for k in 0..cols {
                let p = wr[k] as f64 * xt[k] as f64;
                s += p;
                sa += p.abs();
                e += (wr[k] as f64).abs() * err[k];
            }
            refv[t * rows + r] = s;
            bound[t * rows + r] = 1e-5 * sa + e + 1e-6;
        }
    }
    (refv, bound)
}
