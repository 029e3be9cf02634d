//! Repacked Q4_K / Q5_K / Q6_K / Q3_K / IQ4_XS / Q2_K weights (`Packed`, 8-row groups for the AVX2 GEMV): the packing
//! keeps every byte (any bytes, including every 6-bit scale/min and ql/qh bit pattern); on the
//! AVX2 path a packed matrix gives bitwise the scalar reference's result for 1..17 tokens,
//! alone or batched, in `matmul` and `matmul_multi`, including the extreme values that bound
//! the kernel's i16 sums; shapes it cannot pack are refused.

use crate::common;
use common::packed::{assert_multi_equals_separate, assert_packed_equals_scalar};
use common::*;
use engram_kernels::internal::Isa;
use engram_kernels::*;

const KQ: [DType; 6] = [DType::Q4K, DType::Q5K, DType::Q6K, DType::Q3K, DType::IQ4XS, DType::Q2K];

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    }
}

/// Random block bytes (every scale, min and quant bit pattern) with finite, small `d`/`dmin`
/// (`finite = false`: the `d` fields random too, for byte round trips only).
fn random_bytes(d: DType, rows: usize, cols: usize, seed: u64, finite: bool) -> Vec<u8> {
    let mut next = rng(seed);
    let mut b: Vec<u8> = (0..rows * d.row_bytes(cols).unwrap()).map(|_| next() as u8).collect();
    if finite {
        let bb = d.block_bytes();
        let offs: &[usize] = match d {
            DType::Q6K => &[208],
            DType::IQ4XS => &[0],
            DType::Q2K => &[80, 82],
            DType::Q3K => &[108],
            _ => &[0, 2],
        };
        for blk in b.chunks_exact_mut(bb) {
            for &o in offs {
                let v = half::f16::from_f32((next() % 1000) as f32 * 1e-5);
                blk[o..o + 2].copy_from_slice(&v.to_bits().to_le_bytes());
            }
        }
    }
    b
}

#[test]
fn k_packing_keeps_every_byte_and_refuses_what_it_cannot_pack() {
    for d in KQ {
        let (rows, cols) = (24, 512);
        for (i, bytes) in [quantize(d, &data(rows * cols, 1), cols).unwrap(), random_bytes(d, rows, cols, 2, false)].iter().enumerate() {
            let wm = WeightMatrix::new(d, rows, cols, bytes).unwrap();
            let p = Packed::new(&wm).expect("24 rows pack");
            let want = match d {
                DType::Q4K => bytes.len() / 1152 * 1184,
                DType::Q5K => bytes.len() / 1408 * 1440,
                DType::Q3K => bytes.len() / 880 * 912,
                DType::IQ4XS => bytes.len() / 1088 * 1104,
                _ => bytes.len(),
            };
            assert_eq!(p.num_bytes(), want, "{d}: the source's size (Q4_K / Q5_K / Q3_K / IQ4_XS: scales and mins unpacked)");
            for r in 0..rows {
                assert_eq!(p.unpack_row(r), wm.row(r), "{d} input {i} row {r}");
            }
        }
        let bytes = quantize(d, &data(20 * 256, 3), 256).unwrap();
        assert!(Packed::new(&WeightMatrix::new(d, 20, 256, &bytes).unwrap()).is_none(), "{d}: 20 rows are not whole groups");
    }
}

/// Activations with every element at ±full scale (quantized to ±127), and ordinary ones.
fn acts(n: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut x = data(n * cols, seed);
    let mut next = rng(seed + 1);
    for (t, row) in x.chunks_exact_mut(cols).enumerate() {
        match t % 3 {
            0 => row.iter_mut().for_each(|v| *v = 1.5),
            1 => row.iter_mut().for_each(|v| *v = if next().is_multiple_of(2) { -2.0 } else { 2.0 }),
            _ => {}
        }
    }
    x
}

/// The packed AVX2 kernel = the scalar reference, bitwise, for every token count, alone and
/// batched, threaded and not; quantized weights and random bytes (every 6-bit value).
#[test]
fn k_packed_avx2_equals_scalar_bitwise_for_any_token_count() {
    if !Isa::Avx2.is_available() {
        eprintln!("no AVX2: the packed kernel is not reachable here");
        return;
    }
    for d in KQ {
        for &(rows, cols, rand) in &[(8usize, 256usize, true), (64, 512, false), (136, 1024, true), (512, 1024, false)] {
            let bytes =
                if rand { random_bytes(d, rows, cols, rows as u64, true) } else { quantize(d, &data(rows * cols, 7), cols).unwrap() };
            let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
            let p = Packed::new(&wm).unwrap();
            let wp = wm.with_packed(&p);
            for n in [1usize, 2, 3, 4, 5, 9, 17] {
                let x = acts(n, cols, 100 + n as u64);
                assert_packed_equals_scalar(&wm, &wp, &x, n);
            }
        }
    }
}

