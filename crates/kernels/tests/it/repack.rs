//! Repacked Q4_0 / Q8_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 weights (`Packed`, the AVX2 GEMV's 8-row groups; Q4_K / Q6_K in `repack_k.rs`): the packing keeps
//! every byte; on the AVX2 path a packed matrix gives bitwise the scalar reference's result
//! for any number of tokens, alone or batched, in `matmul` and `matmul_multi`; other paths
//! ignore the packing; shapes it cannot pack are refused.

use crate::common;
use common::packed::{assert_multi_equals_separate, assert_packed_equals_scalar};
use common::*;
use engram_kernels::internal::Isa;
use engram_kernels::*;

/// The 32-element formats `Packed` takes.
const PACKED_32: [DType; 7] = [DType::Q4_0, DType::Q8_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4NL, DType::MXFP4];

#[test]
fn packing_keeps_every_byte_and_refuses_what_it_cannot_pack() {
    for d in PACKED_32 {
        let (rows, cols) = (24, 256);
        let bytes = quantize(d, &data(rows * cols, 1), cols).unwrap();
        let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        let p = Packed::new(&wm).expect("24 rows pack");
        assert_eq!(p.num_bytes(), bytes.len(), "{d}: same size as the source");
        for r in 0..rows {
            assert_eq!(p.unpack_row(r), wm.row(r), "{d} row {r}");
        }
        // 20 rows are not whole 8-row groups; other formats are not packed.
        let short = WeightMatrix::new(d, 20, cols, &bytes[..20 * wm.row_bytes()]).unwrap();
        assert!(Packed::new(&short).is_none());
    }
    for d in [DType::F32, DType::F16, DType::BF16] {
        let bytes = quantize(d, &data(8 * 256, 2), 256).unwrap();
        assert!(Packed::new(&WeightMatrix::new(d, 8, 256, &bytes).unwrap()).is_none(), "{d}");
    }
}

#[test]
#[should_panic(expected = "packing of another matrix")]
fn attaching_another_matrixs_packing_panics() {
    let a = quantize(DType::Q4_0, &data(8 * 256, 3), 256).unwrap();
    let b = quantize(DType::Q4_0, &data(16 * 256, 4), 256).unwrap();
    let wa = WeightMatrix::new(DType::Q4_0, 8, 256, &a).unwrap();
    let pb = Packed::new(&WeightMatrix::new(DType::Q4_0, 16, 256, &b).unwrap()).unwrap();
    let _ = wa.with_packed(&pb);
}

/// The packed AVX2 kernel = the scalar reference, bitwise, for every token count (tiles of
/// 1..4 tokens and their remainders), alone and batched, threaded and not.
#[test]
fn packed_avx2_equals_scalar_bitwise_for_any_token_count() {
    if !Isa::Avx2.is_available() {
        eprintln!("no AVX2: the packed kernel is not reachable here");
        return;
    }
    for d in PACKED_32 {
        for &(rows, cols) in &[(8usize, 32usize), (64, 256), (136, 512), (512, 1024)] {
            let bytes = quantize(d, &data(rows * cols, rows as u64 + 7), cols).unwrap();
            let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
            let p = Packed::new(&wm).unwrap();
            let wp = wm.with_packed(&p);
            for n in [1usize, 2, 3, 4, 5, 9, 17] {
                let x = data(n * cols, 100 + n as u64);
                assert_packed_equals_scalar(&wm, &wp, &x, n);
            }
        }
    }
}

/// Packed matrices inside `matmul_multi` (mixed with unpacked ones) = their own calls.
#[test]
fn packed_matrices_in_matmul_multi_equal_separate_calls() {
    if !Isa::Avx2.is_available() {
        return;
    }
    assert_multi_equals_separate(&[(DType::Q4_0, 256), (DType::Q4_0, 64), (DType::Q8_0, 128), (DType::Q4_0, 36)], 3);
    assert_multi_equals_separate(&[(DType::Q4_1, 64), (DType::Q5_1, 64), (DType::Q4_1, 20), (DType::Q4_0, 8)], 2);
    assert_multi_equals_separate(&[(DType::Q5_0, 64), (DType::IQ4NL, 24), (DType::Q5_0, 12), (DType::MXFP4, 16)], 2);
}

