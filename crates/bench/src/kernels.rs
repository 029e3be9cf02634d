//! `engram bench kernels`: every matmul kernel variant this CPU runs, per weight format, in
//! nanoseconds per row-token (one weight row against one token's activations), at several
//! tokens per call, side by side in one run, and the variant `matmul` picks by default.
//!
//! Variants: each available kernel path ([`Isa::available`]: scalar, avx2, avx512, amx, neon)
//! on the matrix as stored, and, where the format repacks ([`Packed::supports`]), the same path
//! on the repacked copy (`+packed`: the lane-per-row layout the x86 paths read). The default is
//! what a loaded model runs (`engram_model::Weight::new` repacks with [`Packed::for_this_cpu`]
//! and `matmul` runs the format's `engram_kernels::dispatch::kernel_path`: the CPU's best path,
//! or what the measured table's row for this CPU names): that path, on the repacked copy when
//! that makes one. The table row in use (or that none matches this CPU) is printed first. Every
//! variant's output is checked against the scalar
//! path's first (the integer parts are bitwise equal by design; float accumulation order may
//! differ, so the check allows 1e-4 relative) so a fast variant that computes something else
//! cannot pass.
//!
//! The matrix is random `--rows × --cols` (default 2048 × 2048, the `llama-1b` width, 4 MiB in
//! Q8_0: it lives in L2/L3 on most machines, so these are compute figures; `bench membw` gives
//! the bandwidth ceiling). Each figure is the median (`--stat min`: the least) of `--reps` calls,
//! timed by the wall clock, or with `--clock cpu` by the calling thread's CPU time (with
//! `--threads 1`: the work is all on that thread), which time spent waiting for the core while
//! other programs run does not inflate — the figure to compare variants by on a busy machine.
//! Reproduce: `engram bench kernels --threads 2`; on a shared machine
//! `engram bench kernels --threads 1 --clock cpu --stat min`.

use std::time::Instant;

use anyhow::{ensure, Result};
use engram_kernels::dispatch::{kernel_path, table_row, CpuModel};
use engram_kernels::internal::{matmul_with, Isa};
use engram_kernels::{quantize, DType, Packed, WeightMatrix};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Rows (output features) of the matrix.
    #[arg(long, default_value_t = 2048)]
    rows: usize,
    /// Columns (input features); a multiple of 256 so every format fits.
    #[arg(long, default_value_t = 2048)]
    cols: usize,
    /// Tokens per call, comma-separated.
    #[arg(long, default_value = "1,4,16,64", value_delimiter = ',')]
    tokens: Vec<usize>,
    /// Formats, comma-separated ggml names (default: every format the kernels quantize).
    #[arg(long, value_delimiter = ',')]
    formats: Vec<String>,
    /// Kernel threads (default: the pool's).
    #[arg(long)]
    threads: Option<usize>,
    /// Timed calls per figure; the median is reported.
    #[arg(long, default_value_t = 9)]
    reps: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// What times a call: `wall` (elapsed) or `cpu` (the calling thread's CPU time; needs
    /// `--threads 1`).
    #[arg(long, default_value = "wall", value_parser = ["wall", "cpu"])]
    clock: String,
    /// Which of the `--reps` times is reported: `median` or `min`.
    #[arg(long, default_value = "median", value_parser = ["median", "min"])]
    stat: String,
}

/// One variant's figures for one format.
struct Row {
    format: DType,
    variant: String,
    default: bool,
    /// Nanoseconds per row-token, one per `--tokens` entry.
    ns: Vec<f64>,
    /// Largest relative difference from the scalar path's output.
    max_rel_diff: f32,
}

pub fn run(a: Args) -> Result<()> {
    ensure!(a.rows > 0 && a.cols > 0 && a.cols % 256 == 0, "--rows must be positive and --cols a positive multiple of 256");
    ensure!(!a.tokens.is_empty() && a.tokens.iter().all(|&n| n > 0), "--tokens must list positive counts");
    ensure!(a.reps > 0, "--reps must be positive");
    ensure!(a.clock == "wall" || a.threads == Some(1), "--clock cpu times the calling thread only: give --threads 1");
    let before = engram_kernels::num_threads();
    if let Some(t) = a.threads {
        engram_kernels::set_num_threads(t.max(1));
    }
    let formats: Vec<DType> = if a.formats.is_empty() {
        DType::ALL.into_iter().filter(|&d| quantize(d, &[0.0; 256], 256).is_ok()).collect()
    } else {
        a.formats
            .iter()
            .map(|n| {
                DType::ALL.into_iter().find(|d| d.name().eq_ignore_ascii_case(n)).ok_or_else(|| anyhow::anyhow!("unknown format {n:?}"))
            })
            .collect::<Result<_>>()?
    };
    let values = random_values(a.rows * a.cols, 0x6b65_726e);
    let max_n = *a.tokens.iter().max().expect("checked non-empty");
    let x = random_values(max_n * a.cols, 0x6163_7473);
    let mut rows = Vec::new();
    for dtype in formats {
        let data = quantize(dtype, &values, a.cols)?;
        let plain = WeightMatrix { dtype, rows: a.rows, cols: a.cols, data: &data, packed: None };
        let packed = Packed::new(&plain);
        let default_isa = kernel_path(dtype);
        let default_packed = Packed::for_this_cpu(&plain).is_some() && default_isa.runs_packed();
        let reference = {
            let mut out = vec![0.0f32; max_n * a.rows];
            matmul_with(Isa::Scalar, &plain, &x, max_n, &mut out);
            out
        };
        for isa in Isa::available() {
            for with_packed in [false, true] {
                let w = match (with_packed, &packed) {
                    (false, _) => plain,
                    (true, Some(p)) => plain.with_packed(p),
                    (true, None) => continue,
                };
                let mut out = vec![0.0f32; max_n * a.rows];
                matmul_with(isa, &w, &x, max_n, &mut out);
                let max_rel_diff = rel_diff(&out, &reference);
                let ns = a.tokens.iter().map(|&n| ns_per_row_token(isa, &w, &x, n, &a)).collect();
                let variant = if with_packed { format!("{}+packed", isa.name()) } else { isa.name().to_string() };
                let default = isa == default_isa && with_packed == default_packed;
                rows.push(Row { format: dtype, variant, default, ns, max_rel_diff });
            }
        }
    }
    // The threads the figures were measured with (the pool's own count is restored below).
    let threads = engram_kernels::num_threads();
    engram_kernels::set_num_threads(before);
    print(&a, &rows, threads);
    for r in &rows {
        ensure!(r.max_rel_diff < 1e-4, "{} {}: differs from the scalar path by {:.2e}", r.format.name(), r.variant, r.max_rel_diff);
    }
    Ok(())
}

