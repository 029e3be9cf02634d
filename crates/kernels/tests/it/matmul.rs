//! matmul correctness: every dtype × every available kernel path vs an f64 reference with an
//! explicit error bound, SIMD vs scalar, and n_tokens independence (bitwise).

use crate::common;
use common::*;
use engram_kernels::internal::{matmul_with, Isa};
use engram_kernels::*;

const TOKENS: [usize; 6] = [1, 2, 3, 7, 16, 33];

fn check_against_reference(d: DType, rows: usize, cols: usize, seed: u64) {
    let w = data(rows * cols, seed);
    let bytes = quantize(d, &w, cols).unwrap();
    let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
    let wd = dequant(d, &bytes, rows, cols);
    for &n in &TOKENS {
        let x = data(n * cols, seed + 100 + n as u64);
        let (refv, bound) = reference(d, &wd, &x, rows, cols, n);
        for isa in Isa::available() {
            let mut out = vec![f32::NAN; n * rows];
            matmul_with(isa, &wm, &x, n, &mut out);
            let (mut num, mut den) = (0f64, 0f64);
            for i in 0..n * rows {
                let e = (out[i] as f64 - refv[i]).abs();
                assert!(
                    e <= bound[i],
                    "{d} {isa:?} rows={rows} cols={cols} n={n} i={i}: got {} want {} (err {e} > bound {})",
                    out[i],
                    refv[i],
                    bound[i]
                );
                num += e * e;
                den += refv[i] * refv[i];
            }
            // Whole-output relative error: ~1e-2 budget for 8-bit activations, near-exact otherwise.
            // Only meaningful with enough outputs (a 1-2 element norm can be tiny by cancellation).
            let rel = (num / den.max(1e-30)).sqrt();
            let lim = if act_block(d) > 0 { 1e-2 } else { 1e-5 };
            if n * rows >= 64 {
                assert!(rel <= lim, "{d} {isa:?} n={n}: relative error {rel} > {lim}");
            }
        }
    }
}

#[test]
fn matmul_matches_reference_all_dtypes() {
    for d in DType::ALL {
        for &cols in &[256, 512] {
            for &rows in &[1, 5, 64] {
                check_against_reference(d, rows, cols, (rows * 31 + cols) as u64);
            }
        }
    }
}

#[test]
fn simd_paths_match_scalar() {
    let (rows, cols) = (37, 512);
    for d in DType::ALL {
        let w = data(rows * cols, 3);
        let bytes = quantize(d, &w, cols).unwrap();
        let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        let wd = dequant(d, &bytes, rows, cols);
        let n = 9;
        let x = data(n * cols, 4);
        let mut want = vec![0f32; n * rows];
        matmul_with(Isa::Scalar, &wm, &x, n, &mut want);
        // Integer parts are exact on every path; only f32 summation order differs.
        let (_, bound) = reference(DType::F32, &wd, &x, rows, cols, n);
        for isa in Isa::available() {
            let mut got = vec![0f32; n * rows];
            matmul_with(isa, &wm, &x, n, &mut got);
            for i in 0..n * rows {
                let e = (got[i] - want[i]).abs() as f64;
                assert!(e <= bound[i], "{d} {isa:?} i={i}: {} vs scalar {}", got[i], want[i]);
            }
        }
    }
    let avail = Isa::available();
    eprintln!("kernel paths tested: {avail:?}");
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        assert!(avail.contains(&Isa::Avx2));
    }
}

/// The AMX path sums each Q4_0 / Q8_0 block exactly and scales it as the scalar reference
/// does (a multiply, then an add), so on the matrix's own bytes (the VNNI kernel below 4 tokens,
/// the tiles from 4) it is bitwise the reference; with a packing, see `common::packed`.
#[test]
fn amx_tiles_are_bitwise_the_scalar_reference() {
    if !Isa::Amx.is_available() {
        eprintln!("no AMX on this CPU: nothing to check");
        return;
    }
    let (rows, cols) = (40, 512);
    for d in [DType::Q4_0, DType::Q8_0] {
        let bytes = quantize(d, &data(rows * cols, 21), cols).unwrap();
        let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        for n in [1usize, 2, 3, 4, 5, 16, 17, 35] {
            let x = data(n * cols, 22 + n as u64);
            let (mut want, mut got) = (vec![0f32; n * rows], vec![f32::NAN; n * rows]);
            matmul_with(Isa::Scalar, &wm, &x, n, &mut want);
            matmul_with(Isa::Amx, &wm, &x, n, &mut got);
            assert_eq!(packed::bits(&got), packed::bits(&want), "{d} n={n}");
        }
    }
}

