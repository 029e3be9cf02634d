//! `engram bench step`: what one model step costs by the rows (new tokens) it computes, against
//! a one-row step, measured side by side.
//!
//! Two shapes of the same row count: **batch**, N sequences with one new token each (N
//! sessions decoding together in one engine step, each attending its own KV), and **tree**,
//! one sequence with N new tokens (a speculative step verifying N − 1 drafts; a chain costs
//! what a tree of the same size does, the mask aside). Every sequence holds `--context`
//! tokens of KV before the step, and the step's rows are cut from its cache again after each
//! call, so every repetition computes the same step.
//!
//! Each repetition runs every (shape, N) once, in turn, so the machine's drift falls on all of
//! them alike; the least of the repetitions is reported, by wall clock and by the process's
//! CPU time (all threads: what the step costs the machine, and the figure that still means
//! something when other processes compete for the cores). `× 1 row` is that time over the
//! one-row step's; `per extra row` is `(t(N) − t(1)) / (N − 1) / t(1)`: what each row beyond
//! the first adds, as a share of a one-row step (1.0: batching saves nothing; 0: rows are
//! free). Batched decode pays when that share is well below 1; a speculative tree of 8 drafts
//! at ≤ 1.5× a one-row step needs it ≤ 0.0625.

use std::time::Instant;

use anyhow::{ensure, Context, Result};
use engram_kv::SeqKv;
use engram_model::{Logits, SeqStep};

use crate::common::{kv_pool, load_model, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Rows per step, comma-separated (a one-row step is always measured: it is the reference).
    #[arg(long, default_value = "1,2,4,8,9,17")]
    rows: String,
    /// Tokens of KV each sequence holds before the step.
    #[arg(long, default_value_t = 64)]
    context: usize,
    /// Timed repetitions of every step; the least is reported.
    #[arg(long, default_value_t = 9)]
    reps: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// How a step's rows are spread over sequences.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Shape {
    /// One new token in each of N sequences.
    Batch,
    /// N new tokens in one sequence.
    Tree,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Batch => "batch",
            Shape::Tree => "tree",
        }
    }
}

/// The least wall and CPU time of one (shape, rows) step over the repetitions.
#[derive(Clone, Copy, Debug)]
struct Best {
    wall_ns: u64,
    cpu_ns: u64,
}

