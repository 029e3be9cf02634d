//! Quality of sparse retrieval on the long-context model (module doc of `sparse.rs`).

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use engram_model::{AttentionPrecision, KvCache, Model};
use engram_sparse::{Method, SparseConfig, SparseKv};
use serde_json::json;

use super::{with, Args};
use crate::fidelity::measure::Scores;
use crate::fidelity::read_texts;
use crate::fidelity::rows::{prefill, score, Scorable};

impl Scorable for SparseKv {
    fn reserve_tokens(&mut self, n: usize) -> Result<()> {
        self.reserve(n);
        Ok(())
    }
    fn stored(&self) -> usize {
        self.len()
    }
    fn as_cache(&mut self) -> &mut dyn KvCache {
        self
    }
}

/// One (method, budget)'s sums over windows of one length.
struct Acc {
    method: Method,
    budget: usize,
    scores: Scores,
    /// Per layer: sum of mean output errors weighted by query heads, and the heads.
    layer_err: Vec<(f64, usize)>,
    attended: (f64, usize),
    /// Mass recalled over the last quarter of the decoded tokens: (sum, query heads).
    late_mass: (f64, usize),
    build_ms: f64,
    clusters: usize,
    splits: usize,
    /// Rows a disk-resident cache would read: for retrieval, and only to split.
    fetched_tokens: usize,
    split_fetch_tokens: usize,
}

