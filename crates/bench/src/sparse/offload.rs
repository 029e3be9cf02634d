//! Offloaded DynaKV decode: per history, copies of the speed run's
//! in-RAM cache (same keys, same index) are offloaded to a file in `--offload-dir` and decode
//! the same tokens with the file dropped from the page cache (`posix_fadvise(DONTNEED)`)
//! before every step, so each step's misses read the disk. Variants, side by side: the
//! cluster-aligned cache and LRU at equal size (reader thread), with and without the
//! layer-ahead prefetch, the three read backends (reader thread, inline `pread`, `io_uring`),
//! a cluster cache twice as large, and splitting on every flag (`eager`, its own index) for
//! the split I/O the delay saves; the file in index order (`index`) against co-retrieval
//! placement (the default); static and local update offloaded (`static`, `local`, their own
//! index). A variant may name its own token budget (`static:3072`), to compare at equal
//! recall. Each row reports the attention mass its method recalls (probed in RAM on a copy
//! decoding the first tokens, f64 against every key).
//! Offload is lossless, so every variant decodes the tokens the in-RAM cache of its method
//! decodes.

use std::time::Instant;

use anyhow::{Context, Result};
use engram_model::{Logits, Model, SeqStep};
use engram_sparse::{Backend, Method, OffloadConfig, Policy, SparseConfig, SparseKv};
use serde_json::json;

use super::speed::rss_bytes;
use super::Args;

/// One offloaded run: how its cache is configured.
#[derive(Clone, Copy)]
struct Variant {
    name: &'static str,
    policy: Policy,
    backend: Backend,
    eager: bool,
    prefetch: bool,
    /// The cluster cache is `--cache-mib` times this.
    cache_scale: usize,
    /// Clusters in the file by co-retrieval (else index order).
    co_retrieval: bool,
    /// Another method than DynaKV (its own index, built on a copy).
    method: Option<Method>,
    /// Another token budget than `--budget` (its own index).
    budget: Option<usize>,
}

impl Variant {
    /// Whether this variant needs its own index (else it copies the speed run's).
    fn own_index(&self) -> bool {
        self.eager || self.method.is_some() || self.budget.is_some()
    }
}

fn variants(names: &[String]) -> Result<Vec<Variant>> {
    let base = Variant {
        name: "cluster",
        policy: Policy::ClusterAligned,
        backend: Backend::Thread,
        eager: false,
        prefetch: true,
        cache_scale: 1,
        co_retrieval: true,
        method: None,
        budget: None,
    };
    names
        .iter()
        .map(|n| {
            let (n, budget) = match n.trim().split_once(':') {
                Some((n, b)) => (n, Some(b.parse::<usize>().with_context(|| format!("offload variant {n}: budget {b:?}"))?)),
                None => (n.trim(), None),
            };
            let v = match n {
                "cluster" => base,
                "noprefetch" => Variant { name: "noprefetch", prefetch: false, ..base },
                "lru" => Variant { name: "lru", policy: Policy::Lru, ..base },
                "lru-noprefetch" => Variant { name: "lru-noprefetch", policy: Policy::Lru, prefetch: false, ..base },
                "inline" => Variant { name: "inline", backend: Backend::Inline, ..base },
                "uring" => Variant { name: "uring", backend: Backend::Uring, ..base },
                "cache2x" => Variant { name: "cache2x", cache_scale: 2, ..base },
                "eager" => Variant { name: "eager", eager: true, ..base },
                "index" => Variant { name: "index", co_retrieval: false, ..base },
                "static" => Variant { name: "static", method: Some(Method::Static), ..base },
                "local" => Variant { name: "local", method: Some(Method::parse("local").map_err(anyhow::Error::msg)?), ..base },
                other => anyhow::bail!(
                    "unknown offload variant {other:?} (cluster, noprefetch, lru, lru-noprefetch, inline, uring, cache2x, eager, index, static, local; NAME:BUDGET for another token budget)"
                ),
            };
            Ok(Variant { budget, ..v })
        })
        .collect()
}

