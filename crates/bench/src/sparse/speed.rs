//! Decode speed at depth, exact vs DynaKV on the same cache (module doc of `sparse.rs`).
//!
//! A history of `H >= 512` tokens: the first 512 are prefilled for real (once, then copied); the rest are
//! copies of those keys and values (each scaled by `1 + 0.05·noise`, keys not re-rotated)
//! written straight into the cache, since prefilling 32K tokens of a 1B model takes many
//! minutes here and random weights make the values meaningless anyway: the cost of a decode
//! step does not depend on what the keys say, only on how many there are (and, for DynaKV,
//! on the cluster count, which follows the length). Then the index is built (timed) and
//! `decode` exact steps and `decode` DynaKV steps are timed alternately on the same cache.

use std::path::Path;
use std::time::Instant;

use anyhow::Result;
use engram_model::{AttentionPrecision, KvCache, Logits, Model, SeqStep};
use engram_sparse::{Method, SparseConfig, SparseKv};
use serde_json::json;

use super::Args;

/// Real tokens prefilled before the history is filled with copies.
const REAL: usize = 512;

pub fn run(a: &Args, path: &Path) -> Result<()> {
    let model = Model::load(path)?.with_attention(AttentionPrecision::Exact);
    let c = &model.config;
    let mut rows = Vec::new();
    let mut offloaded = Vec::new();
    for &h in &a.histories {
        anyhow::ensure!(
            h >= REAL && h + 2 * a.decode + 2 <= c.max_positions,
            "history {h} (+ decoded tokens) must be at least {REAL} and fit the model's context of {}",
            c.max_positions
        );
    }
    // The real tokens are prefilled once; every history starts from a copy of them.
    let t = Instant::now();
    let mut base = SparseKv::new(c, None);
    base.reserve(REAL);
    let real: Vec<u32> = (0..REAL as u32).map(|i| 10 + (i * 7919) % (c.vocab as u32 - 10)).collect();
    for part in real.chunks(256) {
        let slot = base.len();
        model.forward(&mut [SeqStep::new(part, slot, &mut base, Logits::None)])?;
    }
    eprintln!("prefilled {REAL} real tokens in {:.1} s", t.elapsed().as_secs_f64());
    let cfg =
        SparseConfig { method: Method::DynaKv { b_max: Method::B_MAX, eager: false }, budget: a.budget, sinks: a.sinks, recent: a.recent };
    if let Some(mode) = &a.offload_prefill {
        let mut rows = Vec::new();
        for &h in &a.histories {
            let row = super::prefill::row(a, &model, &base, cfg, h, mode)?;
            if a.json {
                println!("{row}");
            }
            rows.push(row);
        }
        if !a.json {
            super::prefill::print_table(&rows, a);
        }
        return Ok(());
    }
    for &h in &a.histories {
        let t = Instant::now();
        let mut kv = base.fork(None);
        kv.reserve(h + 2 * a.decode + 2 - REAL);
        fill(&mut kv, c.num_layers, c.num_kv_heads, c.head_dim, h);
        eprintln!("history {h}: filled in {:.1} s", t.elapsed().as_secs_f64());
        kv.set_config(Some(cfg));
        let t = Instant::now();
        kv.build_index();
        let build_s = t.elapsed().as_secs_f64();
        let other = if a.ab_select {
            Other::ReferenceSelection
        } else if a.no_exact {
            Other::Nothing
        } else {
            Other::Exact
        };
        let (exact, sparse) = decode_alternating(&model, &mut kv, a.decode, other)?;
        let (attended, _) = kv.mean_attended();
        let row = json!({
            "bench": "sparse-speed", "model": model.source, "history": h, "threads": engram_kernels::num_threads(),
            "exact_tok_s": if other == Other::Exact { round2(exact) } else { f64::NAN },
            "reference_select_tok_s": if other == Other::ReferenceSelection { round2(exact) } else { f64::NAN },
            "dynakv_tok_s": round2(sparse), "speedup": round2(sparse / exact),
            "budget": a.budget, "keys_attended_mean": attended.round(), "index_build_s": round2(build_s),
            "clusters": kv.index_stats().units, "kv_bytes": kv.kv_bytes(), "kv_bytes_in_ram": kv.kv_bytes(), "rss_bytes": rss_bytes(),
        });
        eprintln!("history {h}: {} {exact:.2} tok/s, dynakv {sparse:.2} tok/s, index {build_s:.1} s", other.name());
        if a.json {
            println!("{row}");
        }
        rows.push(row);
        offloaded.extend(super::offload::rows(a, &model, &kv, h)?);
    }
    if !a.json {
        print_table(&rows, a);
        super::offload::print_table(&offloaded, a);
    }
    Ok(())
}

