//! `engram bench scenario`: a multi-agent scenario (default: the shipped gossip network)
//! end to end with each agent's cache as its working memory, against re-prefilling every
//! prompt, per KV format; working memory also with the engine restarted between phases
//! (every agent resumed from its persisted cache). Reports end-to-end time, per phase time
//! and mean TTFT, tokens computed, and whether the transcript equals the re-prefilling run's.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use engram_kv::KvFormat;
use engram_model::Model;
use engram_scenario::{EngineBackend, EngineOptions, Report, RunOptions, Scenario};
use serde_json::json;

use crate::common::{data_dir, load_model, ModelArgs};

/// The scenario run when no `--scenario` is given.
const GOSSIP: &str = include_str!("../../../examples/scenarios/gossip.yaml");

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model (default: the llama-1b Q4_0 fixture, written into <data dir>/fixtures on first use).
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// A scenario file (default: examples/scenarios/gossip.yaml, built in).
    #[arg(long)]
    scenario: Option<PathBuf>,
    /// Tokens per turn.
    #[arg(long, default_value_t = 16)]
    max_tokens: usize,
    /// Rounds per phase (default: the scenario's).
    #[arg(long)]
    rounds: Option<usize>,
    /// KV formats, comma-separated.
    #[arg(long, default_value = "f16,q4")]
    kv_formats: String,
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// One JSON object instead of tables.
    #[arg(long)]
    json: bool,
}

/// The llama-1b Q4_0 fixture, generated once into the data directory.
fn default_model(data: Option<&PathBuf>) -> Result<PathBuf> {
    let dir = data_dir(&data.cloned()).join("fixtures");
    let path = dir.join("llama-1b-q4_0.gguf");
    if !path.exists() {
        eprintln!("writing the llama-1b Q4_0 fixture into {}", dir.display());
        let fmt = engram_fixture::GgufFormat::Q4_0;
        let files = engram_fixture::generate(engram_fixture::Shape::Llama1b, engram_fixture::DEFAULT_SEED, &dir, &[fmt], &mut |m| {
            eprintln!("{m}")
        })?;
        return Ok(files.gguf(fmt).context("the fixture wrote no Q4_0 file")?.to_path_buf());
    }
    Ok(path)
}

/// One row: a mode on a KV format.
fn measure(model: &Arc<Model>, scenario: &Scenario, opts: &RunOptions, format: KvFormat, reuse: bool, restart: bool) -> Result<Report> {
    let dir = tempfile::tempdir()?;
    let engine = EngineOptions {
        kv_format: format,
        kv_budget_bytes: 2 << 30,
        cache_dir: restart.then(|| dir.path().to_path_buf()),
        reuse,
        ..EngineOptions::default()
    };
    let mut backend = EngineBackend::start(model.clone(), engine);
    let opts = RunOptions { restart_between_phases: restart, ..opts.clone() };
    engram_scenario::run(scenario, &mut backend, &opts, &mut |_| {}).map_err(|e| anyhow!(e))
}

fn row(mode: &str, format: &str, r: &Report, baseline: Option<&Report>) -> serde_json::Value {
    let turns = || r.phases.iter().flat_map(|p| &p.turns);
    let phases: Vec<_> = r
        .phases
        .iter()
        .map(|p| {
            let ttfts: Vec<f64> = p.turns.iter().filter_map(|t| t.ttft_ms).collect();
            json!({
                "phase": p.name,
                "ms": p.elapsed_ms.round(),
                "mean_ttft_ms": (ttfts.iter().sum::<f64>() / ttfts.len().max(1) as f64).round(),
                "prompt_tokens": p.turns.iter().map(|t| t.prompt_tokens).sum::<usize>(),
                "computed_tokens": p.turns.iter().map(|t| t.computed_tokens).sum::<usize>(),
            })
        })
        .collect();
    json!({
        "mode": mode,
        "kv_format": format,
        "end_to_end_ms": r.elapsed_ms.round(),
        "speedup_vs_reprefill": baseline.map(|b| ((b.elapsed_ms / r.elapsed_ms) * 100.0).round() / 100.0),
        "turns": turns().count(),
        "prompt_tokens": turns().map(|t| t.prompt_tokens).sum::<usize>(),
        "computed_tokens": turns().map(|t| t.computed_tokens).sum::<usize>(),
        "completion_tokens": turns().map(|t| t.completion_tokens).sum::<usize>(),
        "transcript_equals_reprefill": baseline.map(|b| b.transcript() == r.transcript()),
        "phases": phases,
    })
}

