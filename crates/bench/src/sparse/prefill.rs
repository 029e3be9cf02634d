//! Bounded prefill against the old path (`--offload-prefill after|bounded`, with
//! `--offload-dir`): a history written into a DynaKV cache whose KV past `--ram-mib` goes to
//! the offload file, either after the whole history is in RAM (`after`: prefill in RAM, build
//! the index, offload) or while it is written (`bounded`: `SparseKv::offload_streaming`, the
//! index built segment by segment). Per history: the peak KV bytes held in RAM, the process's
//! peak RSS (VmHWM; run one mode per process, histories ascending), the time to write, index
//! and offload the history, and DynaKV decode tok/s from the file.
//!
//! The history is the speed bench's: 512 real tokens prefilled, the rest jittered copies of
//! their keys and values written straight into the cache (`speed.rs`), so what is measured is
//! the cache's storage path, not the prefill's attention.

use std::time::Instant;

use anyhow::{Context, Result};
use engram_model::Model;
use engram_sparse::{OffloadConfig, SparseConfig, SparseKv};
use serde_json::json;

use super::speed::{decode_alternating, fill, rss_bytes, rss_peak_bytes, Other};
use super::Args;

/// One history through the path `mode` names (`after` or `bounded`): its row.
pub fn row(a: &Args, model: &Model, base: &SparseKv, cfg: SparseConfig, h: usize, mode: &str) -> Result<serde_json::Value> {
    let c = &model.config;
    let dir = a.offload_dir.as_ref().context("--offload-prefill needs --offload-dir")?;
    let oc = OffloadConfig {
        ram_budget: a.ram_mib << 20,
        cache_bytes: a.cache_mib << 20,
        ..OffloadConfig::new(dir.clone(), model.fingerprint.0)
    };
    let t = Instant::now();
    let mut kv = base.fork(Some(cfg));
    match mode {
        "bounded" => kv.offload_streaming(oc.clone()).with_context(|| format!("bounded prefill into {}", dir.display()))?,
        "after" => kv.reserve(h + 2 * a.decode + 2 - kv.len()),
        _ => anyhow::bail!("--offload-prefill {mode:?}: after or bounded"),
    }
    fill(&mut kv, c.num_layers, c.num_kv_heads, c.head_dim, h);
    let rss_written = (rss_bytes(), rss_peak_bytes());
    kv.build_index();
    let rss_indexed = (rss_bytes(), rss_peak_bytes());
    if mode == "after" {
        kv.offload(oc).with_context(|| format!("offloading the {h}-token history to {}", dir.display()))?;
    }
    eprintln!(
        "history {h} ({mode}): RSS / peak after writing {} / {} MiB, after the index {} / {} MiB, after the offload {} / {} MiB",
        rss_written.0 >> 20,
        rss_written.1 >> 20,
        rss_indexed.0 >> 20,
        rss_indexed.1 >> 20,
        rss_bytes() >> 20,
        rss_peak_bytes() >> 20
    );
    if let Some(e) = kv.offload_failure() {
        anyhow::bail!("history {h}: {e}");
    }
    let write_s = t.elapsed().as_secs_f64();
    let (rss_peak, kv_peak) = (rss_peak_bytes(), kv.peak_ram_kv_bytes());
    let s0 = kv.offload_stats().unwrap_or_default();
    let (_, tok_s) = decode_alternating(model, &mut kv, a.decode, Other::Nothing)?;
    let s = kv.offload_stats().unwrap_or_default();
    // Per decoded token (the untimed first step included): what the file layout costs.
    let steps = (a.decode + 1) as f64;
    let (kib_token, reads_token) = ((s.read_bytes - s0.read_bytes) as f64 / 1024.0 / steps, (s.read_ops - s0.read_ops) as f64 / steps);
    let row = json!({
        "bench": "sparse-prefill", "model": model.source, "history": h, "mode": mode, "threads": engram_kernels::num_threads(),
        "ram_budget_bytes": a.ram_mib << 20, "kv_bytes": kv.kv_bytes(), "peak_kv_bytes_in_ram": kv_peak,
        "kv_bytes_in_ram_after": kv.ram_kv_bytes(), "rss_peak_bytes": rss_peak, "write_index_offload_s": (write_s * 100.0).round() / 100.0,
        "written_bytes": s.written_bytes, "full_read_bytes": s.full_bytes, "dynakv_tok_s": (tok_s * 100.0).round() / 100.0,
        "offloaded": kv.is_offloaded(), "read_kib_per_token": kib_token.round(), "reads_per_token": reads_token.round(),
    });
    eprintln!(
        "history {h} ({mode}): peak KV in RAM {} MiB, VmHWM {} MiB, {write_s:.1} s, dynakv {tok_s:.2} tok/s",
        kv_peak >> 20,
        rss_peak >> 20
    );
    Ok(row)
}

/// The rows as a markdown table.
pub fn print_table(rows: &[serde_json::Value], a: &Args) {
    if rows.is_empty() {
        return;
    }
    let mib = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0) / (1 << 20) as f64;
    println!();
    println!("### Prefill to disk: offloaded after vs bounded (RAM budget {} MiB, cluster cache {} MiB)", a.ram_mib, a.cache_mib);
    println!();
    println!("| history | path | full KV | peak KV in RAM | KV in RAM after | peak RSS (VmHWM) | write + index + offload | DynaKV tok/s | KiB read / token | reads / token |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        println!(
            "| {} | {} | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.0} MiB | {:.1} s | {:.2} | {} | {} |",
            r["history"],
            r["mode"].as_str().unwrap_or("?"),
            mib(&r["kv_bytes"]),
            mib(&r["peak_kv_bytes_in_ram"]),
            mib(&r["kv_bytes_in_ram_after"]),
            mib(&r["rss_peak_bytes"]),
            r["write_index_offload_s"].as_f64().unwrap_or(f64::NAN),
            r["dynakv_tok_s"].as_f64().unwrap_or(f64::NAN),
            r["read_kib_per_token"],
            r["reads_per_token"],
        );
    }
}
