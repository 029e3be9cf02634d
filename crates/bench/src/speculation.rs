//! `engram bench speculation`: decode speed with speculative decoding (prompt lookup,
//! `engram_engine::speculate`) against decoding one token a step, on code-editing prompts —
//! a Python file, then the same file again with one identifier renamed, cut after its first
//! lines, for the model to go on repeating it — through the server's scheduler, one request
//! at a time, the two modes alternating per prompt. Reports per prompt decode tokens/s with
//! and without, the speed-up, the drafts' acceptance rate, and whether the text is identical
//! (it must be: speculation never changes the tokens).
//!
//! With `--draft-budget both` a third mode runs beside them: prompt lookup with trees sized by
//! acceptance alone (`DraftBudget::Acceptance`) against the default, sized by this machine's
//! measured step costs (`DraftBudget::Measured`).
//!
//! With `--draft PATH` a third mode runs beside them instead: a draft model (`engram_engine::DraftModel`,
//! sharing the target's vocabulary) drafting `--draft-k` tokens greedily per step, verified
//! the same way; its speed-up and acceptance are reported in the same run.
//!
//! The speed-up depends on the model copying what it saw: measure on a trained model
//! (default: the embedded pycode-7m; `--model models/pycode-long/…` for the 16K one). Prompt
//! sources default to the Python files of `models/pycode-long/recipe/` in this repository.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use engram_engine::scheduler::Job;
use engram_engine::EngineHandle;
use engram_engine::{DraftBudget, DraftModel, Metrics, PromptLookup, SamplingParams, SchedulerConfig};
use engram_model::Model;