#[test]
fn result_independent_of_n_tokens_bitwise() {
    for d in DType::ALL {
        for &cols in &[256usize, 512] {
            let rows = 70; // not a multiple of the row tile
            let w = data(rows * cols, 11);
            let bytes = quantize(d, &w, cols).unwrap();
            let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
            let n = 33;
            let x = data(n * cols, 12);
            for isa in Isa::available() {
                let mut batch = vec![0f32; n * rows];
                matmul_with(isa, &wm, &x, n, &mut batch);
                // single tokens
                for t in 0..n {
                    let mut one = vec![0f32; rows];
                    matmul_with(isa, &wm, &x[t * cols..(t + 1) * cols], 1, &mut one);
                    assert_eq!(
                        one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        batch[t * rows..(t + 1) * rows].iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{d} {isa:?} token {t}"
                    );
                }
                // chunked "prefill": 5 + 28 tokens
                let mut a = vec![0f32; 5 * rows];
                let mut b = vec![0f32; 28 * rows];
                matmul_with(isa, &wm, &x[..5 * cols], 5, &mut a);
                matmul_with(isa, &wm, &x[5 * cols..], 28, &mut b);
                a.extend_from_slice(&b);
                assert!(a.iter().zip(&batch).all(|(p, q)| p.to_bits() == q.to_bits()), "{d} {isa:?} chunked");
            }
        }
    }
}

