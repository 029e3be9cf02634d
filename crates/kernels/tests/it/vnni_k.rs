//! The 256-element formats (Q4_K and Q6_K packed; Q5_K, Q3_K, Q2_K, IQ4_XS, IQ3_XXS, IQ3_S as
//! stored) are bitwise the scalar reference on every x86 path, for decode calls (1..7 tokens:
//! the tiles, the packed kernels or the IQ3 rows) and prefill calls (≥ 8 tokens: the AVX-512 VNNI token-lane kernel, or the AVX2
//! panels): odd token counts (16-token groups with a ragged last one), row counts off the
//! 8-row band, rows longer than the decode tiles' 8-super-block run, several panels and
//! threads, spiky weights and activations that reach ±127, and random block bytes (every
//! scale, min and quant bit pattern).

use crate::common;
use common::packed::bits;
use common::*;
use engram_kernels::internal::{matmul_multi_with, matmul_with, Isa};
use engram_kernels::*;

fn spiky(n: usize, seed: u64) -> Vec<f32> {
    let mut v = data(n, seed);
    for (i, x) in v.iter_mut().enumerate() {
        if (i * 7 + seed as usize).is_multiple_of(61) {
            *x *= 40.0;
        }
    }
    v
}

/// Random block bytes with small finite `d` / `dmin` fields.
fn random_blocks(d: DType, rows: usize, cols: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let mut b: Vec<u8> = (0..rows * d.row_bytes(cols).unwrap()).map(|_| next() as u8).collect();
    let offs: &[usize] = match d {
        DType::Q4K | DType::Q5K => &[0, 2],
        DType::IQ4XS | DType::IQ3XXS | DType::IQ3S => &[0],
        DType::Q6K => &[208],
        DType::Q3K => &[108],
        DType::Q2K => &[80, 82],
        _ => unreachable!(),
    };
    for blk in b.chunks_exact_mut(d.block_bytes()) {
        for &o in offs {
            let v = half::f16::from_f32((next() % 1000) as f32 * 1e-4);
            blk[o..o + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
    }
    b
}

const KF: [DType; 8] = [DType::Q4K, DType::Q5K, DType::Q6K, DType::Q3K, DType::Q2K, DType::IQ4XS, DType::IQ3XXS, DType::IQ3S];

fn check(wm: &WeightMatrix, x: &[f32], n: usize, what: &str) {
    let (d, rows) = (wm.dtype, wm.rows);
    let mut want = vec![0f32; n * rows];
    matmul_with(Isa::Scalar, wm, x, n, &mut want);
    for isa in Isa::available().into_iter().filter(|i| *i != Isa::Scalar && *i != Isa::Neon) {
        let mut got = vec![f32::NAN; n * rows];
        matmul_with(isa, wm, x, n, &mut got);
        if bits(&got) != bits(&want) {
            let i = (0..n * rows).find(|&i| got[i].to_bits() != want[i].to_bits()).unwrap();
            panic!(
                "{d} {isa:?} {what} rows={rows} cols={} n={n}: element {i} (token {}, row {}) {} vs scalar {}",
                wm.cols,
                i / rows,
                i % rows,
                got[i],
                want[i]
            );
        }
    }
}

#[test]
fn k_formats_are_the_scalar_reference_bitwise_decode_and_prefill() {
    for d in KF {
        for &(rows, cols) in &[(301usize, 2048usize), (136, 768), (13, 256), (19, 2560)] {
            for (wi, bytes) in [quantize(d, &spiky(rows * cols, 21), cols).unwrap(), random_blocks(d, rows, cols, 5)].iter().enumerate() {
                let wm = WeightMatrix::new(d, rows, cols, bytes).unwrap();
                let p = Packed::new(&wm);
                let wp = p.as_ref().map(|p| wm.with_packed(p));
                for &n in &[1usize, 3, 7, 8, 16, 17, 33] {
                    let x = spiky(n * cols, 22 + n as u64);
                    // Q4_K / Q6_K as stored keep the older tiles (summed in another order); they
                    // reach the kernels tested here through their packing.
                    if !matches!(d, DType::Q4K | DType::Q6K) {
                        check(&wm, &x, n, &format!("weights {wi} as stored"));
                    }
                    if let Some(wp) = &wp {
                        check(wp, &x, n, &format!("weights {wi} packed"));
                    }
                }
            }
        }
    }
}

/// Several K matrices, packed and not, in one `matmul_multi` (one shared activation
/// transposition) = their own calls = the scalar path.
#[test]
fn k_formats_in_matmul_multi_equal_separate_calls() {
    let cols = 512;
    let shapes = [
        (DType::Q5K, 40usize),
        (DType::Q6K, 64),
        (DType::Q4K, 24),
        (DType::IQ4XS, 19),
        (DType::Q3K, 8),
        (DType::IQ3S, 11),
        (DType::IQ3XXS, 16),
    ];
    let bytes: Vec<Vec<u8>> =
        shapes.iter().enumerate().map(|(i, &(d, r))| quantize(d, &data(r * cols, 80 + i as u64), cols).unwrap()).collect();
    let plain: Vec<WeightMatrix> = shapes.iter().zip(&bytes).map(|(&(d, r), b)| WeightMatrix::new(d, r, cols, b).unwrap()).collect();
    let packs: Vec<Option<Packed>> = plain.iter().map(Packed::new).collect();
    let ws: Vec<WeightMatrix> = plain.iter().zip(&packs).map(|(w, p)| p.as_ref().map_or(*w, |p| w.with_packed(p))).collect();
    let wr: Vec<&WeightMatrix> = ws.iter().collect();
    for n in [9usize, 40] {
        let x = data(n * cols, 90 + n as u64);
        for isa in Isa::available().into_iter().filter(|i| *i != Isa::Neon) {
            let mut multi: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
            let mut refs: Vec<&mut [f32]> = multi.iter_mut().map(|v| v.as_mut_slice()).collect();
            matmul_multi_with(isa, &wr, &x, n, &mut refs);
            for (i, w) in ws.iter().enumerate() {
                let mut s = vec![0f32; n * w.rows];
                matmul_with(Isa::Scalar, w, &x, n, &mut s);
                assert_eq!(bits(&s), bits(&multi[i]), "{isa:?} matrix {i} ({}) n={n}", w.dtype);
            }
        }
    }
}

/// Q3_K and Q2_K at the extremes of their codes and scales, against activations that quantize
/// to ±127 (Q8_K gives the first largest-magnitude element −127, the others down to −127 or up
/// to +127): the sub-block sums reach the bound the token lanes rely on to apply the scale in
/// i16 (Q3_K 16·4·255, Q2_K 16·3·127), and stay the scalar reference's bits.
#[test]
fn k_token_lane_sums_at_their_bound_are_exact() {
    let (rows, cols) = (16usize, 512usize);
    let d1 = half::f16::from_f32(0.01).to_bits().to_le_bytes();
    // (format, bytes of one block): codes all −4 or all 3 with scales all −32 or 31 (Q3_K);
    // codes all 3 or all 0 with scales 15 and mins 15 or 0 (Q2_K).
    let mut blocks: Vec<(DType, Vec<u8>)> = Vec::new();
    for (code, scale) in [(0x00u8, 0x00u8), (0xFF, 0xFF), (0x00, 0xFF), (0xFF, 0x00)] {
        let mut b = vec![code; DType::Q3K.block_bytes()];
        b[96..108].fill(scale);
        b[108..110].copy_from_slice(&d1);
        blocks.push((DType::Q3K, b));
    }
    for (code, scale) in [(0xFFu8, 0xFFu8), (0x00, 0x0F), (0xFF, 0x0F)] {
        let mut b = vec![code; DType::Q2K.block_bytes()];
        b[..16].fill(scale);
        b[80..82].copy_from_slice(&d1);
        b[82..84].copy_from_slice(&d1);
        blocks.push((DType::Q2K, b));
    }
    for (d, block) in blocks {
        let bytes: Vec<u8> = block.iter().copied().cycle().take(rows * d.row_bytes(cols).unwrap()).collect();
        let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        for n in [16usize, 33] {
            // Every element of one magnitude: all of one sign quantize to −127; with the first
            // of each 256 of the other sign (the reference's `max`), the others to +127.
            for first in [1.0f32, -1.0] {
                let x: Vec<f32> = (0..n * cols).map(|i| if i % 256 == 0 { first } else { 1.0 }).collect();
                check(&wm, &x, n, &format!("extreme codes {:#04x} scales {:#04x}, first {first}", block[40], block[0]));
            }
        }
    }
}
