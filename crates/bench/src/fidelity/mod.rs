//! `engram bench fidelity`: what each approximation costs, against the exact path on the same
//! tokens (f32 KV, exact attention, every key).
//!
//! For each text and each context length `L`, the window is the text's first `L` tokens: the
//! first `L - scored` are prefilled, the last `scored` are decoded one token at a time, and
//! every row's next-token distributions at those tokens are compared with the exact ones
//! ([`measure::Scores`]: mean KL, top-1 agreement, perplexity of the true text, worst logit
//! error; for rows that drop keys, the exact attention mass their kept keys hold,
//! [`attention_mass`]). Rows: [`rows::Row`] (KV formats, bf16 attention, the simulated 4-bit
//! alternatives, eviction to a budget, chunk KV reused at new positions).
//!
//! Texts: held-out long files. For `models/pycode-long`,
//! `python3 models/pycode-long/recipe/heldout_text.py --out DIR` writes its held-out packages
//! (never trained on) as text.

mod attention_mass;
pub mod measure;
pub(crate) mod rows;
mod sim_quant;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{AttentionPrecision, Model};
use serde_json::json;

use crate::common::{load_model, ModelArgs};
use measure::Scores;
use rows::Row;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Text files (held-out long files; see the module doc). Default: the fixture corpus,
    /// which only fills short lengths.
    #[arg(long, num_args = 1..)]
    text: Vec<PathBuf>,
    /// Context lengths (tokens per window, scored tokens included).
    #[arg(long, value_delimiter = ',', default_value = "4096,8192,16384")]
    lengths: Vec<usize>,
    /// Tokens scored at the end of each window, one at a time.
    #[arg(long, default_value_t = 128)]
    scored: usize,
    /// Rows, comma-separated: f32|f16|q8|q4[+bf16], window:N, chunks:N, sim (or one scheme).
    #[arg(long, default_value = Row::DEFAULT)]
    rows: String,
    /// One JSON object per line (a row per length, then one per row and window) instead of tables.
    #[arg(long)]
    json: bool,
}

/// One text's tokens.
pub(crate) struct Text {
    pub(crate) name: String,
    pub(crate) ids: Vec<u32>,
}

pub fn run(a: Args) -> Result<()> {
    let mut model = load_model(&a.model)?.with_attention(AttentionPrecision::Exact);
    let mut rows = Vec::new();
    for name in a.rows.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        rows.extend(Row::parse(name)?);
    }
    anyhow::ensure!(!rows.is_empty(), "no rows to measure (--rows)");
    anyhow::ensure!(a.scored >= 2, "--scored must be at least 2 (a scored token's next token is the text's)");
    let texts = read_texts(&model, &a.text)?;
    let tiles = engram_kernels::flash::supported(model.config.head_dim);
    let layout = KvLayout::of(&model.config);
    let started = Instant::now();
    let mut tables = Vec::new();
    for &len in &a.lengths {
        anyhow::ensure!(len > a.scored, "length {len} must exceed --scored {}", a.scored);
        anyhow::ensure!(
            len <= model.config.max_positions,
            "length {len} is past the model's context of {} tokens",
            model.config.max_positions
        );
        let mut totals: Vec<Scores> = vec![Scores::default(); rows.len()];
        let mut windows = Vec::new();
        for text in texts.iter().filter(|t| t.ids.len() >= len) {
            let (context, scored) = text.ids[..len].split_at(len - a.scored);
            let t = Instant::now();
            let (exact_kv, exact, mass) = exact_path(&model, context, scored, &rows)?;
            eprintln!("[{len} · {}] exact path: {:.1} s", text.name, t.elapsed().as_secs_f64());
            let next: Vec<Option<u32>> = (0..scored.len()).map(|i| scored.get(i + 1).copied()).collect();
            let mut mass = mass.into_iter();
            for (row, total) in rows.iter().zip(totals.iter_mut()) {
                let row_mass = if row.keep_rule().is_some() { mass.next() } else { None };
                if row.precision() != AttentionPrecision::Exact && !tiles {
                    continue; // reported once per table below: the row would equal its exact twin
                }
                let t = Instant::now();
                model.set_attention(row.precision());
                let logits = row.run(&model, &exact_kv, context, scored);
                model.set_attention(AttentionPrecision::Exact);
                let mut s = Scores::compare(&exact, &logits?, model.config.vocab, &next);
                s.mass = row_mass;
                eprintln!(
                    "[{len} · {}] {}: KL {:.3e}, top-1 {:.4} ({:.1} s)",
                    text.name,
                    row.name(),
                    s.mean_kl(),
                    s.top1(),
                    t.elapsed().as_secs_f64()
                );
                if a.json {
                    println!("{}", with(s.json(), json!({"row": row.name(), "context": len, "text": text.name})));
                }
                total.add(&s);
            }
            windows.push(text.name.clone());
        }
        if windows.is_empty() {
            eprintln!("length {len}: no text has {len} tokens; skipped");
            continue;
        }
        tables.push((len, windows, totals));
    }
    let skipped_bf16 = rows.iter().any(|r| r.precision() != AttentionPrecision::Exact) && !tiles;
    for (len, windows, totals) in &tables {
        let summary: Vec<serde_json::Value> = rows
            .iter()
            .zip(totals)
            .filter(|(r, _)| r.precision() == AttentionPrecision::Exact || tiles)
            .map(|(r, s)| {
                with(
                    s.json(),
                    json!({"row": r.name(), "describe": r.describe(), "context": len, "windows": windows, "scored_per_window": a.scored,
                           "kv_vs_f16": r.kv_vs_f16(layout, *len)}),
                )
            })
            .collect();
        if a.json {
            summary.iter().for_each(|r| println!("{r}"));
        } else {
            print_table(*len, windows, a.scored, &summary);
        }
    }
    if !a.json {
        println!(
            "model {} ({} weights), {} threads; reference: f32 KV, exact attention, every key",
            model.source,
            model.weights.main_dtype().name(),
            engram_kernels::num_threads()
        );
        if skipped_bf16 {
            println!("bf16 rows skipped: this CPU has no AMX-BF16 tiles, so bf16 attention runs the exact path (the rows would equal their exact twins)");
        }
        println!("{:.0} s in all", started.elapsed().as_secs_f64());
    }
    Ok(())
}