/// The integer bounds the lane-per-row kernels rely on: Q4_0 nibbles all 15 (its four
/// registers' i16 sums reach 4 · 2 · 15 · 127 · 2 = 30,480 of 32,767) or all 0, Q5_0 / Q5_1
/// values all 31 (two registers' i16 sums reach 31,496) or all 0, Q8_0 values at −128 / +127
/// (the sign trick's |w| = 128), IQ4_NL at its table's ends (−127, 113), MXFP4 at ±12 (its
/// table plus 12 at 24 and 0) with subnormal, small and large E8M0 exponents, against activations
/// at ±full scale (±127) and mixed signs; random bytes elsewhere. Bitwise = the scalar
/// reference for 1..9 tokens.
#[test]
fn packed_avx2_is_exact_at_the_integer_bounds() {
    if !Isa::Avx2.is_available() {
        return;
    }
    let (rows, cols) = (16usize, 256usize);
    for d in PACKED_32 {
        let bb = d.block_bytes();
        // The bytes after `d` (and Q4_1 / Q5_1's `m`): Q5's fifth bits, then the quants.
        let h = match d {
            DType::Q4_1 | DType::Q5_1 => 4,
            DType::MXFP4 => 1,
            _ => 2,
        };
        let mut bytes = quantize(d, &data(rows * cols, 11), cols).unwrap();
        for (k, b) in bytes.chunks_exact_mut(bb).enumerate() {
            if d == DType::MXFP4 {
                // One exponent per row, so that a row of subnormal scales is not lost in
                // rounding against larger blocks.
                b[0] = [0, 1, 2, 127, 140][(k / (cols / 32)) % 5];
            }
            let fill: u8 = match (d, k % 4) {
                (DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4NL, 0) => 0xFF,
                (DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4NL, 1) => 0x00,
                (DType::Q8_0, 0) => 0x80,
                (DType::Q8_0, 1) => 0x7F,
                (DType::MXFP4, 0) => 0x77,
                (DType::MXFP4, 1) => 0xFF,
                _ => continue,
            };
            b[h..].iter_mut().for_each(|q| *q = fill);
        }
        let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        let p = Packed::new(&wm).unwrap();
        let wp = wm.with_packed(&p);
        for n in [1usize, 4, 9] {
            let mut x = data(n * cols, 40 + n as u64);
            for (t, row) in x.chunks_exact_mut(cols).enumerate() {
                match t % 3 {
                    0 => row.iter_mut().for_each(|v| *v = 1.5),
                    1 => row.iter_mut().enumerate().for_each(|(k, v)| *v = if (k / 3) % 2 == 0 { -2.0 } else { 2.0 }),
                    _ => {}
                }
            }
            assert_packed_equals_scalar(&wm, &wp, &x, n);
        }
    }
}

/// Every packed path's multi-token kernels (AVX2: tiles of ≤ 4 tokens; AVX-512 VNNI: ≤ 16,
/// K-quants ≤ 8) = the scalar reference, bitwise, at each token count 1..=16 and past a pass
/// (17, 33), on an
/// odd number of 8-row groups (8, 24 and 136 rows) and several widths; and each token's bits
/// are the same in a 1-token call as in any N-token call (`assert_packed_equals_scalar`).
#[test]
fn packed_paths_equal_scalar_bitwise_at_1_to_16_tokens() {
    if common::packed::packed_paths().is_empty() {
        eprintln!("no packed path on this CPU");
        return;
    }
    for d in PACKED_32 {
        for &(rows, cols) in &[(8usize, 64usize), (24, 2048), (136, 320)] {
            let bytes = quantize(d, &data(rows * cols, rows as u64 + 31), cols).unwrap();
            let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
            let p = Packed::new(&wm).unwrap();
            let wp = wm.with_packed(&p);
            for n in (1usize..=16).chain([17, 33]) {
                let x = data(n * cols, 300 + n as u64);
                assert_packed_equals_scalar(&wm, &wp, &x, n);
            }
        }
    }
}
