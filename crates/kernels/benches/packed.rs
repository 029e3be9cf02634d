//! The packed kernels alone (`Packed`, 8-row groups) on every path that runs them (`avx2`:
//! `avx2_packed*`; `avx512`: the VNNI `avx512_packed*`), the paths alternating per figure:
//! cost per row-token for 1..64 tokens on an L2-resident matrix (one thread, ~256 KiB of
//! weights), and a DRAM-streaming GEMV (8192 × 2048, 1 token, the pool's threads) for the
//! decode rate.
//!
//! Run: `cargo bench --release -p engram-kernels --bench packed` (or the built binary
//! `target/release/deps/packed-* --bench`). Filters: `ENGRAM_DTYPES=q8_0,q4_0` (any packable
//! format; default Q4_0, Q8_0, Q4_K, Q6_K),
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

/// Best seconds of one `matmul` call over `n` tokens on each of `paths`, the paths taking
/// turns (so load from other processes hits them alike).
fn best(paths: &[Isa], w: &WeightMatrix, n: usize) -> Vec<f64> {
    let x = act(n * w.cols);
    let mut out = vec![0f32; n * w.rows];
    let mut best = vec![f64::MAX; paths.len()];
    for &isa in paths {
        matmul_with(isa, w, &x, n, &mut out);
    }
    let (start, mut iters) = (Instant::now(), 0);
    while iters < 5 || (start.elapsed().as_secs_f64() < 0.3 * paths.len() as f64 && iters < 20_000) {
        for (b, &isa) in best.iter_mut().zip(paths) {
            let t = Instant::now();
            matmul_with(isa, w, &x, n, &mut out);
            *b = b.min(t.elapsed().as_secs_f64());
        }
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
        Ok(v) => DType::ALL.into_iter().filter(|d| Packed::supports(*d, 8) && v.split(',').any(|n| n == d.name())).collect(),
        Err(_) => vec![DType::Q4_0, DType::Q8_0, DType::Q4K, DType::Q6K],
    };
    let tokens: Vec<usize> = match std::env::var("ENGRAM_TOKENS") {
        Ok(v) => v.split(',').map(|t| t.trim().parse().expect("ENGRAM_TOKENS: numbers")).collect(),
        Err(_) => vec![1, 2, 3, 4, 8, 16, 64],
    };
    let paths: Vec<Isa> = [Isa::Avx2, Isa::Avx512].into_iter().filter(|i| i.is_available()).collect();
    let names: Vec<&str> = paths.iter().map(|i| i.name()).collect();
    let kib: usize = std::env::var("ENGRAM_KIB").map(|v| v.parse().expect("ENGRAM_KIB: a number")).unwrap_or(256);
    let threads = num_threads();
    println!("L2-resident, 1 thread: ns per row-token (x1 = one call's time / the 1-token call's), paths {}", names.join(" / "));
    println!("| format | rows x cols | KiB | tokens | ns/row-token ({}) | x1 ({}) |", names.join(" / "), names.join(" / "));
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
        let one = best(&paths, &w, 1);
        for &n in &tokens {
            let s = if n == 1 { one.clone() } else { best(&paths, &w, n) };
            let ns: Vec<String> = s.iter().map(|s| format!("{:.2}", s * 1e9 / (rows * n) as f64)).collect();
            let x1: Vec<String> = s.iter().zip(&one).map(|(s, o)| format!("{:.2}", s / o)).collect();
            println!("| {} | {rows}x{cols} | {} | {n} | {} | {} |", d.name(), bytes.len() / 1024, ns.join(" / "), x1.join(" / "));
        }
    }
    set_num_threads(threads);
    println!();
    println!("DRAM-streaming GEMV, {threads} threads, 1 token, paths {}", names.join(" / "));
    println!("| format | rows x cols | MiB | us ({}) | GB/s ({}) |", names.join(" / "), names.join(" / "));
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
        let mut bestt = vec![f64::MAX; paths.len()];
        for i in 0..40 {
            for (k, (b, &isa)) in bestt.iter_mut().zip(&paths).enumerate() {
                let t = Instant::now();
                matmul_with(isa, if (i * paths.len() + k).is_multiple_of(2) { &w } else { &w2 }, &x, 1, &mut out);
                *b = b.min(t.elapsed().as_secs_f64());
            }
        }
        let us: Vec<String> = bestt.iter().map(|b| format!("{:.0}", b * 1e6)).collect();
        let gbs: Vec<String> = bestt.iter().map(|b| format!("{:.1}", bytes.len() as f64 / b / 1e9)).collect();
        println!(
            "| {} | {rows}x{cols} | {:.1} | {} | {} |",
            d.name(),
            bytes.len() as f64 / (1 << 20) as f64,
            us.join(" / "),
            gbs.join(" / ")
        );
    }
}