/// Writes copies of the stored tokens' keys and values (jittered) until `h` are stored. A
/// cache in RAM must have room for them reserved; one streaming to disk reserves chunk by
/// chunk (it holds only its budget; reserving is from the fullest layer, so a cache in RAM
/// reserving per chunk would double its room once the first layer is full).
pub fn fill(kv: &mut SparseKv, layers: usize, heads: usize, d: usize, h: usize) {
    let width = heads * d;
    let real = kv.len();
    if real >= h {
        return;
    }
    let mut noise = 0x9E37_79B9_7F4A_7C15u64;
    for layer in 0..layers {
        let (mut k, mut v) = (vec![0f32; real * width], vec![0f32; real * width]);
        kv.for_each_chunk(layer, &mut |ch| {
            for (data, out) in [(ch.keys, &mut k), (ch.values, &mut v)] {
                let rb = data.elem.row_bytes(d);
                for hh in 0..heads {
                    for t in 0..real {
                        let row = hh * ch.capacity + t;
                        data.elem.decode_row(&data.bytes[row * rb..(row + 1) * rb], &mut out[t * width + hh * d..t * width + (hh + 1) * d]);
                    }
                }
            }
        });
        let mut pos = real;
        while pos < h {
            let n = (h - pos).min(1024);
            let (mut kb, mut vb) = (Vec::with_capacity(n * width), Vec::with_capacity(n * width));
            for t in pos..pos + n {
                let src = t % real;
                for (buf, from) in [(&mut kb, &k), (&mut vb, &v)] {
                    buf.extend(from[src * width..(src + 1) * width].iter().map(|x| {
                        noise ^= noise << 13;
                        noise ^= noise >> 7;
                        noise ^= noise << 17;
                        x * (1.0 + 0.05 * ((noise >> 40) as f32 / (1u64 << 23) as f32 - 1.0))
                    }));
                }
            }
            if kv.is_offloaded() {
                kv.reserve(n);
            }
            kv.write(layer, pos, &kb, &vb, n);
            pos += n;
        }
    }
}

/// What the DynaKV steps of a speed run alternate with.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Other {
    /// Exact attention steps (the cache read whole).
    Exact,
    /// DynaKV steps choosing clusters the way first written (the same choice).
    ReferenceSelection,
    /// Nothing: DynaKV steps only.
    Nothing,
}

impl Other {
    fn name(self) -> &'static str {
        match self {
            Other::Exact => "exact",
            Other::ReferenceSelection => "dynakv (reference selection)",
            Other::Nothing => "-",
        }
    }
}

/// Decodes `2n` tokens alternating `other` steps and DynaKV steps on the same cache (after one
/// untimed step of each), so the machine's drift falls on both alike; tokens per second of
/// each (`other`'s is NaN for [`Other::Nothing`], where only the `n + 1` DynaKV steps run).
pub fn decode_alternating(model: &Model, kv: &mut SparseKv, n: usize, other: Other) -> Result<(f64, f64)> {
    let mut tok = 42u32;
    let mut secs = [0f64; 2];
    for i in 0..2 * (n + 1) {
        let sparse = i % 2 == 1;
        if !sparse && other == Other::Nothing {
            continue;
        }
        kv.set_bypass(!sparse && other == Other::Exact);
        engram_sparse::clusters::set_reference_selection(!sparse && other == Other::ReferenceSelection);
        kv.reserve(1);
        let slot = kv.len();
        let t = Instant::now();
        let logits = model.forward(&mut [SeqStep::new(&[tok], slot, kv, Logits::Last)])?.remove(0);
        if i >= 2 {
            secs[sparse as usize] += t.elapsed().as_secs_f64();
        }
        tok = engram_engine::argmax(&logits) as u32;
    }
    kv.set_bypass(false);
    engram_sparse::clusters::set_reference_selection(false);
    Ok((if other == Other::Nothing { f64::NAN } else { n as f64 / secs[0] }, n as f64 / secs[1]))
}

/// This process's resident set, from /proc (0 where unavailable).
pub fn rss_bytes() -> u64 {
    proc_status_bytes("VmRSS:")
}

/// This process's peak resident set so far (VmHWM), from /proc (0 where unavailable).
pub fn rss_peak_bytes() -> u64 {
    proc_status_bytes("VmHWM:")
}

fn proc_status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()))
        .map_or(0, |kib| kib * 1024)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn print_table(rows: &[serde_json::Value], a: &Args) {
    println!();
    println!(
        "### Decode at depth: exact vs DynaKV (budget {}, sinks {}, recent {}), {} decoded tokens each",
        a.budget, a.sinks, a.recent, a.decode
    );
    println!();
    let other = if a.ab_select { "DynaKV, reference selection" } else { "exact" };
    println!("| history | {other} tok/s | DynaKV tok/s | speedup | keys attended | clusters | index build | KV bytes (all in RAM) | RSS |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mib = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0) / (1 << 20) as f64;
    for r in rows {
        println!(
            "| {} | {:.2} | {:.2} | {:.2}x | {} | {} | {:.1} s | {:.0} MiB | {:.0} MiB |",
            r["history"],
            r["exact_tok_s"].as_f64().or(r["reference_select_tok_s"].as_f64()).unwrap_or(f64::NAN),
            r["dynakv_tok_s"].as_f64().unwrap_or(f64::NAN),
            r["speedup"].as_f64().unwrap_or(f64::NAN),
            r["keys_attended_mean"],
            r["clusters"],
            r["index_build_s"].as_f64().unwrap_or(f64::NAN),
            mib(&r["kv_bytes"]),
            mib(&r["rss_bytes"]),
        );
    }
    if let (Some(first), Some(last)) = (rows.first(), rows.last()) {
        println!(
            "DynaKV at {} vs at {}: {:.2}x slower",
            last["history"],
            first["history"],
            first["dynakv_tok_s"].as_f64().unwrap_or(f64::NAN) / last["dynakv_tok_s"].as_f64().unwrap_or(f64::NAN)
        );
    }
}