/// The offloaded rows for history `h`, from `kv` (in RAM, index built, DynaKV).
pub fn rows(a: &Args, model: &Model, kv: &SparseKv, h: usize) -> Result<Vec<serde_json::Value>> {
    let Some(dir) = &a.offload_dir else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for v in variants(&a.offload_variants)? {
        let t = Instant::now();
        let base = kv.config().context("a sparse cache")?;
        let cfg = SparseConfig {
            method: v.method.unwrap_or(if v.eager { Method::DynaKv { b_max: Method::B_MAX, eager: true } } else { base.method }),
            budget: v.budget.unwrap_or(base.budget),
            ..base
        };
        let mut k = if v.own_index() {
            let mut k = kv.fork(Some(cfg));
            k.build_index();
            k
        } else {
            kv.fork_with_index()
        };
        let fork_s = t.elapsed().as_secs_f64();
        let (recall, out_err) = recall(model, &k, a.decode.min(RECALL_STEPS))?;
        let oc = OffloadConfig {
            ram_budget: a.ram_mib << 20,
            cache_bytes: (a.cache_mib * v.cache_scale) << 20,
            policy: v.policy,
            backend: v.backend,
            prefetch: v.prefetch,
            co_retrieval: v.co_retrieval,
            ..OffloadConfig::new(dir.clone(), model.fingerprint.0)
        };
        let t = Instant::now();
        let done = k.offload(oc).with_context(|| format!("offloading the {h}-token history to {}", dir.display()))?;
        anyhow::ensure!(done, "history {h}: {} MiB of KV fits --ram-mib {}: nothing to offload", k.kv_bytes() >> 20, a.ram_mib);
        let offload_s = t.elapsed().as_secs_f64();
        let file_bytes = std::fs::metadata(k.offload_path().context("offloaded")?)?.len();
        let mut tok = 42u32;
        let mut secs = 0.0;
        let mut ram_max = 0usize;
        for _ in 0..a.decode {
            k.evict_page_cache()?;
            k.reserve(1);
            let slot = k.len();
            let t = Instant::now();
            let logits = model.forward(&mut [SeqStep::new(&[tok], slot, &mut k, Logits::Last)])?.remove(0);
            secs += t.elapsed().as_secs_f64();
            tok = engram_engine::argmax(&logits) as u32;
            ram_max = ram_max.max(k.ram_kv_bytes());
        }
        let s = k.offload_stats().context("offloaded")?;
        let n = a.decode.max(1) as f64;
        let rows_looked = (s.cache.hit_rows + s.cache.miss_rows).max(1) as f64;
        let row = json!({
            "bench": "sparse-offload", "model": model.source, "history": h, "variant": v.name,
            "method": cfg.method.name(), "budget": cfg.budget, "recall": round3(recall), "output_rel_error": round3(out_err),
            "placement": if v.co_retrieval { "co-retrieval" } else { "index" },
            "policy": v.policy.name(), "reader": s.backend.unwrap_or(v.backend).name(), "split": if v.eager { "eager" } else { "delayed" },
            "prefetch": v.prefetch, "prefetch_bytes_per_token": (s.prefetch_bytes as f64 / n).round(),
            "prefetched_clusters": s.cache.prefetched, "prefetch_hits": s.cache.prefetch_hits, "prefetch_unused": s.cache.prefetch_unused,
            "prefetch_waits": s.prefetch_waits,
            "threads": engram_kernels::num_threads(), "decode": a.decode, "tok_s": round2(n / secs),
            "disk_bytes_per_token": (s.read_bytes as f64 / n).round(), "split_bytes_per_token": (s.split_bytes as f64 / n).round(),
            "split_bytes": s.split_bytes, "read_ops_per_token": (s.read_ops as f64 / n).round(),
            "mean_read_bytes": (s.read_bytes as f64 / s.read_ops.max(1) as f64).round(),
            "cache_hit_rate_rows": round3(s.cache.hit_rows as f64 / rows_looked),
            "cache_hit_rate_clusters": round3(s.cache.hits as f64 / (s.cache.hits + s.cache.misses).max(1) as f64),
            "cache_mib": a.cache_mib * v.cache_scale, "kv_bytes": k.kv_bytes(), "kv_bytes_in_ram": ram_max,
            "kv_ram_fraction": round3(ram_max as f64 / k.kv_bytes() as f64), "slot_table_bytes": k.slot_table_bytes(),
            "file_bytes": file_bytes, "rss_bytes": rss_bytes(), "offload_s": round2(offload_s), "fork_s": round2(fork_s),
        });
        eprintln!(
            "history {h} offload {}: recall {recall:.3}, {:.2} tok/s, {:.0} KiB read per token in {:.0} reads, hit rate {:.3}, prefetch hits {}/{}",
            v.name,
            n / secs,
            s.read_bytes as f64 / n / 1024.0,
            s.read_ops as f64 / n,
            s.cache.hit_rows as f64 / rows_looked,
            s.cache.prefetch_hits,
            s.cache.prefetched
        );
        drop(k);
        if a.json {
            println!("{row}");
        }
        out.push(row);
    }
    Ok(out)
}

