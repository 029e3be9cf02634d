//! Format metadata, hand-built block decoding, quantize→dequantize round trips, error cases.
#![allow(clippy::needless_range_loop)]

use crate::common;
use common::*;
use engram_kernels::*;
use half::{bf16, f16};

#[test]
fn dtype_metadata() {
    let expect = [
        (DType::F32, 0, "f32", 1, 4),
        (DType::F16, 1, "f16", 1, 2),
        (DType::BF16, 30, "bf16", 1, 2),
        (DType::Q8_0, 8, "q8_0", 32, 34),
        (DType::Q4_0, 2, "q4_0", 32, 18),
        (DType::Q4K, 12, "q4_k", 256, 144),
        (DType::Q6K, 14, "q6_k", 256, 210),
        (DType::Q4_1, 3, "q4_1", 32, 20),
        (DType::Q5_0, 6, "q5_0", 32, 22),
        (DType::Q5_1, 7, "q5_1", 32, 24),
        (DType::Q2K, 10, "q2_k", 256, 84),
        (DType::Q3K, 11, "q3_k", 256, 110),
        (DType::Q5K, 13, "q5_k", 256, 176),
        (DType::IQ4NL, 20, "iq4_nl", 32, 18),
        (DType::IQ4XS, 23, "iq4_xs", 256, 136),
        (DType::MXFP4, 39, "mxfp4", 32, 17),
        (DType::IQ3XXS, 18, "iq3_xxs", 256, 98),
        (DType::IQ3S, 21, "iq3_s", 256, 110),
    ];
    assert_eq!(expect.len(), DType::ALL.len());
    for (d, id, name, be, bb) in expect {
        assert_eq!(d.ggml_type_id(), id);
        assert_eq!(DType::from_ggml_type_id(id), Some(d));
        assert_eq!(d.name(), name);
        assert_eq!(d.block_elems(), be);
        assert_eq!(d.block_bytes(), bb);
        assert_eq!(d.row_bytes(be * 8), Some(bb * 8));
    }
    // Types no kernel here computes: Q8_1 (an activation format), IQ2_XXS, TQ1_0.
    for id in [9, 16, 34] {
        assert_eq!(DType::from_ggml_type_id(id), None);
    }
    assert_eq!(DType::Q4K.row_bytes(255), None);
    assert_eq!(DType::Q4_0.row_bytes(48), None);
    assert_eq!(DType::F16.row_bytes(7), Some(14));
}

