//! Every quantized format on every kernel path this CPU runs, side by side: ns per row-token
//! of one call on an L2-resident matrix (one thread, 2048 columns, ~256 KiB of weights), for 1
//! and 16 tokens, and the packed AVX2 path where the format has one.
//!
//! Run: `cargo bench --release -p engram-kernels --bench formats`. Filters:
//! `ENGRAM_DTYPES=q4_1,q5_k` (formats), `ENGRAM_TOKENS=1,16`. Each figure is the best of
//! repeated calls over ~0.2 s.

use engram_kernels::internal::{matmul_with, Isa};
use engram_kernels::*;
use std::time::Instant;

fn make(d: DType, rows: usize, cols: usize) -> Vec<u8> {
    let src: Vec<f32> = (0..rows * cols).map(|i| ((i * 2654435761usize) % 1000) as f32 / 1000.0 - 0.5).collect();
    quantize(d, &src, cols).unwrap()
}

fn act(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 40503usize) % 997) as f32 / 997.0 - 0.5).collect()
}

/// Best seconds of one call over `n` tokens on `isa`.
fn best(isa: Isa, w: &WeightMatrix, n: usize) -> f64 {
    let x = act(n * w.cols);
    let mut out = vec![0f32; n * w.rows];
    matmul_with(isa, w, &x, n, &mut out);
    let (start, mut best, mut iters) = (Instant::now(), f64::MAX, 0);
    while iters < 3 || (start.elapsed().as_secs_f64() < 0.2 && iters < 20_000) {
        let t = Instant::now();
        matmul_with(isa, w, &x, n, &mut out);
        best = best.min(t.elapsed().as_secs_f64());
        iters += 1;
    }
    best
}

fn main() {
    let dtypes: Vec<DType> = match std::env::var("ENGRAM_DTYPES") {
        Ok(v) => DType::ALL.into_iter().filter(|d| v.split(',').any(|n| n == d.name())).collect(),
        Err(_) => DType::ALL.into_iter().filter(|d| d.block_elems() > 1).collect(),
    };
    let tokens: Vec<usize> = match std::env::var("ENGRAM_TOKENS") {
        Ok(v) => v.split(',').map(|t| t.trim().parse().expect("ENGRAM_TOKENS: numbers")).collect(),
        Err(_) => vec![1, 16],
    };
    set_num_threads(1);
    let isas: Vec<Isa> = Isa::available().into_iter().filter(|i| *i != Isa::Amx).collect();
    let cols = 2048;
    print!("| format | rows | tokens |");
    for i in &isas {
        print!(" {} |", i.name());
    }
    println!(" avx2 packed |");
    println!("|---|---|---|{}---|", "---|".repeat(isas.len()));
    for &d in &dtypes {
        let rb = d.row_bytes(cols).unwrap();
        let rows = ((256 * 1024 / rb) / 8 * 8).max(8);
        let bytes = make(d, rows, cols);
        let w = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        let packed = Packed::new(&w);
        for &n in &tokens {
            let per = |s: f64| s * 1e9 / (rows * n) as f64;
            print!("| {} | {rows} | {n} |", d.name());
            for &isa in &isas {
                print!(" {:.2} |", per(best(isa, &w, n)));
            }
            match &packed {
                Some(p) if Isa::Avx2.is_available() => println!(" {:.2} |", per(best(Isa::Avx2, &w.with_packed(p), n))),
                _ => println!(" – |"),
            }
        }
    }
    println!("(ns per row-token, 1 thread, {cols} columns, ~256 KiB of weights)");
}
