//! The offload file's layout on its own, without a model: what the file
//! order and the flush layout do to the reads, and what delayed splits save, over hundreds
//! of decode steps with flushes (the speed rows decode too few tokens to flush once).
//!
//! A synthetic head set (`--layout-shape`, default 2 layers × 8 KV heads × 64) holds a
//! history of clustered keys (64 topics, each token near its topic's centre; topics change
//! every 97 tokens); the prefill's last 32 tokens are read with queries first, as a model's
//! prefill reads them (the calibration of co-retrieval placement); then the index is built
//! once and copied for each variant. Each variant offloads its copy (no cluster cache, so
//! every fetched cluster is read from the file; flushes of `--layout-flush` tokens) and
//! decodes `--layout-steps` tokens whose keys drift away from the prefill's (so clusters
//! grow and split) and whose queries dwell on one topic for 16 steps. Counts, not timings:
//! reads and bytes per step and head, the mean read, split bytes, rows flushed next to their
//! cluster, slack and bytes moved. Deterministic (fixed seeds). `--layout-gaps` adds rows
//! that read through wider gaps (a dual-head region's slack is a page at least: 16 rows of
//! 64-dim f16 K+V), trading bytes for fewer, longer reads.

use anyhow::{Context, Result};
use engram_model::{KvCache, KvRead};
use engram_sparse::{Layout, Method, OffloadConfig, SparseConfig, SparseKv};
use serde_json::json;

use super::Args;

const TOPICS: usize = 64;

struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Roughly normal (Irwin–Hall of 4).
    fn normal(&mut self) -> f32 {
        (self.unit() + self.unit() + self.unit() + self.unit() - 2.0) * 1.7
    }
}

/// One token's keys for every head (`heads × dim`): topic centre plus noise, shifted by
/// `drift` along a fixed direction.
fn key(centres: &[f32], topic: usize, heads: usize, d: usize, drift: f32, rng: &mut Rng) -> Vec<f32> {
    (0..heads * d).map(|i| centres[topic * heads * d + i] + 0.6 * rng.normal() + drift * if i % 2 == 0 { 1.0 } else { -1.0 }).collect()
}