pub fn run(a: Args) -> Result<()> {
    let mut rows: Vec<usize> = a
        .rows
        .split(',')
        .map(|s| s.trim().parse::<usize>().with_context(|| format!("--rows: {s:?} is not a row count")))
        .collect::<Result<_>>()?;
    ensure!(rows.iter().all(|&n| n >= 1), "--rows: every row count must be at least 1");
    ensure!(a.context >= 1, "--context must be at least 1");
    rows.push(1);
    rows.sort_unstable();
    rows.dedup();
    let model = load_model(&a.model)?;
    let pool = kv_pool(&model, &a.model)?;
    let max_rows = *rows.last().expect("at least the one-row step");
    let vocab = model.tokenizer.vocab_size().min(model.config.vocab).max(1) as u64;
    let token = |i: u64| ((i * 2_654_435_761 + 12_345) % vocab) as u32;
    // One cache per batch sequence, each with its own context; sequence 0 also runs the trees.
    let mut kvs = Vec::with_capacity(max_rows);
    for s in 0..max_rows {
        let ctx: Vec<u32> = (0..a.context as u64).map(|i| token(i + 1_000 * s as u64)).collect();
        let mut kv = SeqKv::new(&pool);
        kv.reserve(a.context).context("reserving the context's KV (raise --kv-budget-mib)")?;
        model.forward(&mut [SeqStep::new(&ctx, 0, &mut kv, Logits::None)])?;
        kvs.push(kv);
    }
    let new_rows: Vec<u32> = (0..max_rows as u64).map(|i| token(7_777 + i)).collect();
    let cases: Vec<(Shape, usize)> = [Shape::Batch, Shape::Tree]
        .iter()
        .flat_map(|&s| rows.iter().map(move |&n| (s, n)))
        .filter(|&(s, n)| !(s == Shape::Tree && n == 1))
        .collect();
    let mut best = vec![Best { wall_ns: u64::MAX, cpu_ns: u64::MAX }; cases.len()];
    // One untimed round pages the weights in and warms the caches.
    for rep in 0..=a.reps.max(1) {
        for (i, &(shape, n)) in cases.iter().enumerate() {
            // Room for the step's rows, made before the clocks start (truncation freed it).
            match shape {
                Shape::Batch => kvs[..n].iter_mut().try_for_each(|kv| kv.reserve(1)),
                Shape::Tree => kvs[0].reserve(n),
            }
            .context("reserving the step's KV (raise --kv-budget-mib)")?;
            let (wall0, cpu0) = (Instant::now(), crate::shared::cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID));
            {
                let mut steps: Vec<SeqStep> = match shape {
                    Shape::Batch => kvs[..n]
                        .iter_mut()
                        .enumerate()
                        .map(|(s, kv)| SeqStep::new(&new_rows[s..s + 1], a.context, kv, Logits::Last))
                        .collect(),
                    Shape::Tree => vec![SeqStep::new(&new_rows[..n], a.context, &mut kvs[0], Logits::All)],
                };
                model.forward(&mut steps)?;
            }
            let (wall, cpu) =
                (wall0.elapsed().as_nanos() as u64, crate::shared::cpu_ns(libc::CLOCK_PROCESS_CPUTIME_ID).saturating_sub(cpu0));
            for kv in &mut kvs[..n] {
                kv.truncate(a.context);
            }
            if rep > 0 {
                best[i] = Best { wall_ns: best[i].wall_ns.min(wall), cpu_ns: best[i].cpu_ns.min(cpu) };
            }
        }
    }
    let one = best[cases.iter().position(|&c| c == (Shape::Batch, 1)).expect("the one-row step")];
    let threads = engram_kernels::num_threads();
    if !a.json {
        println!(
            "{} ({} weights, {} threads, {} kernels), context {} tokens, least of {} repetitions",
            model.source,
            model.weights.main_dtype().name(),
            threads,
            engram_kernels::internal::Isa::detect().name(),
            a.context,
            a.reps.max(1)
        );
        println!();
        println!("| shape | rows | wall ms | × 1 row | per extra row | CPU ms | × 1 row | per extra row |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    }
    for (&(shape, n), b) in cases.iter().zip(&best) {
        let (wx, cx) = (b.wall_ns as f64 / one.wall_ns as f64, b.cpu_ns as f64 / one.cpu_ns as f64);
        let extra = |x: f64| if n > 1 { (x - 1.0) / (n - 1) as f64 } else { 0.0 };
        if a.json {
            println!(
                "{}",
                serde_json::json!({
                    "model": model.source, "weights": model.weights.main_dtype().name(), "threads": threads,
                    "context": a.context, "shape": shape.name(), "rows": n,
                    "wall_ms": b.wall_ns as f64 / 1e6, "wall_x_one_row": wx, "wall_per_extra_row": extra(wx),
                    "cpu_ms": b.cpu_ns as f64 / 1e6, "cpu_x_one_row": cx, "cpu_per_extra_row": extra(cx),
                })
            );
        } else {
            println!(
                "| {} | {n} | {:.2} | {wx:.2} | {:.3} | {:.2} | {cx:.2} | {:.3} |",
                shape.name(),
                b.wall_ns as f64 / 1e6,
                extra(wx),
                b.cpu_ns as f64 / 1e6,
                extra(cx)
            );
        }
    }
    if !a.json {
        println!();
        println!(
            "Reproduce: engram bench step --model {} --rows {} --context {} --reps {}",
            a.model.model.as_deref().map(|p| p.display().to_string()).unwrap_or_else(|| "M".into()),
            a.rows,
            a.context,
            a.reps
        );
    }
    Ok(())
}
