//! The tile attention packs stored rows (f16, Q8_0, Q4_0) straight into tiles; each must give
//! bitwise what the f32 entry gives for the same values — every head dimension the tiles take,
//! partial chunks, masks, causal rows, any number of query rows — at both precisions.

use engram_kernels::flash::{supported, Flash, Precision, Rows, CHUNK};
use engram_kernels::{dequantize_row, quantize, DType};
use half::f16;

/// Little-endian f16 rows as the KV store holds them.
fn bytes(x: &[f16]) -> Vec<u8> {
    x.iter().flat_map(|h| h.to_le_bytes()).collect()
}

fn values(n: usize, seed: usize) -> Vec<f16> {
    (0..n).map(|i| f16::from_f32(((i * 2654435761 + seed * 97) % 2001) as f32 / 400.0 - 2.5)).collect()
}

#[test]
fn f16_chunks_equal_their_f32_values_bitwise() {
    if !supported(16) {
        eprintln!("no AMX-BF16 here: tile path not tested");
        return;
    }
    let cases = [(16, 5, 3, 7), (48, 33, 2, 32), (64, 256, 4, 19), (64, 4, 5, 1), (128, 17, 2, 30), (80, 16, 1, 32)];
    for ((hd, rows, chunks, last), precision) in cases.into_iter().flat_map(|c| [(c, Precision::Exact), (c, Precision::Bf16)]) {
        let q: Vec<f32> = values(rows * hd, 3).iter().map(|x| x.to_f32() * 0.2).collect();
        let pos0 = (chunks - 1) * CHUNK + last - rows.min(last);
        let mut a = Flash::with_precision(&q, rows, hd, pos0, 1, precision);
        let mut b = Flash::with_precision(&q, rows, hd, pos0, 1, precision);
        for c in 0..chunks {
            let n = if c + 1 == chunks { last } else { CHUNK };
            let (k, v) = (values(n * hd, 10 + c), values(n * hd, 20 + c));
            let mask: Vec<bool> = (0..n).map(|i| (i * 7 + c) % 5 != 0).collect();
            let mask = (c % 2 == 1).then_some(&mask[..]);
            let floats = |x: &[f16]| x.iter().map(|h| h.to_f32()).collect::<Vec<f32>>();
            a.add_rows(Rows::F16(&bytes(&k)), Rows::F16(&bytes(&v)), n, c * CHUNK, mask);
            b.add_chunk(&floats(&k), &floats(&v), n, c * CHUNK, mask);
        }
        let (mut oa, mut ob) = (vec![0f32; rows * hd], vec![0f32; rows * hd]);
        a.finish(&mut oa);
        b.finish(&mut ob);
        assert!(oa.iter().any(|x| *x != 0.0), "hd {hd}: nothing attended");
        assert!(oa.iter().zip(&ob).all(|(x, y)| x.to_bits() == y.to_bits()), "{precision:?} hd {hd} rows {rows}: f16 differs from f32");
    }
}

/// `Flash::prefetch` is a hint: queued lines (here also of buffers freed before they are
/// issued) change no bit of the result, at either precision, across group boundaries.
#[test]
fn prefetching_changes_no_result() {
    if !supported(64) {
        eprintln!("no AMX-BF16 here: tile path not tested");
        return;
    }
    let (hd, rows, chunks) = (64, 48, 19);
    let q: Vec<f32> = values(rows * hd, 5).iter().map(|x| x.to_f32() * 0.2).collect();
    let pos0 = chunks * CHUNK - rows;
    for precision in [Precision::Exact, Precision::Bf16] {
        let mut a = Flash::with_precision(&q, rows, hd, pos0, 1, precision);
        let mut b = Flash::with_precision(&q, rows, hd, pos0, 1, precision);
        let far = vec![7u8; 1 << 20];
        for c in 0..chunks {
            let (k, v) = (bytes(&values(CHUNK * hd, 30 + c)), bytes(&values(CHUNK * hd, 40 + c)));
            let gone = bytes(&values(CHUNK * hd, 50 + c));
            a.prefetch(&gone);
            drop(gone);
            a.prefetch(&far[c * 4096..(c + 8) * 4096]);
            a.prefetch(&[]);
            a.add_rows(Rows::F16(&k), Rows::F16(&v), CHUNK, c * CHUNK, None);
            b.add_rows(Rows::F16(&k), Rows::F16(&v), CHUNK, c * CHUNK, None);
        }
        let (mut oa, mut ob) = (vec![0f32; rows * hd], vec![0f32; rows * hd]);
        a.finish(&mut oa);
        b.finish(&mut ob);
        assert!(oa.iter().zip(&ob).all(|(x, y)| x.to_bits() == y.to_bits()), "{precision:?}: prefetching changed the result");
    }
}

fn rows_of(dtype: DType, b: &[u8]) -> Rows<'_> {
    if dtype == DType::Q8_0 {
        Rows::Q8_0(b)
    } else {
        Rows::Q4_0(b)
    }
}

