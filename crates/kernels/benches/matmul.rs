//! matmul throughput per format: GEMV (1 token × 2048×2048 and 8192×2048) and GEMM
//! (512 tokens × 2048×2048). Default run is short. Set `ENGRAM_TABLE=1` to instead print a
//! GFLOP/s + GB/s table and a Llama-1B-shape tok/s estimate (hidden 2048, FFN 8192, 16 layers,
//! vocab 32000), with the pool at its default size (or `ENGRAM_THREADS`). Table filters:
//! `ENGRAM_DTYPES=q8_0,q4_0` (formats), `ENGRAM_SMALL_BATCH=1` (4-token rows instead of 512), `ENGRAM_ISA=avx512,amx` (kernel paths; default: the
//! detected best), `ENGRAM_DECODE_ONLY=1` (skip the 512-token rows), so paths can be compared
//! side by side in one run.

use criterion::{criterion_group, BenchmarkId, Criterion, Throughput};
use engram_kernels::internal::{matmul_with, Isa};
use engram_kernels::*;
use std::time::{Duration, Instant};

fn make(d: DType, rows: usize, cols: usize) -> Vec<u8> {
    let src: Vec<f32> = (0..rows * cols).map(|i| ((i * 2654435761usize) % 1000) as f32 / 1000.0 - 0.5).collect();
    quantize(d, &src, cols).unwrap()
}

fn act(n: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 40503usize) % 997) as f32 / 997.0 - 0.5).collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul");
    g.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(1));
    for d in DType::ALL {
        for &(rows, cols, n) in &[(2048usize, 2048usize, 1usize), (8192, 2048, 1), (2048, 2048, 512)] {
            let bytes = make(d, rows, cols);
            let w = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
            let x = act(n * cols);
            let mut out = vec![0f32; n * rows];
            if n == 1 {
                g.throughput(Throughput::Bytes(bytes.len() as u64));
            } else {
                g.throughput(Throughput::Elements((2 * rows * cols * n) as u64));
                // FLOPs
            }
            let id = BenchmarkId::new(d.name(), format!("{n}x{cols}->{rows}"));
            g.bench_function(id, |b| b.iter(|| matmul(&w, &x, n, &mut out)));
        }
    }
    g.finish();
}

fn time(isa: Isa, w: &WeightMatrix, n: usize) -> f64 {
    let x = act(n * w.cols);
    let mut out = vec![0f32; n * w.rows];
    let matmul = |w: &WeightMatrix, x: &[f32], n: usize, out: &mut [f32]| matmul_with(isa, w, x, n, out);
    matmul(w, &x, n, &mut out);
    let mut best = f64::MAX;
    let start = Instant::now();
    let mut iters = 0;
    while iters < 3 || (start.elapsed().as_secs_f64() < 0.6 && iters < 200) {
        let t = Instant::now();
        matmul(w, &x, n, &mut out);
        best = best.min(t.elapsed().as_secs_f64());
        iters += 1;
    }
    best
}

fn table() {
    if let Ok(t) = std::env::var("ENGRAM_THREADS") {
        set_num_threads(t.parse().unwrap());
    }
    println!("threads = {}", num_threads());
    println!("{:6} {:>5} {:>14} {:>9} {:>9} {:>10}", "dtype", "n", "shape", "GFLOP/s", "GB/s", "ms");
    // Llama-1B layer: q,o 2048x2048; k,v 512x2048; gate,up 8192x2048; down 2048x8192; + lm head.
    let layer = [(2048usize, 2048usize, 2usize), (512, 2048, 2), (8192, 2048, 2), (2048, 8192, 1)];
    let dtypes: Vec<DType> = match std::env::var("ENGRAM_DTYPES") {
        Ok(v) => DType::ALL.into_iter().filter(|d| v.split(',').any(|n| n == d.name())).collect(),
        Err(_) => DType::ALL.to_vec(),
    };
    let isas: Vec<Isa> = match std::env::var("ENGRAM_ISA") {
        Ok(v) => Isa::available().into_iter().filter(|i| v.split(',').any(|n| n.eq_ignore_ascii_case(&format!("{i:?}")))).collect(),
        Err(_) => vec![Isa::detect()],
    };
    let decode_only = std::env::var("ENGRAM_DECODE_ONLY").is_ok();
    for (isa, d) in isas.iter().flat_map(|&i| dtypes.iter().map(move |&d| (i, d))) {
        if d == dtypes[0] {
            println!("path = {isa:?}");
        }
        let mut est = [0f64; 2];
        // `ENGRAM_SMALL_BATCH=1`: a 4-token step (4 sessions decoding together) instead of 512.
        let ns = if std::env::var("ENGRAM_SMALL_BATCH").is_ok() { [1usize, 4] } else { [1usize, 512] };
        for (k, &n) in ns.iter().enumerate() {
            if decode_only && n > 1 {
                continue;
            }
            let mut total = 0.0;
            for &(rows, cols, count) in layer.iter().chain(std::iter::once(&(32000usize, 2048usize, 0usize))) {
                let bytes = make(d, rows, cols);
                let w = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
                let s = time(isa, &w, n);
                if count == 0 {
                    total += s; // lm head once per forward
                } else {
                    total += s * count as f64 * 16.0;
                }
                if rows == 2048 && cols == 2048 || rows == 8192 {
                    let gf = 2.0 * (rows * cols * n) as f64 / s / 1e9;
                    let gb = bytes.len() as f64 / s / 1e9;
                    println!("{:6} {:>5} {:>14} {:>9.1} {:>9.1} {:>10.3}", d.name(), n, format!("{rows}x{cols}"), gf, gb, s * 1e3);
                }
            }
            est[k] = n as f64 / total;
        }
        println!("{:6} 1B estimate: decode {:.1} tok/s, {}-token steps {:.1} tok/s", d.name(), est[0], ns[1], est[1]);
    }
}

criterion_group!(benches, bench);

fn main() {
    if std::env::var("ENGRAM_TABLE").is_ok() {
        table();
        return;
    }
    benches();
    criterion::Criterion::default().configure_from_args().final_summary();
}