/// Runs the benchmark. See the module doc.
pub fn run(a: Args) -> Result<()> {
    let text = match &a.scenario {
        Some(p) => std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?,
        None => GOSSIP.to_string(),
    };
    let scenario = engram_scenario::load(&text).map_err(|e| anyhow!("{e}"))?;
    let path = match &a.model {
        Some(p) => p.clone(),
        None => default_model(a.data_dir.as_ref())?,
    };
    let args = ModelArgs {
        model: Some(path),
        threads: Some(a.threads),
        kv_format: "f16".into(),
        attention: engram_model::AttentionPrecision::Exact,
        kv_budget_mib: 2048,
        data_dir: a.data_dir.clone(),
    };
    let model = Arc::new(load_model(&args)?);
    let opts = RunOptions { rounds: a.rounds, max_tokens: Some(a.max_tokens), run_id: "bench".into(), ..RunOptions::default() };
    let mut rows = Vec::new();
    for name in a.kv_formats.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let format: KvFormat = name.parse()?;
        eprintln!("{name}: re-prefilling every prompt");
        let cold = measure(&model, &scenario, &opts, format, false, false)?;
        eprintln!("{name}: working memory");
        let hot = measure(&model, &scenario, &opts, format, true, false)?;
        eprintln!("{name}: working memory, engine restarted between phases");
        let warm = measure(&model, &scenario, &opts, format, true, true)?;
        for r in [
            row("reprefill", name, &cold, None),
            row("working_memory", name, &hot, Some(&cold)),
            row("working_memory_restarts", name, &warm, Some(&cold)),
        ] {
            // Each row as it is measured, so a long run that is cut short still says something.
            eprintln!("{r}");
            rows.push(r);
        }
    }
    let out = json!({
        "model": model.source,
        "weights": model.weights.main_dtype().name(),
        "threads": engram_kernels::num_threads(),
        "scenario": scenario.id,
        "max_tokens": a.max_tokens,
        "rows": rows,
    });
    if a.json {
        println!("{out}");
        return Ok(());
    }
    println!("scenario {} on {} ({} threads), {} tokens per turn", scenario.id, model.source, engram_kernels::num_threads(), a.max_tokens);
    println!("| KV | mode | end to end | vs re-prefill | computed / prompt tokens | mean TTFT per phase | transcript = re-prefill |");
    println!("|---|---|---:|---:|---:|---|---|");
    for r in &rows {
        let ttft: Vec<String> = r["phases"].as_array().unwrap().iter().map(|p| format!("{} ms", p["mean_ttft_ms"])).collect();
        println!(
            "| {} | {} | {:.1} s | {} | {} / {} | {} | {} |",
            r["kv_format"].as_str().unwrap_or_default(),
            r["mode"].as_str().unwrap_or_default(),
            r["end_to_end_ms"].as_f64().unwrap_or_default() / 1e3,
            r["speedup_vs_reprefill"].as_f64().map_or("-".into(), |s| format!("{s:.2}x")),
            r["computed_tokens"],
            r["prompt_tokens"],
            ttft.join(", "),
            r["transcript_equals_reprefill"].as_bool().map_or("-".into(), |b| b.to_string()),
        );
    }
    Ok(())
}