/// Float weights in calls of 6 or more tokens (AVX-512 F16 / BF16: tiles of 4 rows × 6 tokens
/// over interleaved activations, the rest in 4 × 4 tiles) give each token the bits of its own
/// one-token call, for row counts that leave 1–3 rows and columns that are and are not a
/// multiple of 16.
#[test]
fn float_calls_of_six_or_more_tokens_match_one_token_calls_bitwise() {
    for d in [DType::F32, DType::F16, DType::BF16] {
        for (rows, cols) in [(9usize, 48usize), (10, 40), (11, 1024), (6, 2048)] {
            let w = data(rows * cols, 31);
            let bytes = quantize(d, &w, cols).unwrap();
            let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
            for n in [6usize, 7, 12, 13, 20] {
                let x = data(n * cols, 32 + n as u64);
                for isa in Isa::available() {
                    let mut batch = vec![f32::NAN; n * rows];
                    matmul_with(isa, &wm, &x, n, &mut batch);
                    for t in 0..n {
                        let mut one = vec![f32::NAN; rows];
                        matmul_with(isa, &wm, &x[t * cols..(t + 1) * cols], 1, &mut one);
                        assert_eq!(
                            packed::bits(&one),
                            packed::bits(&batch[t * rows..(t + 1) * rows]),
                            "{d} {isa:?} {rows}x{cols} n={n} token {t}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn odd_shapes_and_tails() {
    // Odd block counts (AVX-512 pairs blocks) and float rows that are not a multiple of 8/16.
    for (d, cols) in [(DType::Q4_0, 96), (DType::Q8_0, 160), (DType::F16, 37), (DType::BF16, 23), (DType::F32, 5)] {
        check_against_reference(d, 9, cols, 5);
    }
    for d in [DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::IQ4NL, DType::MXFP4] {
        check_against_reference(d, 9, 96, 5);
    }
    for d in [DType::Q4K, DType::Q6K, DType::Q2K, DType::Q3K, DType::Q5K, DType::IQ4XS, DType::IQ3XXS, DType::IQ3S] {
        check_against_reference(d, 3, 768, 6);
    }
}

#[test]
fn public_matmul_and_pool() {
    assert!(num_threads() >= 1);
    let _ = pool();
    let (rows, cols, n) = (128, 512, 4);
    let w = data(rows * cols, 1);
    let bytes = quantize(DType::Q4_0, &w, cols).unwrap();
    let wm = WeightMatrix::new(DType::Q4_0, rows, cols, &bytes).unwrap();
    let x = data(n * cols, 2);
    let mut a = vec![0f32; n * rows];
    let mut b = vec![0f32; n * rows];
    matmul(&wm, &x, n, &mut a);
    matmul_with(Isa::detect(), &wm, &x, n, &mut b);
    assert_eq!(a, b);
    // zero tokens is a no-op
    matmul(&wm, &[], 0, &mut []);
}

/// `matmul_multi` (one parallel region, activations prepared once per format) gives every
/// matrix bitwise what its own `matmul` call gives, on every path, for mixed formats and row
/// counts (including an empty matrix) and token counts that do and do not run threaded.
#[test]
fn matmul_multi_equals_separate_calls_bitwise() {
    use engram_kernels::internal::matmul_multi_with;
    let cols = 512;
    let mixes: [&[(DType, usize)]; 6] = [
        &[(DType::Q4_1, 64), (DType::Q5_0, 32), (DType::Q5_1, 16), (DType::IQ4NL, 8), (DType::MXFP4, 40), (DType::Q4_0, 24)],
        &[(DType::Q5K, 32), (DType::Q3K, 16), (DType::Q2K, 8), (DType::IQ4XS, 24), (DType::Q4K, 8), (DType::IQ3XXS, 12), (DType::IQ3S, 20)],
        &[(DType::Q4_0, 300), (DType::Q4_0, 76), (DType::Q4_0, 76)],
        &[(DType::Q4K, 160), (DType::Q6K, 48), (DType::Q4K, 0)],
        &[(DType::Q8_0, 96), (DType::F16, 130), (DType::BF16, 17), (DType::F32, 33)],
        &[(DType::Q6K, 256)],
    ];
    for (m, mix) in mixes.iter().enumerate() {
        let bytes: Vec<Vec<u8>> =
            mix.iter().enumerate().map(|(i, &(d, r))| quantize(d, &data(r * cols, 40 + i as u64), cols).unwrap()).collect();
        let ws: Vec<WeightMatrix> = mix.iter().zip(&bytes).map(|(&(d, r), b)| WeightMatrix::new(d, r, cols, b).unwrap()).collect();
        let wr: Vec<&WeightMatrix> = ws.iter().collect();
        for n in [1usize, 4, 17] {
            let x = data(n * cols, 50 + n as u64);
            for isa in Isa::available() {
                let mut multi: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
                let mut refs: Vec<&mut [f32]> = multi.iter_mut().map(|v| v.as_mut_slice()).collect();
                matmul_multi_with(isa, &wr, &x, n, &mut refs);
                for (i, w) in ws.iter().enumerate() {
                    let mut one = vec![0f32; n * w.rows];
                    matmul_with(isa, w, &x, n, &mut one);
                    assert!(one.iter().zip(&multi[i]).all(|(a, b)| a.to_bits() == b.to_bits()), "mix {m} matrix {i} {isa:?} n={n}");
                }
            }
        }
    }
}

/// `matmul_grouped` (each matrix over its own activations, one parallel region; a mixture's
/// experts) gives every item bitwise what its own `matmul` call gives, on every path: mixed
/// formats, items sharing one activation slice (an expert's gate and up), different token
/// counts per item (0 included), an empty matrix, and calls that do and do not run threaded.
#[test]
fn matmul_grouped_equals_separate_calls_bitwise() {
    use engram_kernels::internal::matmul_grouped_with;
    let cols = 512;
    let mix: [(DType, usize); 7] =
        [(DType::Q4_0, 96), (DType::Q4_0, 96), (DType::Q4K, 64), (DType::Q6K, 40), (DType::Q8_0, 0), (DType::MXFP4, 72), (DType::F16, 33)];
    let bytes: Vec<Vec<u8>> =
        mix.iter().enumerate().map(|(i, &(d, r))| quantize(d, &data(r * cols, 60 + i as u64), cols).unwrap()).collect();
    let ws: Vec<WeightMatrix> = mix.iter().zip(&bytes).map(|(&(d, r), b)| WeightMatrix::new(d, r, cols, b).unwrap()).collect();
    // Tokens per item: one each (a decoded token: too little work to thread), and a prefill's
    // uneven split (threaded); items 0 and 1 share one activation slice, as an expert's gate
    // and up do.
    for tokens in [[1usize, 1, 1, 1, 1, 1, 1], [3, 3, 1, 0, 2, 17, 5]] {
        let slice = |i: usize| if i == 1 { 0 } else { i };
        let xs: Vec<Vec<f32>> = tokens.iter().enumerate().map(|(i, &n)| data(n * cols, 70 + i as u64)).collect();
        for isa in Isa::available() {
            let mut outs: Vec<Vec<f32>> = (0..mix.len()).map(|i| vec![f32::NAN; tokens[i] * ws[i].rows]).collect();
            let mut items: Vec<MatmulItem> =
                outs.iter_mut().enumerate().map(|(i, o)| MatmulItem { w: &ws[i], x: &xs[slice(i)], n_tokens: tokens[i], out: o }).collect();
            matmul_grouped_with(isa, &mut items);
            drop(items);
            for (i, w) in ws.iter().enumerate() {
                let mut one = vec![0f32; tokens[i] * w.rows];
                matmul_with(isa, w, &xs[slice(i)], tokens[i], &mut one);
                assert!(one.iter().zip(&outs[i]).all(|(a, b)| a.to_bits() == b.to_bits()), "item {i} {isa:?} tokens {tokens:?}");
            }
        }
    }
}

/// The multi-token path of Q5_K / Q3_K / Q2_K / IQ4_XS (a panel decoded once per call, wider
/// micro-kernels) gives each token exactly the bits of a one-token call, on shapes that span
/// several row chunks and threads, with row counts off the 4-row group, every token tail
/// (n mod 4), and spiky weights and activations that reach the ±127 activation range.
#[test]
fn k_panel_prefill_matches_decode_bitwise() {
    let spiky = |n: usize, seed: u64| -> Vec<f32> {
        let mut v = data(n, seed);
        for (i, x) in v.iter_mut().enumerate() {
            // One element in 61 forty times larger: blocks whose scale an outlier sets.
            let phase = (i * 7 + seed as usize) % 61;
            if phase == 0 {
                *x *= 40.0;
            }
        }
        v
    };
    for d in [DType::Q5K, DType::Q3K, DType::Q2K, DType::IQ4XS, DType::IQ3XXS, DType::IQ3S] {
        for &(rows, cols) in &[(301usize, 2048usize), (6, 768)] {
            let w = spiky(rows * cols, 21);
            let bytes = quantize(d, &w, cols).unwrap();
            let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
            for &n in &[8usize, 13, 18, 31] {
                let x = spiky(n * cols, 22 + n as u64);
                for isa in Isa::available() {
                    let mut batch = vec![0f32; n * rows];
                    matmul_with(isa, &wm, &x, n, &mut batch);
                    for t in 0..n {
                        let mut one = vec![0f32; rows];
                        matmul_with(isa, &wm, &x[t * cols..(t + 1) * cols], 1, &mut one);
                        let got: Vec<u32> = batch[t * rows..(t + 1) * rows].iter().map(|v| v.to_bits()).collect();
                        let want: Vec<u32> = one.iter().map(|v| v.to_bits()).collect();
                        assert_eq!(got, want, "{d} {isa:?} rows={rows} cols={cols} n={n} token {t}");
                    }
                }
            }
        }
    }
}

/// The multi-token path at its integer bounds: every weight value at its format's maximum
/// (all code bits set: Q5_K 31, Q3_K 3 with no −4, Q2_K 3; the largest scales and mins) against
/// activations quantized to −128 or +127 gives the scalar reference's bits, so the pieces of a
/// sub-block summed in i16 before widening never overflow.
#[test]
fn k_panel_at_the_integer_bounds_is_the_scalar_reference() {
    let cols = 512;
    let rows = 9;
    for (d, bytes, scale_at) in [(DType::Q5K, 176usize, &[0usize, 2][..]), (DType::Q3K, 110, &[108][..]), (DType::Q2K, 84, &[80, 82][..])] {
        let mut block = vec![0xFFu8; bytes];
        for &at in scale_at {
            block[at..at + 2].copy_from_slice(&0x3C00u16.to_le_bytes()); // f16 1.0
        }
        let w: Vec<u8> = block.iter().copied().cycle().take(bytes * rows * cols / 256).collect();
        let wm = WeightMatrix::new(d, rows, cols, &w).unwrap();
        for sign in [-1.0f32, 1.0] {
            let n = 9;
            // Constant rows quantize to ±128/127 codes; one token alternates to reach both.
            let x: Vec<f32> = (0..n * cols).map(|i| if i / cols == 4 && i % 2 == 1 { -sign } else { sign }).collect();
            let mut want = vec![0f32; n * rows];
            matmul_with(Isa::Scalar, &wm, &x, n, &mut want);
            for isa in Isa::available() {
                let mut got = vec![0f32; n * rows];
                matmul_with(isa, &wm, &x, n, &mut got);
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
                assert_eq!(bits(&got), bits(&want), "{d} {isa:?} sign {sign}");
            }
        }
    }
}