pub fn run(a: &Args, path: &Path, methods: &[Method]) -> Result<()> {
    let model = Model::load(path)?.with_attention(AttentionPrecision::Exact);
    anyhow::ensure!(a.scored >= 2, "--scored must be at least 2");
    let texts = read_texts(&model, &a.text)?;
    let layers = model.config.num_layers;
    let started = Instant::now();
    for &len in &a.lengths {
        anyhow::ensure!(
            len > a.scored && len <= model.config.max_positions,
            "length {len}: must exceed --scored and fit the model's context"
        );
        let mut accs: Vec<Acc> = Vec::new();
        let mut windows = Vec::new();
        for text in texts.iter().filter(|t| t.ids.len() >= len) {
            let (context, scored) = text.ids[..len].split_at(len - a.scored);
            let t = Instant::now();
            let mut base = SparseKv::new(&model.config, None);
            base.reserve(len);
            prefill(&model, &mut base, context)?;
            let (exact, _) = score(&model, &mut base.fork(None), scored, &|_| None, &[])?;
            eprintln!("[{len} · {}] exact path: {:.1} s", text.name, t.elapsed().as_secs_f64());
            let next: Vec<Option<u32>> = (0..scored.len()).map(|i| scored.get(i + 1).copied()).collect();
            for &m in methods {
                for &budget in &a.budgets {
                    let cfg = SparseConfig { method: m, budget, sinks: a.sinks, recent: a.recent };
                    let mut kv = base.fork(Some(cfg)).with_probe();
                    let t = Instant::now();
                    kv.build_index();
                    let build_ms = t.elapsed().as_secs_f64() * 1e3;
                    // Decoded in two calls (the same steps as one): the probe's sums after the
                    // first three quarters give the mass recalled over the last quarter alone,
                    // where clusters built at prefill have aged the most.
                    let early = scored.len() - scored.len() / 4;
                    let (mut logits, _) = score(&model, &mut kv, &scored[..early], &|_| None, &[])?;
                    let (m0, _, h0) = kv.probe().expect("probing").overall();
                    logits.extend(score(&model, &mut kv, &scored[early..], &|_| None, &[])?.0);
                    let mut s = Scores::compare(&exact, &logits, model.config.vocab, &next);
                    let probe = kv.probe().expect("probing");
                    let (mass, _, heads) = probe.overall();
                    let late = (mass * heads as f64 - m0 * h0 as f64, heads - h0);
                    s.mass = Some((mass * heads as f64, heads));
                    let per_layer = probe.per_layer();
                    let stats = kv.index_stats();
                    eprintln!(
                        "[{len} · {}] {} @{budget}: KL {:.3e}, mass {mass:.4}, Δppl {:+.2}%, build {build_ms:.0} ms",
                        text.name,
                        m.name(),
                        s.mean_kl(),
                        (s.ppl_approx() / s.ppl_exact() - 1.0) * 100.0
                    );
                    if a.json {
                        let errs: Vec<f64> = per_layer.iter().map(|e| e.1).collect();
                        println!(
                            "{}",
                            with(
                                s.json(),
                                json!({"bench": "sparse-quality", "method": m.name(), "budget": budget, "context": len, "text": text.name, "out_rel_err_per_layer": errs})
                            )
                        );
                    }
                    let acc = match accs.iter_mut().find(|x| x.method == m && x.budget == budget) {
                        Some(x) => x,
                        None => {
                            accs.push(Acc {
                                method: m,
                                budget,
                                scores: Scores::default(),
                                layer_err: vec![(0.0, 0); layers],
                                attended: (0.0, 0),
                                late_mass: (0.0, 0),
                                build_ms: 0.0,
                                clusters: 0,
                                splits: 0,
                                fetched_tokens: 0,
                                split_fetch_tokens: 0,
                            });
                            accs.last_mut().expect("just pushed")
                        }
                    };
                    acc.scores.add(&s);
                    for (e, p) in acc.layer_err.iter_mut().zip(&per_layer) {
                        e.0 += p.1 * p.2 as f64;
                        e.1 += p.2;
                    }
                    let (mean, reads) = kv.mean_attended();
                    acc.attended.0 += mean * reads as f64;
                    acc.attended.1 += reads;
                    acc.late_mass.0 += late.0;
                    acc.late_mass.1 += late.1;
                    acc.build_ms += build_ms;
                    acc.clusters += stats.units;
                    acc.splits += stats.splits;
                    acc.fetched_tokens += stats.fetched_tokens;
                    acc.split_fetch_tokens += stats.split_fetch_tokens;
                }
            }
            windows.push(text.name.clone());
        }
        if windows.is_empty() {
            eprintln!("length {len}: no text has {len} tokens; skipped");
            continue;
        }
        let rows: Vec<serde_json::Value> = accs
            .iter()
            .map(|x| {
                let errs: Vec<f64> = x.layer_err.iter().map(|(s, n)| s / (*n).max(1) as f64).collect();
                let w = windows.len() as f64;
                with(
                    x.scores.json(),
                    json!({"bench": "sparse-quality-summary", "method": x.method.name(), "budget": x.budget, "context": len, "windows": windows,
                           "scored_per_window": a.scored, "out_rel_err_per_layer": errs,
                           "out_rel_err_mean": errs.iter().sum::<f64>() / errs.len().max(1) as f64,
                           "keys_attended_mean": x.attended.0 / x.attended.1.max(1) as f64,
                           "attention_mass_recalled_last_quarter": x.late_mass.0 / x.late_mass.1.max(1) as f64,
                           "fetched_rows_per_step": x.fetched_tokens as f64 / (w * a.scored as f64),
                           "index_build_ms_mean": x.build_ms / w, "clusters_per_window": x.clusters as f64 / w, "splits_per_window": x.splits as f64 / w,
                           "fetched_rows_per_window": x.fetched_tokens as f64 / w, "split_fetch_rows_per_window": x.split_fetch_tokens as f64 / w}),
                )
            })
            .collect();
        if a.json {
            rows.iter().for_each(|r| println!("{r}"));
        } else {
            print_table(len, &windows, a, &rows);
        }
    }
    if !a.json {
        println!(
            "quality: model {}, reference: exact attention over the same f16 KV; {:.0} s",
            model.source,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

fn print_table(len: usize, windows: &[String], a: &Args, rows: &[serde_json::Value]) {
    println!();
    println!(
        "### Sparse retrieval, window {len} tokens ({} window(s): {}; last {} decoded and scored; sinks {}, recent {})",
        windows.len(),
        windows.join(", "),
        a.scored,
        a.sinks,
        a.recent
    );
    println!();
    println!("| method | budget | keys attended | mass recalled | mass, last ¼ | out rel err (mean; per layer) | mean KL | top-1 | Δppl | index build | clusters | splits | rows fetched / step | rows read to split |");
    println!("|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let per: Vec<String> = r["out_rel_err_per_layer"]
            .as_array()
            .map_or(Vec::new(), |v| v.iter().map(|x| format!("{:.3}", x.as_f64().unwrap_or(f64::NAN))).collect());
        println!(
            "| {} | {} | {:.0} | {:.4} | {:.4} | {:.4}; {} | {:.2e} | {:.4} | {:+.2}% | {:.0} ms | {:.0} | {:.0} | {:.0} | {:.0} |",
            r["method"].as_str().unwrap_or(""),
            r["budget"],
            r["keys_attended_mean"].as_f64().unwrap_or(f64::NAN),
            r["attention_mass_recalled"].as_f64().unwrap_or(f64::NAN),
            r["attention_mass_recalled_last_quarter"].as_f64().unwrap_or(f64::NAN),
            r["out_rel_err_mean"].as_f64().unwrap_or(f64::NAN),
            per.join(" "),
            r["mean_kl_nats"].as_f64().unwrap_or(f64::NAN),
            r["top1_agreement"].as_f64().unwrap_or(f64::NAN),
            r["ppl_delta_pct"].as_f64().unwrap_or(f64::NAN),
            r["index_build_ms_mean"].as_f64().unwrap_or(f64::NAN),
            r["clusters_per_window"].as_f64().unwrap_or(f64::NAN),
            r["splits_per_window"].as_f64().unwrap_or(f64::NAN),
            r["fetched_rows_per_step"].as_f64().unwrap_or(f64::NAN),
            r["split_fetch_rows_per_window"].as_f64().unwrap_or(f64::NAN),
        );
    }
}
