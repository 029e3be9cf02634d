//! Task-level quality of the long-context policy as it is served (`--task-model`): DynaKV
//! with its sinks, recent window and token budget over KV offloaded past a RAM budget, against
//! exact attention and against a sliding window holding the same number of tokens in RAM.
//!
//! For each held-out text and length `L`: the first `L - scored` tokens are prefilled once with
//! exact attention (as a served prompt is: a multi-token step reads every key), then
//! - **held-out loss**: the last `scored` tokens are decoded one at a time by each policy and
//!   the mean negative log-likelihood of the true next token is taken (nats/token);
//! - **retrieval probe**: functions defined (`def NAME(`) in the first half of the prefilled
//!   history whose name is at least three tokens and appears nowhere in the last
//!   `window` tokens (so a sliding window cannot see it) are asked for at the end: after
//!   the history, `"\n\n\nresult ="` and the name's first token are decoded one token at a
//!   time (every step sparse, the cue too); reported: probes whose every remaining name token
//!   was the argmax of the step before it, the share of remaining name tokens that were, and
//!   their mean NLL.
//!
//! RAM: DynaKV keeps the sinks, the recent window and a cluster cache of `budget` tokens (one
//! step's fetched set) in RAM, besides its index; the sliding window keeps `sinks + recent +
//! budget` tokens (4 sinks and the most recent rest), the same KV bytes and the same keys
//! attended per step. The loss runs offload DynaKV's KV to a file (lossless: the logits equal
//! the in-RAM cache's bit for bit, `crates/sparse/tests/it/offload.rs`); the probes run its
//! index in RAM (a copy per probe), which gives the same selections.

use std::collections::HashSet;
use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use engram_model::{AttentionPrecision, Model};
use engram_sparse::{Method, OffloadConfig, SparseConfig, SparseKv};
use serde_json::json;

use super::Args;
use crate::fidelity::measure::Scores;
use crate::fidelity::read_texts;
use crate::fidelity::rows::{prefill, score};

/// The probe's cue before the name's first token.
const CUE: &str = "\n\n\nresult =";

/// One policy's sums over the windows of one length.
#[derive(Default, Clone)]
struct Acc {
    nll: f64,
    predicted: usize,
    probes_right: usize,
    probes: usize,
    /// Sum of the probes' mean NLL of the name's remaining tokens.
    probe_nll: f64,
    /// The name's remaining tokens, and those that were the argmax of the step before.
    name_tokens: usize,
    name_tokens_right: usize,
}

/// An identifier defined early in a history: the `def` token's position and the name's tokens.
struct Probe {
    at: usize,
    name: Vec<u32>,
}