fn print(a: &Args, rows: &[Row], threads: usize) {
    let cpu = CpuModel::this().map_or_else(|| "not x86-64".to_string(), |c| format!("{} family {} model {}", c.vendor, c.family, c.model));
    let table = table_row().map_or_else(
        || "no measured table row for this CPU: every format runs the best path".to_string(),
        |r| {
            let picks: Vec<String> = r.choices.iter().map(|(d, i)| format!("{} → {}", d.name(), i.name())).collect();
            let picks = if picks.is_empty() { "every format on the best path".to_string() } else { picks.join(", ") };
            // One "; label: a, b" part per list the row sets; nothing for an empty one.
            let part =
                |label: &str, items: Vec<String>| if items.is_empty() { String::new() } else { format!("; {label}: {}", items.join(", ")) };
            let packs = part("packed here only", r.packs.iter().map(|d| d.name().to_string()).collect());
            let lanes = part("token lanes from", r.token_lane_min.iter().map(|(d, n)| format!("{} {n}", d.name())).collect());
            let wide =
                part("one-token packed calls on the 512-bit kernels", r.wide_one_token.iter().map(|d| d.name().to_string()).collect());
            format!("table row \"{}\": {picks}{packs}{lanes}{wide} ({})", r.name, r.measured)
        },
    );
    if a.json {
        for r in rows {
            let ns: serde_json::Map<String, serde_json::Value> =
                a.tokens.iter().zip(&r.ns).map(|(n, v)| (format!("ns_per_row_token_n{n}"), serde_json::json!(round3(*v)))).collect();
            let mut row = serde_json::json!({
                "cpu": cpu, "format": r.format.name(), "variant": r.variant, "default": r.default,
                "clock": a.clock, "stat": a.stat,
                "rows": a.rows, "cols": a.cols, "threads": threads, "reps": a.reps,
                "max_rel_diff_vs_scalar": r.max_rel_diff,
            });
            row.as_object_mut().expect("an object").extend(ns);
            println!("{row}");
        }
        return;
    }
    let heads: Vec<String> = a.tokens.iter().map(|n| format!("n={n}")).collect();
    println!("CPU: {cpu}; {table}");
    println!("ns per row-token, {} × {} matrix, {threads} threads, {} of {} ({} clock):", a.rows, a.cols, a.stat, a.reps, a.clock);
    println!("| format | variant | {} | vs scalar |", heads.join(" | "));
    println!("|---|---|{}---|", "---|".repeat(a.tokens.len()));
    for r in rows {
        let ns: Vec<String> = r.ns.iter().map(|v| format!("{v:.2}")).collect();
        let mark = if r.default { " (default)" } else { "" };
        println!("| {} | {}{mark} | {} | {:.1e} |", r.format.name(), r.variant, ns.join(" | "), r.max_rel_diff);
    }
}

/// Nanoseconds per (row × token) of `a.reps` calls with `n` tokens (their median or least, by
/// the wall clock or the thread's CPU time), after one warm-up.
fn ns_per_row_token(isa: Isa, w: &WeightMatrix, x: &[f32], n: usize, a: &Args) -> f64 {
    let mut out = vec![0.0f32; n * w.rows];
    let x = &x[..n * w.cols];
    matmul_with(isa, w, x, n, &mut out);
    let cpu = a.clock == "cpu";
    let mut t: Vec<f64> = (0..a.reps)
        .map(|_| {
            let (start, cpu0) = (Instant::now(), crate::shared::cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID));
            matmul_with(isa, w, x, n, &mut out);
            if cpu {
                (crate::shared::cpu_ns(libc::CLOCK_THREAD_CPUTIME_ID) - cpu0) as f64
            } else {
                start.elapsed().as_nanos() as f64
            }
        })
        .collect();
    t.sort_by(f64::total_cmp);
    let pick = if a.stat == "min" { t[0] } else { t[t.len() / 2] };
    pick / (w.rows * n) as f64
}

/// Largest |a − b| relative to b's largest magnitude.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let scale = b.iter().fold(0.0f32, |m, v| m.max(v.abs())).max(f32::MIN_POSITIVE);
    a.iter().zip(b).fold(0.0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Deterministic values in [-1, 1) (a 64-bit LCG; the bench needs variety, not quality).
fn random_values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
