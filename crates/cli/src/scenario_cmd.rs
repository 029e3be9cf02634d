//! `engram scenario run FILE` and `engram scenario validate FILE`: multi-agent scenarios
//! (agents with per-agent caches) in process or against a running server, streaming the transcript with each
//! turn's cache figures. The runner and the file format live in `engram-scenario`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use engram_scenario::{EngineBackend, EngineOptions, HttpBackend, Progress, RunOptions};

use crate::common::{data_dir, load_model, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    which: Which,
}

#[derive(clap::Subcommand, Debug)]
enum Which {
    /// Run a scenario: agents' turns batched, each agent's cache its working memory.
    Run(RunArgs),
    /// Check a scenario file without running it (each problem with its line).
    Validate {
        /// The scenario file (YAML).
        file: PathBuf,
    },
}

#[derive(clap::Args, Debug)]
struct RunArgs {
    /// The scenario file (YAML).
    file: PathBuf,
    #[command(flatten)]
    model: ModelArgs,
    /// Run against the agents API of the server at this URL instead of in process.
    #[arg(long)]
    server: Option<String>,
    /// Rounds per phase (default: each phase's auto_rounds).
    #[arg(long)]
    rounds: Option<usize>,
    /// Tokens per turn (default: the scenario's max_tokens).
    #[arg(long)]
    max_tokens: Option<usize>,
    /// In process: where agents' caches persist (default: <data dir>/scenarios; permanent
    /// agents resume from it in the next run).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// In process: stop and restart the engine between phases (caches resumed from disk).
    #[arg(long)]
    restart_between_phases: bool,
    /// Print the transcript and figures as one JSON object on stdout (progress goes to stderr).
    #[arg(long)]
    json: bool,
    /// Also write that JSON to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Dispatches `engram scenario ...`.
pub fn run(a: Args) -> Result<()> {
    match a.which {
        Which::Validate { file } => {
            let s = load(&file)?;
            let turns: usize = s.phases.iter().map(|p| p.agents.len() * p.auto_rounds).sum();
            println!("{}: ok ({} agents, {} phases, {turns} turns)", file.display(), s.agents.len(), s.phases.len());
            Ok(())
        }
        Which::Run(r) => run_scenario(r),
    }
}

fn load(file: &PathBuf) -> Result<engram_scenario::Scenario> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    engram_scenario::load(&text).map_err(|e| anyhow!("{}:\n{e}", file.display()))
}

fn run_scenario(a: RunArgs) -> Result<()> {
    let scenario = load(&a.file)?;
    let options =
        RunOptions { rounds: a.rounds, max_tokens: a.max_tokens, restart_between_phases: a.restart_between_phases, run_id: String::new() };
    let mut backend: Box<dyn engram_scenario::Backend> = match &a.server {
        Some(url) => {
            if a.model.model.is_some() {
                bail!("give --model or --server, not both (the server has its model)");
            }
            if a.restart_between_phases {
                bail!("--restart-between-phases restarts the in-process engine; restart a server yourself (the run waits for it)");
            }
            Box::new(HttpBackend::new(url))
        }
        None => {
            let model = Arc::new(load_model(&a.model)?);
            let cache_dir = a.cache_dir.clone().unwrap_or_else(|| data_dir(&a.model.data_dir).join("scenarios"));
            let engine = EngineOptions {
                kv_format: a.model.kv_format.parse()?,
                kv_budget_bytes: a.model.kv_budget_mib << 20,
                cache_dir: Some(cache_dir),
                ..EngineOptions::default()
            };
            Box::new(EngineBackend::start(model, engine))
        }
    };
    let json = a.json;
    let say = |line: String| if json { eprintln!("{line}") } else { println!("{line}") };
    say(format!("# {}", scenario.title.as_deref().unwrap_or(&scenario.id)));
    let report = engram_scenario::run(&scenario, backend.as_mut(), &options, &mut |p| match p {
        Progress::Phase(phase) => say(format!("\n## {} ({})", phase.heading(), phase.agents.join(", "))),
        Progress::Restarted => say("(engine restarted; caches resume from disk)".into()),
        Progress::Turn { message, figures: f, .. } => {
            let ttft = f.ttft_ms.map_or("-".to_string(), |t| format!("{t:.0} ms"));
            say(format!("{}: {}", message.name, message.text.trim()));
            say(format!(
                "    [{} round {}: prompt {} tokens, cached {}, computed {}, TTFT {ttft}, {} tokens in {:.0} ms]",
                f.agent,
                f.round + 1,
                f.prompt_tokens,
                f.cached_tokens,
                f.computed_tokens,
                f.completion_tokens,
                f.total_ms
            ))
        }
    })
    .map_err(|e| anyhow!(e))?;
    drop(backend);
    let (prompt, computed): (usize, usize) =
        report.phases.iter().flat_map(|p| &p.turns).fold((0, 0), |(p, c), t| (p + t.prompt_tokens, c + t.computed_tokens));
    say(format!(
        "\n{} phases in {:.1} s; {prompt} prompt tokens, {} from the agents' caches, {computed} computed",
        report.phases.len(),
        report.elapsed_ms / 1e3,
        prompt - computed
    ));
    let text = serde_json::to_string_pretty(&report)?;
    if let Some(out) = &a.out {
        std::fs::write(out, &text).with_context(|| format!("writing {}", out.display()))?;
    }
    if json {
        println!("{text}");
    }
    Ok(())
}
