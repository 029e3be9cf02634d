//! Integer exactness of every kernel path, bitwise: with weight scales that are powers of two
//! and activations that quantize without error (integers, each block's largest magnitude 127,
//! so the activation scale is exactly 1), every product and partial sum of every path is an
//! integer below 2^24, exact in f32 whatever the order. Each path's result then equals, bit
//! for bit, the exact dot product of the dequantized weights with the activations (computed in
//! i64/f64 here): a wrong integer anywhere in a SIMD block dot shows up as a mismatch, with no
//! tolerance to hide it.

use crate::common;
use engram_kernels::internal::{matmul_with, Isa};
use engram_kernels::*;

/// Deterministic xorshift bytes.
fn bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// `rows × cols` of random blocks of `d` with every scale field set to a power of two.
fn weights(d: DType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut w = bytes(rows * d.row_bytes(cols).unwrap(), seed);
    let one = half::f16::from_f32(1.0).to_bits().to_le_bytes();
    let half_ = half::f16::from_f32(0.5).to_bits().to_le_bytes();
    // (offset, value) of the scale fields per block.
    let fields: &[(usize, [u8; 2])] = match d {
        DType::Q4_0 | DType::Q8_0 | DType::Q5_0 | DType::IQ4NL | DType::IQ4XS | DType::IQ3XXS | DType::IQ3S => &[(0, one)],
        DType::Q4_1 | DType::Q5_1 | DType::Q4K | DType::Q5K => &[(0, one), (2, half_)],
        DType::Q2K => &[(80, one), (82, half_)],
        DType::Q3K => &[(108, one)],
        DType::Q6K => &[(208, one)],
        DType::MXFP4 => &[],
        _ => unreachable!("float formats are not tested here"),
    };
    for b in w.chunks_exact_mut(d.block_bytes()) {
        for (off, v) in fields {
            b[*off..*off + 2].copy_from_slice(v);
        }
        if d == DType::MXFP4 {
            b[0] = 128; // 2^(128 − 128) = 1
        }
    }
    w
}

/// Integer activations in −7..=7, element 0 of every 32 set to −127 (so each Q8_0 block and
/// each Q8_K block has scale exactly 1 and quantizes to itself).
fn activations(n: usize, cols: usize, seed: u64) -> Vec<f32> {
    bytes(n * cols, seed).iter().enumerate().map(|(i, b)| if i % 32 == 0 { -127.0 } else { (b % 15) as f32 - 7.0 }).collect()
}

#[test]
fn every_path_is_exact_on_exactly_representable_inputs() {
    let (rows, cols, n) = (13, 512, 6);
    for d in DType::ALL.into_iter().filter(|d| d.block_elems() > 1) {
        let w = weights(d, rows, cols, 7 + d.ggml_type_id() as u64);
        let wm = WeightMatrix::new(d, rows, cols, &w).unwrap();
        let wd = common::dequant(d, &w, rows, cols);
        let x = activations(n, cols, 99);
        let mut want = vec![0f32; n * rows];
        for t in 0..n {
            for r in 0..rows {
                let s: f64 = (0..cols).map(|k| wd[r * cols + k] as f64 * x[t * cols + k] as f64).sum();
                // Multiples of 1/2 (the Q4_1 / Q5_1 / K-quant mins are 0.5) well inside f32's exact range.
                assert!(s.abs() < (1 << 22) as f64 && (2.0 * s).fract() == 0.0, "{d}: exact sum {s} not small");
                want[t * rows + r] = s as f32;
                assert_eq!(want[t * rows + r] as f64, s, "{d}: exact sum {s} not representable");
            }
        }
        for isa in Isa::available() {
            let mut got = vec![f32::NAN; n * rows];
            matmul_with(isa, &wm, &x, n, &mut got);
            for i in 0..n * rows {
                assert_eq!(got[i].to_bits(), want[i].to_bits(), "{d} {isa:?} element {i}: {} vs exact {}", got[i], want[i]);
            }
        }
    }
}
