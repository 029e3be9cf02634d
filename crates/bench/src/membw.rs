//! `engram bench membw`: the machine's memory read bandwidth with 1..N kernel threads, the
//! bound on decode speed (a decode step reads every weight once).
//!
//! Two measurements per thread count, side by side in one run, over a buffer far larger than
//! the last-level cache:
//! * `read_gb_s`: [`engram_kernels::stream_read`], contiguous 32-byte loads over chunks
//!   scheduled like a matmul's row chunks on the same pool (the ceiling);
//! * `gemv_*_gb_s`: the real 1-token [`engram_kernels::matmul`] over a weight matrix of that
//!   size (2048 columns, the `llama-1b` width) in Q4_0, Q8_0 and F16: weight bytes ÷ time,
//!   i.e. how close the kernels get to the ceiling.
//!
//! Each figure is the best of `--reps`. Reproduce: `engram bench membw --threads 2`.

use std::time::Instant;

use anyhow::{ensure, Result};
use engram_kernels::{matmul, DType, WeightMatrix};

use crate::shared::{random_bytes, read_gb_s};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Buffer size in MiB (well above the last-level cache).
    #[arg(long, default_value_t = 512)]
    mib: usize,
    /// Largest thread count measured (1..=N); default: all logical CPUs.
    #[arg(long)]
    threads: Option<usize>,
    /// Timed repetitions per figure; the best is reported.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// Columns of the weight matrices the GEMV rows use.
const GEMV_COLS: usize = 2048;

pub fn run(a: Args) -> Result<()> {
    ensure!(a.mib >= 16, "--mib must be at least 16 (the buffer must exceed the caches)");
    let max_t = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).max(1);
    let before = engram_kernels::num_threads();
    let mut buf = random_bytes(a.mib << 20);
    let mut rows = Vec::new();
    for t in 1..=max_t {
        engram_kernels::set_num_threads(t);
        let read = read_gb_s(&buf, a.reps);
        let mut gemv = Vec::new();
        for dtype in [DType::Q4_0, DType::Q8_0, DType::F16] {
            gemv.push((dtype, gemv_gb_s(&mut buf, dtype, a.reps)?));
        }
        rows.push((t, read, gemv));
    }
    engram_kernels::set_num_threads(before);
    if !a.json {
        println!("| threads | read (GB/s) | Q4_0 GEMV (GB/s) | Q8_0 GEMV (GB/s) | F16 GEMV (GB/s) |");
        println!("|---|---|---|---|---|");
    }
    for (t, read, gemv) in rows {
        if a.json {
            let mut row = serde_json::json!({"threads": t, "read_gb_s": round2(read), "mib": a.mib, "reps": a.reps});
            for (d, g) in &gemv {
                row[format!("gemv_{}_gb_s", d.name().to_lowercase())] = serde_json::json!(round2(*g));
            }
            println!("{row}");
        } else {
            let g: Vec<String> = gemv.iter().map(|(_, g)| format!("{g:.1} ({:.0}%)", 100.0 * g / read)).collect();
            println!("| {t} | {read:.1} | {} |", g.join(" | "));
        }
    }
    Ok(())
}

/// Best-of-`reps` weight bytes per second of a 1-token matmul over `buf` viewed as `dtype`
/// weights (`buf` is patched in place so every scale / value is finite).
fn gemv_gb_s(buf: &mut [u8], dtype: DType, reps: usize) -> Result<f64> {
    let rb = dtype.row_bytes(GEMV_COLS).expect("2048 columns fit every block size");
    let rows = buf.len() / rb;
    let data = &mut buf[..rows * rb];
    match dtype {
        // Block scale (first two bytes of every block) = f16 2^-7.
        DType::Q4_0 | DType::Q8_0 => data.chunks_exact_mut(dtype.block_bytes()).for_each(|b| b[..2].copy_from_slice(&[0x00, 0x20])),
        // Clear the top exponent bit: every value finite, |v| < 2.
        _ => data.chunks_exact_mut(2).for_each(|h| h[1] &= 0xBB),
    }
    let w = WeightMatrix::new(dtype, rows, GEMV_COLS, data)?;
    let x: Vec<f32> = (0..GEMV_COLS).map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0).collect();
    let mut out = vec![0f32; rows];
    matmul(&w, &x, 1, &mut out);
    let mut best = 0f64;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        matmul(&w, &x, 1, &mut out);
        best = best.max((rows * rb) as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    ensure!(out.iter().all(|v| v.is_finite()), "GEMV over the {} probe produced a non-finite value", dtype.name());
    Ok(best)
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}