fn h(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

#[test]
fn decode_q8_0_and_q4_0_blocks() {
    let mut b = vec![0u8; 34];
    b[..2].copy_from_slice(&h(0.5));
    for j in 0..32 {
        b[2 + j] = (j as i8 - 16) as u8;
    }
    let mut o = [0f32; 32];
    dequantize_row(DType::Q8_0, &b, &mut o);
    for j in 0..32 {
        assert_eq!(o[j], 0.5 * (j as f32 - 16.0));
    }
    // Q4_0: low nibble of qs[j] -> element j, high nibble -> element j+16.
    let mut b = vec![0u8; 18];
    b[..2].copy_from_slice(&h(2.0));
    for j in 0..16 {
        b[2 + j] = (j as u8) | ((15 - j as u8) << 4);
    }
    dequantize_row(DType::Q4_0, &b, &mut o);
    for j in 0..16 {
        assert_eq!(o[j], 2.0 * (j as f32 - 8.0));
        assert_eq!(o[j + 16], 2.0 * (7.0 - j as f32));
    }
}

#[test]
fn decode_float_formats() {
    let vals = [1.5f32, -2.25, 0.0, 65504.0];
    let f16b: Vec<u8> = vals.iter().flat_map(|v| h(*v)).collect();
    let bf: Vec<u8> = vals.iter().flat_map(|v| bf16::from_f32(*v).to_bits().to_le_bytes()).collect();
    let f32b: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut o = [0f32; 4];
    dequantize_row(DType::F16, &f16b, &mut o);
    assert_eq!(o, vals);
    dequantize_row(DType::F32, &f32b, &mut o);
    assert_eq!(o, vals);
    dequantize_row(DType::BF16, &bf, &mut o);
    assert_eq!(&o[..3], &vals[..3]);
    // BF16 is the top 16 bits of the f32.
    assert_eq!(u16::from_le_bytes([bf[0], bf[1]]), (1.5f32.to_bits() >> 16) as u16);
}

#[test]
fn decode_q4k_block() {
    // d = 1, dmin = 0.5; sub-block j has scale j+1 and min 2j (6-bit packing of get_scale_min_k4).
    let mut b = vec![0u8; 144];
    b[0..2].copy_from_slice(&h(1.0));
    b[2..4].copy_from_slice(&h(0.5));
    let sc: Vec<u8> = (0..8).map(|j| j as u8 + 1 + if j >= 4 { 40 } else { 0 }).collect();
    let mn: Vec<u8> = (0..8).map(|j| 2 * j as u8 + if j >= 4 { 20 } else { 0 }).collect();
    let s = &mut b[4..16];
    for j in 0..8 {
        if j < 4 {
            s[j] = sc[j];
            s[j + 4] = mn[j];
        } else {
            s[j + 4] = (sc[j] & 0xF) | ((mn[j] & 0xF) << 4);
            s[j - 4] |= (sc[j] >> 4) << 6;
            s[j] |= (mn[j] >> 4) << 6;
        }
    }
    // element e: nibble value e % 16. Chunk c = e / 64 holds sub-blocks 2c (low) and 2c+1 (high).
    for c in 0..4 {
        for l in 0..32 {
            let lo = ((64 * c + l) % 16) as u8;
            let hi = ((64 * c + 32 + l) % 16) as u8;
            b[16 + 32 * c + l] = lo | (hi << 4);
        }
    }
    let mut o = [0f32; 256];
    dequantize_row(DType::Q4K, &b, &mut o);
    for e in 0..256 {
        let j = e / 32;
        let want = sc[j] as f32 * (e % 16) as f32 - 0.5 * mn[j] as f32;
        assert_eq!(o[e], want, "element {e}");
    }
}

#[test]
fn decode_q6k_block() {
    // Element e gets 6-bit value (e * 7) % 64; scale of sub-block e/16 is (e/16) - 8; d = 0.25.
    let q = |e: usize| ((e * 7) % 64) as u8;
    let mut b = vec![0u8; 210];
    for hh in 0..2 {
        for l in 0..32 {
            let base = 128 * hh + l;
            let (q0, q1, q2, q3) = (q(base), q(base + 32), q(base + 64), q(base + 96));
            b[64 * hh + l] = (q0 & 0xF) | ((q2 & 0xF) << 4);
            b[64 * hh + l + 32] = (q1 & 0xF) | ((q3 & 0xF) << 4);
            b[128 + 32 * hh + l] = (q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6);
        }
    }
    for j in 0..16 {
        b[192 + j] = (j as i8 - 8) as u8;
    }
    b[208..210].copy_from_slice(&h(0.25));
    let mut o = [0f32; 256];
    dequantize_row(DType::Q6K, &b, &mut o);
    for e in 0..256 {
        let want = 0.25 * (e / 16) as f32 - 0.25 * 8.0;
        let want = want * (q(e) as f32 - 32.0);
        assert_eq!(o[e], want, "element {e}");
    }
}

/// Round trip: max error per block relative to the block's max |x| and overall relative RMS.
#[test]
fn quantize_round_trip_bounds() {
    let cols = 512;
    let rows = 8;
    let x = data(rows * cols, 7);
    // (dtype, max |err| / block amax, relative RMS error)
    let limits = [
        (DType::F32, 0.0, 0.0),
        (DType::F16, 1.0 / 2048.0, 1e-3),
        (DType::BF16, 1.0 / 256.0, 4e-3),
        (DType::Q8_0, 0.5 / 127.0 * 1.13, 6e-3),
        (DType::Q4_0, 1.0 / 8.0 * 1.01, 0.1),
        (DType::Q4K, 0.2, 0.1),
        (DType::Q6K, 0.05, 0.025),
        (DType::Q4_1, 1.0 / 15.0 * 1.01, 0.07),
        (DType::Q5_0, 1.0 / 16.0 * 1.01, 0.05),
        (DType::Q5_1, 1.0 / 31.0 * 1.01, 0.03),
        (DType::Q2K, 0.6, 0.4),
        (DType::Q3K, 0.35, 0.2),
        (DType::Q5K, 0.1, 0.05),
        (DType::IQ4NL, 0.2, 0.1),
        (DType::IQ4XS, 0.2, 0.1),
        (DType::MXFP4, 0.25, 0.15),
        // IQ3_XXS stores only even sign counts per 8 elements: one element of an odd group
        // takes the wrong sign (the smallest, at most twice its magnitude off).
        (DType::IQ3XXS, 1.0, 0.25),
        (DType::IQ3S, 0.35, 0.17),
    ];
    for (d, max_rel, rms_rel) in limits {
        let q = quantize(d, &x, cols).unwrap();
        assert_eq!(q.len(), rows * d.row_bytes(cols).unwrap());
        let y = dequant(d, &q, rows, cols);
        let (mut se, mut sx) = (0f64, 0f64);
        let blk = d.block_elems().max(32);
        for (xb, yb) in x.chunks(blk).zip(y.chunks(blk)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (a, b) in xb.iter().zip(yb) {
                let e = (a - b).abs();
                assert!(e <= max_rel * amax + 1e-7, "{d}: err {e} > {max_rel} * {amax}");
                se += (e as f64).powi(2);
                sx += (*a as f64).powi(2);
            }
        }
        let rel = (se / sx).sqrt();
        assert!(rel <= rms_rel, "{d}: relative RMS error {rel} > {rms_rel}");
        // Re-quantizing the dequantized values of an 8-bit format is stable.
        if d == DType::Q8_0 {
            assert_eq!(quantize(d, &y, cols).unwrap(), q);
        }
    }
}

#[test]
fn quantize_zero_rows() {
    for d in DType::ALL {
        let cols = 256;
        let q = quantize(d, &vec![0.0; cols], cols).unwrap();
        let y = dequant(d, &q, 1, cols);
        assert!(y.iter().all(|v| *v == 0.0), "{d}");
    }
}

#[test]
fn error_cases() {
    let data = vec![0u8; 100];
    assert!(matches!(WeightMatrix::new(DType::Q4_0, 2, 64, &data), Err(KernelError::BadLength { .. })));
    assert!(matches!(WeightMatrix::new(DType::Q4_0, 2, 48, &data), Err(KernelError::BadCols { .. })));
    assert!(matches!(WeightMatrix::new(DType::Q4K, 1, 128, &data), Err(KernelError::BadCols { .. })));
    assert!(WeightMatrix::new(DType::Q4_0, 2, 64, &data[..72]).is_ok());
    assert!(matches!(quantize(DType::Q8_0, &[0.0; 48], 48), Err(KernelError::BadCols { .. })));
    assert!(matches!(quantize(DType::F16, &[0.0; 10], 3), Err(KernelError::BadLength { .. })));
    assert!(matches!(quantize(DType::F16, &[0.0; 10], 0), Err(KernelError::BadLength { .. })));
    let e = WeightMatrix::new(DType::Q6K, 1, 256, &data).unwrap_err();
    assert!(e.to_string().contains("q6_k"));
}