/// Packed Q4_K / Q5_K / Q6_K / Q3_K / IQ4_XS / Q2_K matrices in one `matmul_multi` with unpacked ones = their own calls.
#[test]
fn k_packed_in_matmul_multi_equal_separate_calls() {
    if !Isa::Avx2.is_available() {
        return;
    }
    assert_multi_equals_separate(&[(DType::Q4K, 256), (DType::Q6K, 64), (DType::Q4K, 36), (DType::Q4_0, 64)], 2);
    assert_multi_equals_separate(&[(DType::IQ4XS, 64), (DType::Q5K, 16), (DType::IQ4XS, 20), (DType::Q2K, 8)], 2);
    assert_multi_equals_separate(&[(DType::Q2K, 64), (DType::Q3K, 16), (DType::Q2K, 12), (DType::IQ4XS, 8)], 2);
    assert_multi_equals_separate(&[(DType::Q5K, 64), (DType::Q4K, 16), (DType::Q5K, 12), (DType::Q3K, 8)], 2);
}

/// Every packed path's Q4_K / Q5_K / Q6_K / Q3_K / IQ4_XS / Q2_K kernels (AVX2: ≤ 4 tokens per tile; AVX-512 VNNI: ≤ 8, then
/// `vnni_k` from 8 tokens) = the scalar reference, bitwise, at each token count 1..=8 and past
/// a tile, on odd numbers of 8-row groups, random block bytes (every scale and quant bit
/// pattern) and quantized ones, activations at full scale; each token's bits are the same
/// alone as in any N-token call.
#[test]
fn k_packed_paths_equal_scalar_bitwise_at_1_to_8_tokens() {
    if common::packed::packed_paths().is_empty() {
        eprintln!("no packed path on this CPU");
        return;
    }
    for d in KQ {
        for &(rows, cols, rand) in &[(8usize, 512usize, true), (24, 2048, false), (136, 256, true)] {
            let bytes =
                if rand { random_bytes(d, rows, cols, rows as u64 + 5, true) } else { quantize(d, &data(rows * cols, 9), cols).unwrap() };
            let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
            let p = Packed::new(&wm).unwrap();
            let wp = wm.with_packed(&p);
            for n in (1usize..=8).chain([13, 16]) {
                let x = acts(n, cols, 400 + n as u64);
                assert_packed_equals_scalar(&wm, &wp, &x, n);
            }
        }
    }
}

/// Calls of many tokens on packed IQ4_XS / Q2_K / Q5_K decode their prefill panel from the
/// packing (`k_panel`, from 64 tokens; packed Q3_K keeps its packed kernel): bitwise the scalar
/// reference, and each token's bits the same as in a one-token call (the packed kernels').
#[test]
fn k_packed_prefill_panels_read_from_the_packing_equal_scalar() {
    if !Isa::Avx2.is_available() {
        return;
    }
    for d in [DType::IQ4XS, DType::Q2K, DType::Q5K, DType::Q3K] {
        for &(rows, cols, rand) in &[(24usize, 512usize, true), (40, 256, false)] {
            let bytes = if rand { random_bytes(d, rows, cols, 90, true) } else { quantize(d, &data(rows * cols, 91), cols).unwrap() };
            let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
            let p = Packed::new(&wm).unwrap();
            let wp = wm.with_packed(&p);
            for n in [64usize, 70] {
                assert_packed_equals_scalar(&wm, &wp, &acts(n, cols, 600 + n as u64), n);
            }
        }
    }
}

/// Q4_K / Q5_K / Q3_K blocks at the packed kernels' i16 bound (every value 15 / 31 / 7 before
/// its offset, every scale and min 63) against activations all at +127 or all at −127: the
/// i16 sums of a sub-block's pieces reach 4 · 2·31·127 (Q3_K: 2 · 2·28·127 in its odd crumbs)
/// without saturating, bitwise the scalar reference.
#[test]
fn k_packed_sums_at_their_bound_are_exact() {
    if common::packed::packed_paths().is_empty() {
        return;
    }
    let (rows, cols) = (16, 512);
    for d in [DType::Q4K, DType::Q5K, DType::Q3K] {
        let mut bytes = vec![0xFFu8; rows * d.row_bytes(cols).unwrap()];
        let (at_d, at_dmin) = if d == DType::Q3K { (108, None) } else { (0, Some(2)) };
        for b in bytes.chunks_exact_mut(d.block_bytes()) {
            b[at_d..at_d + 2].copy_from_slice(&half::f16::from_f32(0.25).to_bits().to_le_bytes());
            if let Some(o) = at_dmin {
                b[o..o + 2].copy_from_slice(&half::f16::from_f32(0.125).to_bits().to_le_bytes());
            }
        }
        let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        let p = Packed::new(&wm).unwrap();
        let wp = wm.with_packed(&p);
        for v in [1.5f32, -2.0] {
            for n in [1usize, 2, 4, 64] {
                assert_packed_equals_scalar(&wm, &wp, &vec![v; n * cols], n);
            }
        }
    }
}