/// The exact path over one window: the prefilled context (for rows that fork it), the scored
/// tokens' logits, and the attention mass each key-dropping row's keys hold, in row order.
fn exact_path(model: &Model, context: &[u32], scored: &[u32], rows: &[Row]) -> Result<(SeqKv, Vec<f32>, Vec<(f64, usize)>)> {
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 1 << 40);
    let mut kv = SeqKv::new(&pool);
    rows::prefill(model, &mut kv, context)?;
    let rules: Vec<_> = rows.iter().filter_map(Row::keep_rule).collect();
    let mut scoring = kv.fork(kv.len());
    let (logits, mass) = rows::score(model, &mut scoring, scored, &|_| None, &rules)?;
    Ok((kv, logits, mass))
}

/// Reads and tokenizes the texts (the fixture corpus when none is given).
pub(crate) fn read_texts(model: &Model, paths: &[PathBuf]) -> Result<Vec<Text>> {
    if paths.is_empty() {
        let ids = model.tokenizer.encode(engram_tokenizer::FIXTURE_CORPUS, true)?.ids;
        return Ok(vec![Text { name: "fixture-corpus".into(), ids }]);
    }
    paths
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            // Texts carry their own `<s>` where the model's training put one (heldout_text.py).
            let ids = model.tokenizer.encode(&text, false)?.ids;
            let name = p.file_stem().map_or_else(|| p.display().to_string(), |s| s.to_string_lossy().into_owned());
            eprintln!("{name}: {} tokens", ids.len());
            Ok(Text { name, ids })
        })
        .collect()
}

/// `a`'s fields with `b`'s added.
fn with(mut a: serde_json::Value, b: serde_json::Value) -> serde_json::Value {
    if let (Some(a), serde_json::Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

fn print_table(len: usize, windows: &[String], scored: usize, rows: &[serde_json::Value]) {
    println!();
    println!("### Context {len} tokens ({} window(s): {}; last {scored} tokens of each scored)", windows.len(), windows.join(", "));
    println!();
    println!("| row | what | KV vs f16 | mean KL (nats) | top-1 | ppl exact | ppl | Δppl | attention mass kept |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let opt = |v: &serde_json::Value, digits: usize| v.as_f64().map_or("—".to_string(), |x| format!("{x:.digits$}"));
    for r in rows {
        println!(
            "| {} | {} | {} | {:.2e} | {:.4} | {:.3} | {:.3} | {:+.2}% | {} |",
            r["row"].as_str().unwrap_or(""),
            r["describe"].as_str().unwrap_or(""),
            opt(&r["kv_vs_f16"], 3),
            r["mean_kl_nats"].as_f64().unwrap_or(f64::NAN),
            r["top1_agreement"].as_f64().unwrap_or(f64::NAN),
            r["ppl_exact"].as_f64().unwrap_or(f64::NAN),
            r["ppl"].as_f64().unwrap_or(f64::NAN),
            r["ppl_delta_pct"].as_f64().unwrap_or(f64::NAN),
            opt(&r["attention_mass_recalled"], 4),
        );
    }
}

#[cfg(test)]
mod tests;