/// The layout rows (module doc).
pub fn run(a: &Args) -> Result<Vec<serde_json::Value>> {
    let dir = a.offload_dir.as_ref().context("--layout-history needs --offload-dir")?;
    let [layers, heads, d] = a.layout_shape[..] else { anyhow::bail!("--layout-shape is LAYERS,HEADS,DIM") };
    let (n, steps) = (a.layout_history, a.layout_steps);
    let mut rng = Rng(0x5EED_0F_1A70);
    let centres: Vec<f32> = (0..TOPICS * heads * d).map(|_| 2.0 * rng.normal()).collect();
    let topic = |t: usize| (t / 97 * 31 + 7) % TOPICS;
    let mut kv = SparseKv::with_shape(layers, heads, d, None);
    kv.reserve(n + steps + 1);
    for layer in 0..layers {
        let mut rng = Rng(0xA11CE + layer as u64);
        for start in (0..n).step_by(1024) {
            let m = (n - start).min(1024);
            let ks: Vec<f32> = (start..start + m).flat_map(|t| key(&centres, topic(t), heads, d, 0.0, &mut rng)).collect();
            let vs: Vec<f32> = (0..ks.len()).map(|_| rng.normal()).collect();
            kv.write(layer, start, &ks, &vs, m);
        }
        // The prefill's last 32 query tokens, read as a prefill reads them.
        let q: Vec<f32> = (n - 32..n).flat_map(|t| key(&centres, topic(t), heads, d, 0.0, &mut rng)).map(|x| x * 0.2).collect();
        let pos: Vec<u32> = (n - 32..n).map(|t| t as u32).collect();
        for h in 0..heads {
            let qh: Vec<f32> = (0..32).flat_map(|i| q[(i * heads + h) * d..(i * heads + h + 1) * d].to_vec()).collect();
            kv.for_each_chunk_of(&KvRead { layer, kv_head: h, queries: &qh, group: 1, positions: &pos }, &mut |_| {});
        }
    }
    let cfg = |eager| SparseConfig {
        method: Method::DynaKv { b_max: Method::B_MAX, eager },
        budget: a.budget.min(n / 4),
        sinks: a.sinks,
        recent: a.recent,
    };
    kv.set_config(Some(cfg(false)));
    kv.build_index();
    let mut rows = Vec::new();
    let gap = OffloadConfig::new(dir.clone(), 0).gap;
    let mut variants: Vec<(String, Layout, bool, bool, usize)> = [
        ("append, index order", Layout::Append, false, false),
        ("append, co-retrieval", Layout::Append, true, false),
        ("dual-head, co-retrieval", Layout::DualHead, true, false),
        ("append, co-retrieval, eager splits", Layout::Append, true, true),
        ("dual-head, co-retrieval, eager splits", Layout::DualHead, true, true),
    ]
    .into_iter()
    .map(|(n, l, c, e)| (n.to_string(), l, c, e, gap))
    .collect();
    // Reading through wider gaps (dual-head slack, neighbours' rows) merges reads for bytes.
    for &g in a.layout_gaps.iter().filter(|&&g| g != gap) {
        variants.push((format!("append, co-retrieval, gap {g}"), Layout::Append, true, false, g));
        variants.push((format!("dual-head, co-retrieval, gap {g}"), Layout::DualHead, true, false, g));
    }
    for (name, layout, co_retrieval, eager, gap) in variants {
        let mut k = if eager {
            let mut k = kv.fork(Some(cfg(true)));
            k.build_index();
            k
        } else {
            kv.fork_with_index()
        };
        let oc = OffloadConfig {
            ram_budget: 0,
            cache_bytes: 0,
            prefetch: false,
            flush: a.layout_flush,
            layout,
            co_retrieval,
            gap,
            ..OffloadConfig::new(dir.clone(), 0)
        };
        anyhow::ensure!(k.offload(oc)?, "nothing to offload");
        let mut rng = Rng(0xDEC0DE);
        for s in 0..steps {
            let t = n + s;
            k.reserve(1);
            let q = key(&centres, topic(n - 1 + s / 16 * 97), heads, d, 0.0, &mut rng);
            for layer in 0..layers {
                let ks = key(&centres, topic(t + s / 3), heads, d, 1.5 * (s as f32 / steps as f32), &mut rng);
                let vs: Vec<f32> = (0..ks.len()).map(|_| rng.normal()).collect();
                k.write(layer, t, &ks, &vs, 1);
                for h in 0..heads {
                    let qh: Vec<f32> = q[h * d..(h + 1) * d].iter().map(|x| x * 0.2).collect();
                    k.for_each_chunk_of(&KvRead { layer, kv_head: h, queries: &qh, group: 1, positions: &[t as u32] }, &mut |_| {});
                }
            }
            if let Some(e) = k.offload_failure() {
                anyhow::bail!("layout bench: {e}");
            }
        }
        let st = k.offload_stats().context("offloaded")?;
        let per = (steps * layers * heads).max(1) as f64;
        let flushed = (st.flushed_in_place_rows + st.flushed_elsewhere_rows).max(1) as f64;
        let row = json!({
            "bench": "sparse-layout", "variant": name, "layout": layout.name(), "co_retrieval": co_retrieval,
            "split": if eager { "eager" } else { "delayed" }, "gap_rows": gap, "history": n, "steps": steps, "flush": a.layout_flush,
            "shape": [layers, heads, d], "budget": cfg(eager).budget,
            "reads_per_head_step": (st.read_ops as f64 / per * 100.0).round() / 100.0,
            "read_bytes_per_head_step": (st.read_bytes as f64 / per).round(),
            "mean_read_bytes": (st.read_bytes as f64 / st.read_ops.max(1) as f64).round(),
            "split_bytes_per_head_step": (st.split_bytes as f64 / per).round(), "split_ops": st.split_ops,
            "flushed_in_place": ((st.flushed_in_place_rows as f64 / flushed) * 1000.0).round() / 1000.0,
            "slack_bytes": st.slack_bytes, "moved_bytes": st.moved_bytes, "written_bytes": st.written_bytes,
            "clusters": k.index_stats().units, "splits": k.index_stats().splits,
        });
        eprintln!("layout {name}: {row}");
        if a.json {
            println!("{row}");
        }
        rows.push(row);
    }
    Ok(rows)
}

/// The layout table.
pub fn print_table(rows: &[serde_json::Value], a: &Args) {
    if rows.is_empty() {
        return;
    }
    let r0 = &rows[0];
    println!();
    println!(
        "### Offload file layout (synthetic keys, shape {}, history {}, {} decode steps, flush {}, budget {}, no cluster cache)",
        r0["shape"], r0["history"], r0["steps"], a.layout_flush, r0["budget"]
    );
    println!();
    println!("| variant | reads / head·step | KiB read / head·step | mean read | split KiB / head·step | splits | flushed next to its cluster | slack | bytes moved |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    for r in rows {
        println!(
            "| {} | {:.2} | {:.1} | {:.1} KiB | {:.2} | {} | {:.1}% | {:.1} MiB | {} |",
            r["variant"].as_str().unwrap_or("?"),
            f(&r["reads_per_head_step"]),
            f(&r["read_bytes_per_head_step"]) / 1024.0,
            f(&r["mean_read_bytes"]) / 1024.0,
            f(&r["split_bytes_per_head_step"]) / 1024.0,
            r["splits"],
            100.0 * f(&r["flushed_in_place"]),
            f(&r["slack_bytes"]) / (1 << 20) as f64,
            r["moved_bytes"],
        );
    }
}