/// Decoded tokens whose reads are probed for recall (in RAM, on a copy).
const RECALL_STEPS: usize = 2;

/// Mean attention mass recalled and attention-output relative error over `steps` decoded
/// tokens of an in-RAM copy of `kv` (probed: f64, every visible key).
fn recall(model: &Model, kv: &SparseKv, steps: usize) -> Result<(f64, f64)> {
    let mut p = kv.fork_with_index().with_probe();
    let mut tok = 42u32;
    for _ in 0..steps.max(1) {
        p.reserve(1);
        let slot = p.len();
        let logits = model.forward(&mut [SeqStep::new(&[tok], slot, &mut p, Logits::Last)])?.remove(0);
        tok = engram_engine::argmax(&logits) as u32;
    }
    let (mass, err, _) = p.probe().context("probed")?.overall();
    Ok((mass, err))
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The offload table.
pub fn print_table(rows: &[serde_json::Value], a: &Args) {
    if rows.is_empty() {
        return;
    }
    println!();
    println!(
        "### Offloaded DynaKV (budget {}, RAM budget {} MiB, cluster cache {} MiB unless named), file dropped from the page cache before every step, {} decoded tokens",
        a.budget, a.ram_mib, a.cache_mib, a.decode
    );
    println!();
    println!("| history | variant | method | budget | recall | placement | reader | prefetch | cache | tok/s | disk KiB/token | of which prefetch | split KiB/token | reads/token | mean read | hit rate (rows) | hit rate (clusters) | prefetch hits / made | KV in RAM | of full KV | RSS |");
    println!("|---:|---|---|---:|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let f = |v: &serde_json::Value| v.as_f64().unwrap_or(f64::NAN);
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {:.3} | {} | {} | {} | {} MiB | {:.2} | {:.0} | {:.0} | {:.1} | {} | {:.1} KiB | {:.3} | {:.3} | {} / {} | {:.0} MiB | {:.1}% | {:.0} MiB |",
            r["history"],
            r["variant"].as_str().unwrap_or("?"),
            r["method"].as_str().unwrap_or("?"),
            r["budget"],
            f(&r["recall"]),
            r["placement"].as_str().unwrap_or("?"),
            r["reader"].as_str().unwrap_or("?"),
            if r["prefetch"].as_bool().unwrap_or(false) { "on" } else { "off" },
            r["cache_mib"],
            f(&r["tok_s"]),
            f(&r["disk_bytes_per_token"]) / 1024.0,
            f(&r["prefetch_bytes_per_token"]) / 1024.0,
            f(&r["split_bytes_per_token"]) / 1024.0,
            r["read_ops_per_token"],
            f(&r["mean_read_bytes"]) / 1024.0,
            f(&r["cache_hit_rate_rows"]),
            f(&r["cache_hit_rate_clusters"]),
            r["prefetch_hits"],
            r["prefetched_clusters"],
            f(&r["kv_bytes_in_ram"]) / (1 << 20) as f64,
            100.0 * f(&r["kv_ram_fraction"]),
            f(&r["rss_bytes"]) / (1 << 20) as f64,
        );
    }
}
