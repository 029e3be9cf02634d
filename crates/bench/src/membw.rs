//! `engram bench membw`: the machine's memory read bandwidth with 1..N kernel threads, the
//! bound on decode speed (a decode step reads every weight once), and how close the real
//! one-token kernels come to it.
//!
//! Side by side in one run, per thread count:
//! * `read_gb_s`: [`engram_kernels::stream_read`], contiguous 32-byte loads over a buffer far
//!   larger than the last-level cache, chunked like a matmul's rows on the same pool (the
//!   ceiling);
//! * `gemv_<fmt>_gb_s`: the real 1-token [`engram_kernels::matmul`] over a weight matrix of that
//!   size (2048 columns, the `llama-1b` width) in Q4_0, Q8_0, Q4_K, Q6_K and F16, with the
//!   packing a loaded model would attach on this CPU ([`Packed::for_this_cpu`]): weight bytes ÷
//!   time, i.e. how close decode's kernels get to the ceiling;
//! * `gemv_<fmt>_cached_gb_s`: the same kernel over the matrix's first [`CACHED_KIB`] KiB,
//!   which stay in the caches between calls: the rate the kernel computes at when memory is not
//!   the bound. Below `read_gb_s`, decode of that format is bound by instruction throughput,
//!   not by memory, on this machine.
//!
//! Each figure is the best of `--reps` (the cached ones of 20× as many, shorter, calls).
//! Reproduce: `engram bench membw --threads 2`.

use std::time::Instant;

use anyhow::{ensure, Result};
use engram_kernels::{matmul, DType, Packed, WeightMatrix};

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

/// The formats measured: the common files' (Q4_K_M is Q4_K and Q6_K).
const FORMATS: [DType; 5] = [DType::Q4_0, DType::Q8_0, DType::Q4K, DType::Q6K, DType::F16];

/// Weight bytes of the cache-resident GEMV: within a 2 MiB slice of L3 per core on the CPUs
/// measured, several times any L2.
pub const CACHED_KIB: usize = 2048;

/// One format's GEMV rates (GB/s) per thread count: from memory, and cache-resident.
struct Gemv {
    dtype: DType,
    dram: Vec<f64>,
    cached: Vec<f64>,
}

pub fn run(a: Args) -> Result<()> {
    ensure!(a.mib >= 16, "--mib must be at least 16 (the buffer must exceed the caches)");
    let max_t = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)).max(1);
    let before = engram_kernels::num_threads();
    let mut buf = random_bytes(a.mib << 20);
    let mut read = Vec::new();
    for t in 1..=max_t {
        engram_kernels::set_num_threads(t);
        read.push(read_gb_s(&buf, a.reps));
    }
    let mut gemv = Vec::new();
    for dtype in FORMATS {
        let mut g = Gemv { dtype, dram: Vec::new(), cached: Vec::new() };
        let rb = dtype.row_bytes(GEMV_COLS).expect("2048 columns fit every block size");
        let data = patch_finite(&mut buf, dtype);
        // Whole 8-row groups: a loader packs only matrices made of them.
        let all_rows = data.len() / rb / 8 * 8;
        let cached_rows = ((CACHED_KIB << 10) / rb / 8 * 8).clamp(8, all_rows);
        for (rows, reps, out) in [(all_rows, a.reps, &mut g.dram), (cached_rows, 20 * a.reps, &mut g.cached)] {
            let w = WeightMatrix::new(dtype, rows, GEMV_COLS, &data[..rows * rb])?;
            let packed = Packed::for_this_cpu(&w);
            let w = match &packed {
                Some(p) => w.with_packed(p),
                None => w,
            };
            for t in 1..=max_t {
                engram_kernels::set_num_threads(t);
                out.push(gemv_gb_s(&w, reps)?);
            }
        }
        gemv.push(g);
    }
    engram_kernels::set_num_threads(before);
    if !a.json {
        let names: Vec<String> = FORMATS.iter().map(|d| format!("{} GEMV: memory (of read) · cached (GB/s)", d.name())).collect();
        println!("| threads | read (GB/s) | {} |", names.join(" | "));
        println!("|---|---|{}", "---|".repeat(FORMATS.len()));
    }
    for (i, read) in read.iter().enumerate() {
        let t = i + 1;
        if a.json {
            let mut row =
                serde_json::json!({"threads": t, "read_gb_s": round2(*read), "mib": a.mib, "reps": a.reps, "cached_kib": CACHED_KIB});
            for g in &gemv {
                let name = g.dtype.name().to_lowercase();
                row[format!("gemv_{name}_gb_s")] = serde_json::json!(round2(g.dram[i]));
                row[format!("gemv_{name}_cached_gb_s")] = serde_json::json!(round2(g.cached[i]));
            }
            println!("{row}");
        } else {
            let cells: Vec<String> =
                gemv.iter().map(|g| format!("{:.1} ({:.0}%) · {:.1}", g.dram[i], 100.0 * g.dram[i] / read, g.cached[i])).collect();
            println!("| {t} | {read:.1} | {} |", cells.join(" | "));
        }
    }
    Ok(())
}

/// `buf`'s whole rows of `dtype` weights, patched in place so every scale and value is finite:
/// the block scales of Q4_0 / Q8_0 / Q4_K / Q6_K set to f16 2^-7 (the other bytes stay random
/// quants, all valid), F16 values with the top exponent bit cleared (|v| < 2).
fn patch_finite(buf: &mut [u8], dtype: DType) -> &[u8] {
    const SCALE: [u8; 2] = [0x00, 0x20];
    let rb = dtype.row_bytes(GEMV_COLS).expect("2048 columns fit every block size");
    let whole = buf.len() / rb * rb;
    let data = &mut buf[..whole];
    let blocks = data.chunks_exact_mut(dtype.block_bytes());
    match dtype {
        DType::Q4_0 | DType::Q8_0 => blocks.for_each(|b| b[..2].copy_from_slice(&SCALE)),
        // d and dmin lead the block.
        DType::Q4K => blocks.for_each(|b| {
            b[..2].copy_from_slice(&SCALE);
            b[2..4].copy_from_slice(&SCALE);
        }),
        // d ends the block.
        DType::Q6K => blocks.for_each(|b| {
            let n = b.len();
            b[n - 2..].copy_from_slice(&SCALE);
        }),
        _ => data.chunks_exact_mut(2).for_each(|h| h[1] &= 0xBB),
    }
    data
}

/// Best-of-`reps` weight bytes per second of a 1-token matmul over `w` (one untimed call first).
fn gemv_gb_s(w: &WeightMatrix, reps: usize) -> Result<f64> {
    let bytes = w.rows * w.row_bytes();
    let x: Vec<f32> = (0..w.cols).map(|i| ((i * 7919) % 201) as f32 / 100.0 - 1.0).collect();
    let mut out = vec![0f32; w.rows];
    matmul(w, &x, 1, &mut out);
    let mut best = 0f64;
    for _ in 0..reps.max(1) {
        let t = Instant::now();
        matmul(w, &x, 1, &mut out);
        best = best.max(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    ensure!(out.iter().all(|v| v.is_finite()), "GEMV over the {} probe produced a non-finite value", w.dtype.name());
    Ok(best)
}

fn round2(v: f64) -> f64 {
    (v * 100.0).round() / 100.0
}