pub fn run(a: &Args, path: &Path) -> Result<()> {
    let model = Model::load(path)?.with_attention(AttentionPrecision::Exact);
    anyhow::ensure!(a.task_scored >= 2, "--task-scored must be at least 2");
    let texts = read_texts(&model, &a.text)?;
    let c = &model.config;
    // f16 key and value of one token, every layer and KV head.
    let row = c.num_layers * c.num_kv_heads * c.head_dim * 4;
    let served =
        SparseConfig { method: Method::DynaKv { b_max: Method::B_MAX, eager: false }, budget: a.budget, sinks: a.sinks, recent: a.recent };
    let window_tokens = a.sinks + a.recent + a.budget;
    let window = SparseConfig { method: Method::Streaming, budget: 0, sinks: a.sinks, recent: window_tokens - a.sinks };
    let dir = a.offload_dir.clone().unwrap_or_else(std::env::temp_dir);
    let cue = model.tokenizer.encode(CUE, false)?.ids;
    let started = Instant::now();
    let names = ["exact", "DynaKV", "sliding window"];
    for &len in &a.task_lengths {
        anyhow::ensure!(
            len > a.task_scored && len <= c.max_positions,
            "length {len}: must exceed --task-scored and fit the model's context of {} tokens",
            c.max_positions
        );
        let mut acc = vec![Acc::default(); 3];
        let mut windows = Vec::new();
        let mut ram = (0usize, 0usize);
        for text in texts.iter().filter(|t| t.ids.len() >= len) {
            let (context, scored) = text.ids[..len].split_at(len - a.task_scored);
            let t = Instant::now();
            let mut base = SparseKv::new(c, None);
            base.reserve(len + 64);
            prefill(&model, &mut base, context)?;
            let mut dyn_base = base.fork(Some(served));
            dyn_base.build_index();
            eprintln!("[{len} · {}] prefill and index: {:.1} s", text.name, t.elapsed().as_secs_f64());

            // Held-out loss over the last `scored` tokens.
            let t = Instant::now();
            let next: Vec<Option<u32>> = (0..scored.len()).map(|i| scored.get(i + 1).copied()).collect();
            let (exact, _) = score(&model, &mut base.fork(None), scored, &|_| None, &[])?;
            let mut dkv = dyn_base.fork_with_index();
            let off = OffloadConfig { ram_budget: 0, cache_bytes: a.budget * row, ..OffloadConfig::new(dir.clone(), model.fingerprint.0) };
            dkv.offload(off)?;
            let (dynakv, _) = score(&model, &mut dkv, scored, &|_| None, &[])?;
            ram.0 = ram.0.max(dkv.ram_kv_bytes());
            ram.1 = ram.1.max(dkv.slot_table_bytes());
            drop(dkv);
            let mut wkv = base.fork(Some(window));
            wkv.build_index();
            let (windowed, _) = score(&model, &mut wkv, scored, &|_| None, &[])?;
            drop(wkv);
            let d = Scores::compare(&exact, &dynakv, c.vocab, &next);
            let w = Scores::compare(&exact, &windowed, c.vocab, &next);
            for (i, (nll, n)) in
                [(d.nll_exact, d.predicted), (d.nll_approx, d.predicted), (w.nll_approx, w.predicted)].into_iter().enumerate()
            {
                acc[i].nll += nll;
                acc[i].predicted += n;
            }
            eprintln!(
                "[{len} · {}] loss over {} tokens: exact {:.4}, DynaKV {:.4}, window {:.4} ({:.1} s)",
                text.name,
                scored.len(),
                d.nll_exact / d.predicted.max(1) as f64,
                d.nll_approx / d.predicted.max(1) as f64,
                w.nll_approx / w.predicted.max(1) as f64,
                t.elapsed().as_secs_f64()
            );

            // Retrieval probes over the same history.
            let t = Instant::now();
            let probes = find_probes(&model, context, window_tokens, a.task_probes);
            for p in &probes {
                let mut right = Vec::new();
                for (i, acc) in acc.iter_mut().enumerate() {
                    let mut kv = match i {
                        0 => base.fork(None),
                        1 => dyn_base.fork_with_index(),
                        _ => {
                            let mut k = base.fork(Some(window));
                            k.build_index();
                            k
                        }
                    };
                    let (hits, nll) = ask(&model, &mut kv, &cue, &p.name)?;
                    let ok = hits == p.name.len() - 1;
                    acc.probes += 1;
                    acc.probes_right += ok as usize;
                    acc.probe_nll += nll;
                    acc.name_tokens += p.name.len() - 1;
                    acc.name_tokens_right += hits;
                    right.push(ok);
                }
                if a.json {
                    let name = model.tokenizer.decode(&p.name, false).unwrap_or_default();
                    println!(
                        "{}",
                        json!({"bench": "sparse-task-probe", "context": len, "text": text.name, "name": name.trim(), "defined_at": p.at,
                               "distance": context.len() - p.at, "exact": right[0], "dynakv": right[1], "window": right[2]})
                    );
                }
            }
            eprintln!("[{len} · {}] {} probes ({:.1} s)", text.name, probes.len(), t.elapsed().as_secs_f64());
            windows.push(text.name.clone());
        }
        if windows.is_empty() {
            eprintln!("length {len}: no text has {len} tokens; skipped");
            continue;
        }
        let rows: Vec<serde_json::Value> = names
            .iter()
            .zip(&acc)
            .map(|(n, x)| {
                json!({"bench": "sparse-task", "policy": n, "context": len, "windows": windows, "scored_per_window": a.task_scored,
                       "mean_nll": x.nll / x.predicted.max(1) as f64, "probes": x.probes, "probes_right": x.probes_right,
                       "probe_accuracy": x.probes_right as f64 / x.probes.max(1) as f64,
                       "probe_name_nll": x.probe_nll / x.probes.max(1) as f64,
                       "name_tokens": x.name_tokens, "name_token_accuracy": x.name_tokens_right as f64 / x.name_tokens.max(1) as f64,
                       "kv_ram_bytes": match *n { "exact" => (len * row) as f64, "DynaKV" => ram.0 as f64, _ => (window_tokens * row) as f64 }})
            })
            .collect();
        if a.json {
            rows.iter().for_each(|r| println!("{r}"));
        } else {
            print_table(len, &windows, a, window_tokens, ram, &rows);
        }
    }
    if !a.json {
        println!(
            "task: model {}, budget {}, sinks {}, recent {}; {:.0} s",
            model.source,
            a.budget,
            a.sinks,
            a.recent,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// Decodes `cue` and `name` one token at a time after what `kv` holds; returns how many of
/// the name's tokens after the first were the argmax of the step before them, and the mean NLL
/// of those tokens.
fn ask(model: &Model, kv: &mut SparseKv, cue: &[u32], name: &[u32]) -> Result<(usize, f64)> {
    let seq: Vec<u32> = cue.iter().chain(name).copied().collect();
    let (logits, _) = score(model, kv, &seq[..seq.len() - 1], &|_| None, &[])?;
    let v = model.config.vocab;
    let (mut hits, mut nll) = (0, 0.0);
    for k in 1..name.len() {
        let i = cue.len() + k - 1;
        let l = &logits[i * v..(i + 1) * v];
        hits += (engram_engine::argmax(l) as u32 == name[k]) as usize;
        let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
        let z = l.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln() + m;
        nll += z - l[name[k] as usize] as f64;
    }
    Ok((hits, nll / (name.len() - 1).max(1) as f64))
}

/// Up to `max` functions defined (`def NAME(`) in the first half of `ctx`, whose name is an
/// identifier of at least six characters and three tokens and occurs nowhere in the last
/// `tail` tokens; spread evenly over the candidates, each name once.
fn find_probes(model: &Model, ctx: &[u32], tail: usize, max: usize) -> Vec<Probe> {
    let piece = |id: u32| model.tokenizer.decode(&[id], false).unwrap_or_default();
    let pieces: Vec<String> = ctx.iter().map(|&t| piece(t)).collect();
    let tail_text: String = pieces[ctx.len().saturating_sub(tail)..].concat();
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for i in 0..ctx.len() / 2 {
        if pieces[i].trim() != "def" {
            continue;
        }
        let Some(j) = (i + 1..(i + 12).min(ctx.len())).find(|&j| pieces[j].contains('(')) else { continue };
        if !pieces[j].starts_with('(') {
            continue;
        }
        let name: String = pieces[i + 1..j].concat();
        let id = name.trim();
        if j - i - 1 < 3
            || id.len() < 6
            || !name.starts_with(' ')
            || !id.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '_')
            || tail_text.contains(id)
            || !seen.insert(id.to_string())
        {
            continue;
        }
        found.push(Probe { at: i, name: ctx[i + 1..j].to_vec() });
    }
    if found.len() <= max {
        return found;
    }
    let step = found.len() as f64 / max as f64;
    let picks: HashSet<usize> = (0..max).map(|k| (k as f64 * step) as usize).collect();
    found.into_iter().enumerate().filter(|(k, _)| picks.contains(k)).map(|(_, p)| p).collect()
}

fn print_table(len: usize, windows: &[String], a: &Args, window_tokens: usize, ram: (usize, usize), rows: &[serde_json::Value]) {
    let mib = |b: f64| b / (1 << 20) as f64;
    println!();
    println!(
        "### Task quality at {len} tokens ({} window(s): {}; loss over the last {} tokens; DynaKV budget {}, {} sinks, recent {}; sliding window {window_tokens} tokens)",
        windows.len(),
        windows.join(", "),
        a.task_scored,
        a.budget,
        a.sinks,
        a.recent
    );
    println!();
    println!(
        "| policy | KV in RAM | held-out loss (nats/token) | Δ vs exact | probes right (whole name) | name tokens right | probe name NLL |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let exact = rows.first().and_then(|r| r["mean_nll"].as_f64()).unwrap_or(f64::NAN);
    for r in rows {
        let nll = r["mean_nll"].as_f64().unwrap_or(f64::NAN);
        println!(
            "| {} | {:.1} MiB | {:.4} | {:+.4} | {} / {} | {:.3} of {} | {:.3} |",
            r["policy"].as_str().unwrap_or(""),
            mib(r["kv_ram_bytes"].as_f64().unwrap_or(f64::NAN)),
            nll,
            nll - exact,
            r["probes_right"],
            r["probes"],
            r["name_token_accuracy"].as_f64().unwrap_or(f64::NAN),
            r["name_tokens"],
            r["probe_name_nll"].as_f64().unwrap_or(f64::NAN),
        );
    }
    println!();
    println!("DynaKV's KV in RAM: sinks, recent window, write buffer and cluster cache, at the end of the loss run; its position → file row tables add {:.1} MiB, its index (centroids, member lists) is not counted.", mib(ram.1 as f64));
}
