//! Throughput of the AMX-BF16 attention block kernel (`engram_kernels::flash`), single thread:
//! `cargo run --release -p engram-kernels --example flash_speed [ROWS] [KEYS]`.
//! Both precisions interleaved (`FLASH_PRECISION=exact|bf16` for one). Prints ns per (16-row
//! block × 32-key chunk) and effective GFLOP/s (QKᵀ + PV, 4·hd flops per row-key pair), so
//! changes to the kernel can be compared side by side.

use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let rows = *args.first().unwrap_or(&256);
    let keys = *args.get(1).unwrap_or(&16384);
    let hd = 64;
    if !engram_kernels::flash::supported(hd) {
        eprintln!("no AMX-BF16 on this machine");
        return;
    }
    let rnd = |i: usize| (i.wrapping_mul(2654435761) % 1000) as f32 / 500.0 - 1.0;
    let q: Vec<f32> = (0..rows * hd).map(|i| rnd(i) * 0.3).collect();
    let k: Vec<f32> = (0..32 * hd).map(|i| rnd(i + 7)).collect();
    let v: Vec<f32> = (0..32 * hd).map(|i| rnd(i + 13)).collect();
    use engram_kernels::flash::Precision;
    for precision in std::env::var("FLASH_PRECISION")
        .map(|p| vec![p.parse::<Precision>().expect("precision"); 3])
        .unwrap_or_else(|_| [Precision::Exact, Precision::Bf16].repeat(3))
    {
        let t = Instant::now();
        let mut f = engram_kernels::flash::Flash::with_precision(&q, rows, hd, keys, 1, precision);
        for c in 0..keys / 32 {
            f.add_chunk(&k, &v, 32, c * 32, None);
        }
        let mut out = vec![0.0; rows * hd];
        f.finish(&mut out);
        let s = t.elapsed().as_secs_f64();
        let bc = (rows.div_ceil(16) * (keys / 32)) as f64;
        let flops = 4.0 * hd as f64 * rows as f64 * keys as f64;
        println!(
            "{:5} rows {rows} keys {keys}: {:.1} ms, {:.0} ns per block-chunk, {:.1} GFLOP/s (out[0] {:.4})",
            precision.name(),
            s * 1e3,
            s * 1e9 / bc,
            flops / s / 1e9,
            out[0]
        );
    }
}