#[test]
fn q8_0_and_q4_0_chunks_equal_their_f32_values_bitwise() {
    if !supported(32) {
        eprintln!("no AMX-BF16 here: tile path not tested");
        return;
    }
    for dtype in [DType::Q8_0, DType::Q4_0] {
        let cases = [(32, 5, 3, 7), (64, 256, 3, 19), (64, 4, 2, 1), (128, 17, 2, 32)];
        for ((hd, rows, chunks, last), precision) in cases.into_iter().flat_map(|c| [(c, Precision::Exact), (c, Precision::Bf16)]) {
            let q: Vec<f32> = values(rows * hd, 5).iter().map(|x| x.to_f32() * 0.2).collect();
            let pos0 = (chunks - 1) * CHUNK + last - rows.min(last);
            let mut a = Flash::with_precision(&q, rows, hd, pos0, 1, precision);
            let mut b = Flash::with_precision(&q, rows, hd, pos0, 1, precision);
            for c in 0..chunks {
                let n = if c + 1 == chunks { last } else { CHUNK };
                let quantized = |seed| {
                    let x: Vec<f32> = values(n * hd, seed).iter().map(|h| h.to_f32()).collect();
                    let bytes = quantize(dtype, &x, hd).unwrap();
                    let mut back = vec![0f32; n * hd];
                    dequantize_row(dtype, &bytes, &mut back);
                    (bytes, back)
                };
                let ((kb, kf), (vb, vf)) = (quantized(30 + c), quantized(40 + c));
                let mask: Vec<bool> = (0..n).map(|i| (i * 3 + c) % 4 != 0).collect();
                let mask = (c == 1).then_some(&mask[..]);
                a.add_rows(rows_of(dtype, &kb), rows_of(dtype, &vb), n, c * CHUNK, mask);
                b.add_chunk(&kf, &vf, n, c * CHUNK, mask);
            }
            let (mut oa, mut ob) = (vec![0f32; rows * hd], vec![0f32; rows * hd]);
            a.finish(&mut oa);
            b.finish(&mut ob);
            assert!(oa.iter().any(|x| *x != 0.0), "{dtype} hd {hd}: nothing attended");
            assert!(oa.iter().zip(&ob).all(|(x, y)| x.to_bits() == y.to_bits()), "{precision:?} {dtype} hd {hd} rows {rows}: differs");
        }
    }
}

/// f64 softmax attention of every row over all `keys` (causal by position), `[rows, hd]`.
fn reference(q: &[f32], k: &[f32], v: &[f32], rows: usize, hd: usize, pos0: usize) -> Vec<f32> {
    let keys = k.len() / hd;
    let mut out = vec![0f32; rows * hd];
    for r in 0..rows {
        let visible = (pos0 + r + 1).min(keys);
        let s: Vec<f64> = (0..visible).map(|j| (0..hd).map(|d| q[r * hd + d] as f64 * k[j * hd + d] as f64).sum()).collect();
        let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let p: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let l: f64 = p.iter().sum();
        for d in 0..hd {
            out[r * hd + d] = (p.iter().enumerate().map(|(j, pj)| pj * v[j * hd + d] as f64).sum::<f64>() / l) as f32;
        }
    }
    out
}

/// Scores that keep growing chunk after chunk move every row's maximum again and again — in the
/// grouped bf16 path past its lazy threshold, so the accumulators held in tiles are rescaled
/// mid-group (14 times here, checked) — and both precisions still match an f64 reference (exact
/// to 2e-5, bf16 to 1e-2; measured 5–6e-6 and 3–5e-3),
/// with any number of chunks per group (partial groups at `finish`) and rows alone or together.
#[test]
fn growing_scores_rescale_and_match_an_f64_reference() {
    if !supported(64) {
        eprintln!("no AMX-BF16 here: tile path not tested");
        return;
    }
    let (hd, rows) = (64, 40);
    for chunks in [3, 8, 13] {
        let keys = chunks * CHUNK;
        let pos0 = keys - rows;
        let q: Vec<f32> = values(rows * hd, 1).iter().map(|x| x.to_f32() * 0.03).collect();
        // Chunk c's keys scaled by 0.5 + c/2 up to 3: each chunk's scores ~2 nats above the last
        // one's, so the maxima move past the lazy threshold (8 log2 units) every few chunks.
        let k: Vec<f32> =
            values(keys * hd, 2).iter().enumerate().map(|(i, x)| x.to_f32() * (0.5 + (i / hd / CHUNK) as f32 / 2.0).min(3.0)).collect();
        let v: Vec<f32> = values(keys * hd, 3).iter().map(|x| x.to_f32()).collect();
        let want = reference(&q, &k, &v, rows, hd, pos0);
        let amax = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        for (precision, tolerance) in [(Precision::Exact, 2e-5), (Precision::Bf16, 1e-2)] {
            let run = |rows: usize, q: &[f32], pos0: usize| {
                let mut f = Flash::with_precision(q, rows, hd, pos0, 1, precision);
                for c in 0..chunks {
                    f.add_chunk(&k[c * CHUNK * hd..(c + 1) * CHUNK * hd], &v[c * CHUNK * hd..(c + 1) * CHUNK * hd], CHUNK, c * CHUNK, None);
                }
                let mut out = vec![0f32; rows * hd];
                f.finish(&mut out);
                out
            };
            let got = run(rows, &q, pos0);
            let err = got.iter().zip(&want).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / amax;
            assert!(err < tolerance, "{precision:?} {chunks} chunks: {err:e}");
            let last = run(1, &q[(rows - 1) * hd..], pos0 + rows - 1);
            assert_eq!(last, got[(rows - 1) * hd..].to_vec(), "{precision:?} {chunks} chunks: a row alone differs");
        }
    }
}