use crate::common::{kv_pool, load_model, ModelArgs};
use crate::timed_sink::TimedSink;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Python files to build the prompts from (default: models/pycode-long/recipe/*.py).
    #[arg(long, value_name = "FILE", num_args = 1..)]
    source: Vec<PathBuf>,
    /// Prompt tokens taken from each file (its first lines up to this many tokens).
    #[arg(long, default_value_t = 384)]
    file_tokens: usize,
    /// Tokens decoded per request.
    #[arg(long, default_value_t = 128)]
    decode_tokens: usize,
    /// Timed rounds (each runs every prompt with and without speculation).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Prompt lookup: longest n-gram, most draft tokens per branch, most branches, most drafts a step.
    #[arg(long, default_value_t = PromptLookup::default().max_ngram)]
    max_ngram: usize,
    #[arg(long, default_value_t = PromptLookup::default().max_depth)]
    max_depth: usize,
    #[arg(long, default_value_t = PromptLookup::default().max_branches)]
    max_branches: usize,
    #[arg(long, default_value_t = PromptLookup::default().max_drafts)]
    max_drafts: usize,
    /// A draft model (GGUF or HF folder sharing the target's vocabulary) measured beside
    /// prompt lookup and plain decoding.
    #[arg(long, value_name = "PATH")]
    draft: Option<PathBuf>,
    /// Tokens the draft model drafts per step (at most).
    #[arg(long, default_value_t = 4)]
    draft_k: usize,
    /// How many drafts a tree may hold: `measured` (by this machine's step costs and the
    /// acceptance rate, the default), `acceptance` (by the acceptance rate alone), or `both`
    /// (measured, with acceptance-only as a third mode beside it).
    #[arg(long, default_value = "measured", value_parser = ["measured", "acceptance", "both"])]
    draft_budget: String,
    /// One JSON line per prompt, then a summary line.
    #[arg(long)]
    json: bool,
}

/// The code-editing prompt built from `file`: its first lines, then the same lines with the
/// most frequent long identifier renamed, cut a third of the way in.
fn edit_prompt(model: &Model, file: &Path, file_tokens: usize) -> Result<String> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let mut lines = Vec::new();
    let mut tokens = 0;
    for line in text.lines() {
        tokens += model.tokenizer.encode(line, false)?.ids.len() + 1;
        if tokens > file_tokens {
            break;
        }
        lines.push(line);
    }
    let head = lines.join("\n");
    let mut counts = std::collections::HashMap::<&str, usize>::new();
    for w in head.split(|c: char| !(c.is_alphanumeric() || c == '_')).filter(|w| w.len() >= 5 && !w.starts_with(char::is_numeric)) {
        *counts.entry(w).or_default() += 1;
    }
    let Some((name, _)) = counts.into_iter().max_by_key(|&(w, n)| (n, std::cmp::Reverse(w))) else {
        bail!("{}: no identifier to rename in its first lines", file.display())
    };
    let edited = head.replace(name, &format!("{name}_v2"));
    let cut: String = edited.lines().take(lines.len().div_ceil(3)).collect::<Vec<_>>().join("\n");
    Ok(format!("{head}\n\n# The same code with `{name}` renamed to `{name}_v2`:\n{cut}\n"))
}

/// One request's seconds from submission to its end, tokens, text, and the drafts it
/// verified and accepted.
struct Outcome {
    secs: f64,
    tokens: usize,
    text: String,
    drafted: u64,
    accepted: u64,
}

/// How a request decodes: one token a step, prompt lookup, or a draft model.
#[derive(Clone)]
enum Mode {
    Plain,
    Lookup(PromptLookup, DraftBudget),
    Draft(Arc<DraftModel>, DraftBudget),
}

fn run_one(model: &Arc<Model>, args: &Args, prompt: &str, max_tokens: usize, mode: &Mode) -> Result<Outcome> {
    let pool = kv_pool(model, &args.model)?;
    let config = match mode {
        Mode::Plain => SchedulerConfig::default(),
        Mode::Lookup(l, b) => SchedulerConfig { speculation: Some(*l), draft_budget: *b, ..SchedulerConfig::default() },
        Mode::Draft(d, b) => SchedulerConfig {
            speculation: Some(PromptLookup::default()),
            draft_model: Some(d.clone()),
            draft_budget: *b,
            ..SchedulerConfig::default()
        },
    };
    let metrics = Arc::new(Metrics::default());
    let stack_model = model.clone();
    let (handle, engine) = EngineHandle::start(model.clone(), pool, config, metrics.clone(), move |_, p| {
        engram_stack::build(&stack_model, p, &Default::default()).policy
    });
    let ids = model.tokenizer.encode(prompt, true)?.ids;
    let params = SamplingParams { max_tokens, ignore_eos: true, ..Default::default() };
    let job = Job {
        owner: "bench".into(),
        session: None,
        text: None,
        add_special: true,
        prompt: ids,
        params,
        pinned: false,
        long_context_after: None,
    };
    let sink = TimedSink::default();
    let start = Instant::now();
    handle.submit(job, Box::new(sink.clone()))?;
    drop(handle);
    engine.join().map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    let t = sink.get();
    if let Some(e) = t.failed {
        bail!("the request failed: {e}");
    }
    Ok(Outcome {
        secs: t.end.map_or(0.0, |e| e.duration_since(start).as_secs_f64()),
        tokens: t.completion_tokens,
        text: t.text,
        drafted: metrics.draft_tokens.load(Relaxed),
        accepted: metrics.draft_tokens_accepted.load(Relaxed),
    })
}

fn default_sources() -> Result<Vec<PathBuf>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/pycode-long/recipe");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("{} (pass --source FILE)", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "py"))
        .collect();
    files.sort();
    Ok(files)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

pub fn run(args: Args) -> Result<()> {
    let model = Arc::new(load_model(&args.model)?);
    let sources = if args.source.is_empty() { default_sources()? } else { args.source.clone() };
    let lookup = PromptLookup {
        max_ngram: args.max_ngram,
        max_depth: args.max_depth,
        max_branches: args.max_branches,
        max_drafts: args.max_drafts,
        ..PromptLookup::default()
    };
    let draft = match &args.draft {
        Some(p) => {
            let d = Arc::new(Model::load(p).with_context(|| format!("--draft {}", p.display()))?);
            let dm = DraftModel::new(&model, d, args.draft_k, 256 << 20).map_err(|e| anyhow::anyhow!("--draft {}: {e}", p.display()))?;
            Some(Arc::new(dm))
        }
        None => None,
    };
    if draft.is_some() && args.draft_budget == "both" {
        bail!("--draft-budget both and --draft each add the third mode: pass one of them");
    }
    // `both`: the measured budget, the acceptance-only one added below.
    let budget = if args.draft_budget == "both" { DraftBudget::Measured } else { args.draft_budget.parse().map_err(anyhow::Error::msg)? };
    let mut modes = vec![Mode::Plain, Mode::Lookup(lookup, budget)];
    modes.extend(draft.clone().map(|d| Mode::Draft(d, budget)));
    let third = if draft.is_some() { "draft-model" } else { "acceptance-budget" };
    if args.draft_budget == "both" {
        modes.push(Mode::Lookup(lookup, DraftBudget::Acceptance));
    }
    if !args.json {
        println!(
            "speculative decoding (prompt lookup {lookup:?}, draft budget {budget:?}), {} decode tokens, {} rounds, median",
            args.decode_tokens, args.rounds
        );
        if args.draft_budget == "both" {
            println!("beside it: prompt lookup with the acceptance-only draft budget");
            println!("| prompt | plain tok/s | lookup tok/s | lookup speed-up | lookup accepted / drafted | acceptance-budget tok/s | acceptance-budget speed-up | acceptance-budget accepted / drafted | identical |");
            println!("|---|---|---|---|---|---|---|---|---|");
        } else if let Some(p) = &args.draft {
            println!(
                "draft model {} ({}), {} drafts a step at most",
                p.display(),
                draft.as_ref().map_or(String::new(), |d| format!("{:?}", d)),
                args.draft_k
            );
            println!("| prompt | plain tok/s | lookup tok/s | lookup speed-up | lookup accepted / drafted | draft-model tok/s | draft-model speed-up | draft-model accepted / drafted | identical |");
            println!("|---|---|---|---|---|---|---|---|---|");
        } else {
            println!("| prompt | plain tok/s | speculative tok/s | speed-up | accepted / drafted | identical |");
            println!("|---|---|---|---|---|---|");
        }
    }
    let (mut ratios, mut draft_ratios, mut all_same) = (Vec::new(), Vec::new(), true);
    let (mut acc, mut drafted, mut dacc, mut ddrafted) = (0u64, 0u64, 0u64, 0u64);
    for file in &sources {
        let prompt = edit_prompt(&model, file, args.file_tokens)?;
        // Warm-up (weights paged in), not reported.
        run_one(&model, &args, &prompt, 1, &Mode::Plain)?;
        let mut speeds: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
        let mut counts = vec![(0u64, 0u64); modes.len()];
        let mut same = true;
        for round in 0..args.rounds {
            // Rotate which goes first, so drift on a noisy machine hits every mode alike.
            let mut order: Vec<usize> = (0..modes.len()).collect();
            order.rotate_left(round % modes.len());
            let mut texts = vec![String::new(); modes.len()];
            // Decode time: the request's time less that of the same request stopped after its
            // first token (its prefill and first sampling).
            let first = run_one(&model, &args, &prompt, 1, &Mode::Plain)?.secs;
            for m in order {
                let o = run_one(&model, &args, &prompt, args.decode_tokens, &modes[m])?;
                speeds[m].push(o.tokens.saturating_sub(1) as f64 / (o.secs - first).max(1e-9));
                counts[m] = (o.accepted, o.drafted);
                texts[m] = o.text;
            }
            same &= texts.iter().all(|t| *t == texts[0]);
        }
        let med: Vec<f64> = speeds.into_iter().map(median).collect();
        let (p, f) = (med[0], med[1]);
        let (a, d) = counts[1];
        let name = file.file_name().map_or_else(|| file.display().to_string(), |n| n.to_string_lossy().into_owned());
        ratios.push(f / p);
        all_same &= same;
        acc += a;
        drafted += d;
        if let Some(&g) = med.get(2) {
            draft_ratios.push(g / p);
            dacc += counts[2].0;
            ddrafted += counts[2].1;
        }
        if args.json {
            let mut line = serde_json::json!({"prompt": name, "plain_tok_s": p, "speculative_tok_s": f, "speedup": f / p,
                "drafts_accepted": a, "drafts": d, "identical": same});
            if let Some(&g) = med.get(2) {
                let key = third.replace('-', "_");
                line[format!("{key}_tok_s")] = serde_json::json!(g);
                line[format!("{key}_speedup")] = serde_json::json!(g / p);
                line[format!("{key}_accepted")] = serde_json::json!(counts[2].0);
                line[format!("{key}_drafts")] = serde_json::json!(counts[2].1);
            }
            println!("{line}");
        } else if let Some(&g) = med.get(2) {
            let (da, dd) = counts[2];
            println!(
                "| {name} | {p:.1} | {f:.1} | {:.2}x | {a} / {d} | {g:.1} | {:.2}x | {da} / {dd} | {} |",
                f / p,
                g / p,
                if same { "yes" } else { "NO" }
            );
        } else {
            println!("| {name} | {p:.1} | {f:.1} | {:.2}x | {a} / {d} | {} |", f / p, if same { "yes" } else { "NO" });
        }
    }
    let geo_of = |r: &[f64]| (r.iter().map(|r| r.ln()).sum::<f64>() / r.len().max(1) as f64).exp();
    if !draft_ratios.is_empty() {
        let drate = dacc as f64 / ddrafted.max(1) as f64;
        if args.json {
            println!(
                "{}",
                serde_json::json!({"summary": third.replace('-', "_"), "speedup_geomean": geo_of(&draft_ratios), "acceptance": drate})
            );
        } else {
            println!("\n{third}: speed-up (geometric mean) {:.2}x; drafts accepted {:.0}%", geo_of(&draft_ratios), drate * 100.0);
        }
    }
    let geo = ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len().max(1) as f64;
    let rate = acc as f64 / drafted.max(1) as f64;
    if args.json {
        println!("{}", serde_json::json!({"summary": true, "speedup_geomean": geo.exp(), "acceptance": rate, "identical": all_same}));
    } else {
        println!("\nspeed-up (geometric mean) {:.2}x; drafts accepted {:.0}%; output identical: {}", geo.exp(), rate * 100.0, all_same);
        println!(
            "reproduce: engram bench speculation{}{}{}",
            args.model.model.as_ref().map_or(String::new(), |m| format!(" --model {}", m.display())),
            if args.draft_budget == "measured" { String::new() } else { format!(" --draft-budget {}", args.draft_budget) },
            args.draft.as_ref().map_or(String::new(), |d| format!(" --draft {} --draft-k {}", d.display(), args.draft_k))
        );
    }
    if !all_same {
        bail!("speculation changed the output");
    }
    Ok(())
}
