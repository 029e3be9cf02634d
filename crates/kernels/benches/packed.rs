//! The packed AVX2 kernels alone (`Packed`, 8-row groups): cost per row-token for 1..64
//! tokens on an L2-resident matrix (one thread, ~256 KiB of weights), and a DRAM-streaming
//! GEMV (8192 × 2048, 1 token, the pool's threads) for the decode rate.
//!
//! Run: `cargo bench --release -p engram-kernels --bench packed` (or the built binary
//! `target/release/deps/packed-* --bench`). Filters: `ENGRAM_DTYPES=q8_0,q4_0`,
//! `ENGRAM_TOKENS=1,4,64`, `ENGRAM_KIB=16` (the resident matrix's size; default 256). Each figure is the best of repeated calls over ~0.3 s; the
//! `×1` column is the cost of one call over the 1-token call's (4 tokens at 4.0× = no reuse).
//! To compare two kernels, build this bench from each tree and run the binaries alternately.

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

/// Best seconds of one `matmul` call over `n` tokens.
fn best(w: &WeightMatrix, n: usize) -> f64 {
    let x = act(n * w.cols);
    let mut out = vec![0f32; n * w.rows];
    matmul_with(Isa::Avx2, w, &x, n, &mut out);
    let (start, mut best, mut iters) = (Instant::now(), f64::MAX, 0);
    while iters < 5 || (start.elapsed().as_secs_f64() < 0.3 && iters < 20_000) {
        let t = Instant::now();
        matmul_with(Isa::Avx2, w, &x, n, &mut out);
        best = best.min(t.elapsed().as_secs_f64());
        iters += 1;
    }
    best
}

fn main() {
    if !Isa::Avx2.is_available() {
        println!("no AVX2 on this CPU: the packed kernels do not run here");
        return;
    }
    let dtypes: Vec<DType> = match std::env::var("ENGRAM_DTYPES") {
        Ok(v) => [DType::Q4_0, DType::Q8_0, DType::Q4K, DType::Q6K].into_iter().filter(|d| v.split(',').any(|n| n == d.name())).collect(),
        Err(_) => vec![DType::Q4_0, DType::Q8_0, DType::Q4K, DType::Q6K],
    };
    let tokens: Vec<usize> = match std::env::var("ENGRAM_TOKENS") {
        Ok(v) => v.split(',').map(|t| t.trim().parse().expect("ENGRAM_TOKENS: numbers")).collect(),
        Err(_) => vec![1, 2, 3, 4, 8, 16, 64],
    };
    let kib: usize = std::env::var("ENGRAM_KIB").map(|v| v.parse().expect("ENGRAM_KIB: a number")).unwrap_or(256);
    let threads = num_threads();
    println!("L2-resident, 1 thread: ns per row-token (x1 = one call's time / the 1-token call's)");
    println!("| format | rows x cols | KiB | tokens | ns/row-token | x1 |");
    println!("|---|---|---|---|---|---|");
    let cols = 2048;
    set_num_threads(1);
    for &d in &dtypes {
        let rb = d.row_bytes(cols).unwrap();
        let rows = ((kib * 1024 / rb) / 8 * 8).max(8);
        let bytes = make(d, rows, cols);
        let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        let p = Packed::new(&wm).unwrap();
        let w = wm.with_packed(&p);
        let one = best(&w, 1);
        for &n in &tokens {
            let s = if n == 1 { one } else { best(&w, n) };
            println!(
                "| {} | {rows}x{cols} | {} | {n} | {:.2} | {:.2} |",
                d.name(),
                bytes.len() / 1024,
                s * 1e9 / (rows * n) as f64,
                s / one
            );
        }
    }
    set_num_threads(threads);
    println!();
    println!("DRAM-streaming GEMV, {threads} threads, 1 token");
    println!("| format | rows x cols | MiB | us | GB/s |");
    println!("|---|---|---|---|---|");
    for &d in &dtypes {
        let (rows, cols) = (8192, 2048);
        let bytes = make(d, rows, cols);
        let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        let p = Packed::new(&wm).unwrap();
        let w = wm.with_packed(&p);
        // Two matrices alternated so the second call does not find the first's bytes in L3.
        let bytes2 = make(d, rows, cols);
        let wm2 = WeightMatrix::new(d, rows, cols, &bytes2).unwrap();
        let p2 = Packed::new(&wm2).unwrap();
        let w2 = wm2.with_packed(&p2);
        let x = act(cols);
        let mut out = vec![0f32; rows];
        let mut bestt = f64::MAX;
        for i in 0..40 {
            let t = Instant::now();
            matmul_with(Isa::Avx2, if i % 2 == 0 { &w } else { &w2 }, &x, 1, &mut out);
            bestt = bestt.min(t.elapsed().as_secs_f64());
        }
        println!(
            "| {} | {rows}x{cols} | {:.1} | {:.0} | {:.1} |",
            d.name(),
            bytes.len() as f64 / (1 << 20) as f64,
            bestt * 1e6,
            bytes.len() as f64 / bestt / 1e9
        );
    }
}
