//! Decode GEMV on the `llama-1b` shape (22 layers: q 2048², k/v 256×2048, o 2048², gate/up
//! 5632×2048, down 2048×5632) with the weights as stored vs repacked (`Packed`), alternating,
//! best of `REPS`: one pass over every layer's matrices = one decode token's matmuls.
//! Also 4 tokens per call (a batched decode step of 4 sessions).
//!
//! `cargo run --release -p engram-kernels --example repack_speed` (`ENGRAM_THREADS=2`,
//! `REPS=5`). Prints a Markdown table; run on the AVX2 path (packings are read only there).

use engram_kernels::internal::{matmul_multi_with, Isa};
use engram_kernels::*;
use std::time::Instant;

const LAYERS: usize = 22;

fn main() {
    let threads: usize = std::env::var("ENGRAM_THREADS").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    let reps: usize = std::env::var("REPS").ok().and_then(|v| v.parse().ok()).unwrap_or(5);
    set_num_threads(threads);
    if !Isa::Avx2.is_available() {
        eprintln!("needs AVX2");
        return;
    }
    let shapes = [(2048usize, 2048usize), (256, 2048), (256, 2048), (2048, 2048), (5632, 2048), (5632, 2048), (2048, 5632)];
    println!("| format | tokens/call | stored (calls/s) | repacked (calls/s) | speed-up | weight GB/s stored → repacked |");
    println!("|---|---|---|---|---|---|");
    for d in [DType::Q4_0, DType::Q8_0] {
        // One layer's matrices, reused for every layer (22× the bytes would not fit the page cache
        // of a small machine; a layer's 20–40 MB is already far past L3, so each pass streams
        // from memory).
        let mats: Vec<(usize, usize, Vec<u8>)> = shapes
            .iter()
            .enumerate()
            .map(|(i, &(r, c))| {
                let x: Vec<f32> = (0..r * c).map(|j| (((j * 2654435761 + i) % 1000) as f32 - 500.0) / 500.0).collect();
                (r, c, quantize(d, &x, c).unwrap())
            })
            .collect();
        let plain: Vec<WeightMatrix> = mats.iter().map(|(r, c, b)| WeightMatrix::new(d, *r, *c, b).unwrap()).collect();
        let packs: Vec<Packed> = plain.iter().map(|w| Packed::new(w).unwrap()).collect();
        let packed: Vec<WeightMatrix> = plain.iter().zip(&packs).map(|(w, p)| w.with_packed(p)).collect();
        let bytes: usize = mats.iter().map(|m| m.2.len()).sum::<usize>() * LAYERS;
        for n in [1usize, 4] {
            let x: Vec<f32> = (0..n * 5632).map(|j| ((j % 97) as f32 - 48.0) / 48.0).collect();
            let mut best = [0f64; 2];
            for _ in 0..reps {
                for (k, ws) in [&plain, &packed].into_iter().enumerate() {
                    let t = Instant::now();
                    for _ in 0..LAYERS {
                        let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![0f32; n * w.rows]).collect();
                        for (w, o) in ws.iter().zip(outs.iter_mut()) {
                            matmul_multi_with(Isa::Avx2, &[w], &x[..n * w.cols], n, &mut [o.as_mut_slice()]);
                        }
                    }
                    best[k] = best[k].max(1.0 / t.elapsed().as_secs_f64());
                }
            }
            println!(
                "| {d} | {n} | {:.2} | {:.2} | {:.2}× | {:.1} → {:.1} |",
                best[0],
                best[1],
                best[1] / best[0],
                best[0] * bytes as f64 / 1e9,
                best[1] * bytes as f64 / 1e9
            );
        }
    }
}
