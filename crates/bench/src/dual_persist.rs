//! `engram bench dual-persist`: a user's persistent stream held three ways, one
//! process each (so one mode's freed heap cannot hide the next one's growth), side by side:
//! - `copy`: a copy per thread — each thread's anchors prefilled for it (8 users of one
//!   thread each: what a cache without a shared persistent stream holds);
//! - `ram`: one stream in RAM, forked by every thread of the user (`DualStream` without a
//!   directory);
//! - `mapped`: one stream as an immutable entry file mapped by every thread
//!   (`DualStream::with_dir`), restored from the file by a restarted policy.
//!
//! Reported per mode: resident memory (anonymous and file-backed, from `/proc/self/status`)
//! and the KV pool's bytes after the first thread's request and after 8 threads', their
//! difference per extra thread (with `mapped`, once the background writer has mapped the file
//! in); the first request's time (prefill; the file is written off the engine thread); with `mapped`, the first request of a restarted policy
//! (restored from the file, page cache warm) — median of `--reps`.
//!
//! Then `disk` (`dual_disk.rs`): the engine thread's stall per fact with the stream's
//! file written in the background vs waited for, a switch to a thread whose ring is on disk
//! (page cache warm and dropped) vs in RAM, and the stream's restore with the page cache dropped.
//!
//! Reproduce: `engram bench dual-persist --model <llama-1b gguf> --anchor-tokens 512`.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use engram_dual::DualStream;
use engram_model::Model;

use crate::common::{kv_pool, load_model, ModelArgs};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    model: ModelArgs,
    /// Tokens of the persistent stream (the dual-stream design's cap: 512).
    #[arg(long, default_value_t = 512)]
    anchor_tokens: usize,
    /// Threads of the user (the dual-stream design's question: 1 and 8).
    #[arg(long, default_value_t = 8)]
    user_threads: usize,
    /// Restarts timed (the median is reported).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Tokens of the ring a thread switched to from disk holds (the `disk` part; default 1.5K).
    #[arg(long, default_value_t = 1536)]
    ring_tokens: usize,
    /// Facts added one by one for the engine-thread stall per fact (the `disk` part).
    #[arg(long, default_value_t = 8)]
    facts: usize,
    /// The modes to run, comma-separated (of copy, ram, mapped, disk; `copy` prefills the
    /// stream once per thread: slow on large models).
    #[arg(long, default_value = "copy,ram,mapped,disk")]
    modes: String,
    /// One JSON line per mode.
    #[arg(long)]
    json: bool,
    /// Runs one mode in this process and prints its JSON line (the parent runs each mode so).
    #[arg(long, hide = true)]
    only: Option<String>,
}

/// The RSS modes, then `disk` (`dual_disk.rs`: fact stall, switch from disk, stream restore).
const MODES: [&str; 4] = ["copy", "ram", "mapped", "disk"];

/// Resident bytes: (anonymous, file-backed), from /proc (zeros where unavailable).
fn rss() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()).map_or(0, |k| k * 1024)
    };
    (kib("RssAnon:"), kib("RssFile:"))
}

fn anchors(model: &Model, n: usize) -> Result<Vec<u32>> {
    let ids = model.tokenizer.encode(engram_tokenizer::FIXTURE_CORPUS, true)?.ids;
    if ids.len() < n {
        bail!("the fixed text is {} tokens on this tokenizer; ask for at most that many", ids.len());
    }
    Ok(ids[..n].to_vec())
}

/// A request's admission on `user`'s `thread` (what the scheduler does first for a turn).
fn admit(p: &mut DualStream, model: &Model, user: &str, thread: &str) -> Result<f64> {
    let prompt = model.tokenizer.encode(" Hello.", false)?.ids;
    let t = Instant::now();
    let c = p.admit_tokens(user, Some(thread), &prompt, &model.tokenizer).map_err(anyhow::Error::msg)?;
    let ms = t.elapsed().as_secs_f64() * 1e3;
    drop(c);
    Ok(ms)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// One mode, measured in this process: its JSON line.
fn run_mode(a: &Args, mode: &str) -> Result<serde_json::Value> {
    let model = Arc::new(load_model(&a.model)?);
    let pool = kv_pool(&model, &a.model)?;
    let anchors = anchors(&model, a.anchor_tokens)?;
    if mode == "disk" {
        let d = crate::dual_disk::DiskArgs { anchors: &anchors, ring_tokens: a.ring_tokens, facts: a.facts, reps: a.reps };
        return crate::dual_disk::run(&model, &pool, &d);
    }
    let dir = tempfile::tempdir()?;
    let policy = |with_dir: bool| -> Result<DualStream> {
        let p = DualStream::new(model.clone(), pool.clone(), 1536);
        Ok(if with_dir { p.with_dir(dir.path())? } else { p })
    };
    let mut p = policy(mode == "mapped")?;
    let user = |t: usize| if mode == "copy" { format!("user-{t}") } else { "user".to_string() };
    for t in 0..a.user_threads {
        p.set_anchors(&user(t), anchors.clone());
    }
    let before = rss();
    let first_ms = admit(&mut p, &model, &user(0), "thread-0")?;
    // The stream's file is written in the background: measure once it is mapped (a no-op
    // without a directory).
    p.flush();
    let (one, pool_one) = (rss(), pool.used());
    for t in 1..a.user_threads {
        admit(&mut p, &model, &user(t), &format!("thread-{t}"))?;
    }
    let (all, pool_all) = (rss(), pool.used());
    let per = |x: u64, y: u64| (y as f64 - x as f64) / (a.user_threads.max(2) - 1) as f64;
    let mut line = serde_json::json!({
        "mode": mode, "anchor_tokens": a.anchor_tokens, "threads": a.user_threads,
        "stream_bytes": pool.bytes_per_token() * a.anchor_tokens,
        "rss_anon_before": before.0, "rss_file_before": before.1,
        "rss_anon_1": one.0, "rss_file_1": one.1, "rss_anon_n": all.0, "rss_file_n": all.1,
        "rss_per_extra_thread": per(one.0 + one.1, all.0 + all.1),
        "pool_bytes_1": pool_one, "pool_bytes_n": pool_all, "pool_per_extra_thread": per(pool_one as u64, pool_all as u64),
        "first_request_ms": first_ms,
    });
    if mode == "mapped" {
        let blocks_mapped = p.persistent("user").and_then(|s| s.kv()).is_some_and(|kv| kv.blocks().iter().all(|b| b.is_mapped()));
        drop(p);
        let mut restores = Vec::new();
        for _ in 0..a.reps.max(1) {
            let mut q = policy(true)?;
            q.set_anchors("user", anchors.clone());
            restores.push(admit(&mut q, &model, "user", "thread-0")?);
            let s = q.dual_stats();
            if s.streams_restored != 1 || s.anchors_prefilled != 0 {
                bail!("the restarted policy did not restore the stream from its file: {s:?}");
            }
        }
        line["blocks_mapped"] = blocks_mapped.into();
        line["restore_ms_median"] = median(restores).into();
    }
    Ok(line)
}

pub fn run(a: Args) -> Result<()> {
    if let Some(mode) = &a.only {
        println!("{}", run_mode(&a, mode)?);
        return Ok(());
    }
    let exe = std::env::current_exe()?;
    let args: Vec<String> = std::env::args().skip(1).filter(|x| x != "--json").collect();
    let mut lines = Vec::new();
    let wanted: Vec<&str> = a.modes.split(',').map(str::trim).collect();
    if let Some(bad) = wanted.iter().find(|m| !MODES.contains(m)) {
        bail!("unknown mode {bad:?}; the modes are {}", MODES.join(", "));
    }
    for mode in MODES.into_iter().filter(|m| wanted.contains(m)) {
        let out = std::process::Command::new(&exe).args(&args).args(["--only", mode]).output().context("running a mode")?;
        if !out.status.success() {
            bail!("mode {mode} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let line: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or("")).context("a mode's JSON line")?;
        lines.push(line);
    }
    if a.json {
        for l in &lines {
            println!("{l}");
        }
        return Ok(());
    }
    let mib = |v: &serde_json::Value| v.as_f64().unwrap_or(0.0) / (1 << 20) as f64;
    let n = a.user_threads;
    let stream_bytes = lines.iter().find_map(|l| l["stream_bytes"].as_f64()).unwrap_or(0.0);
    println!("persistent stream: {} tokens, {:.2} MiB of KV; {n} threads of one user", a.anchor_tokens, stream_bytes / (1 << 20) as f64);
    let rss_lines: Vec<&serde_json::Value> = lines.iter().filter(|l| l["mode"] != "disk").collect();
    if !rss_lines.is_empty() {
        println!(
            "| mode | RSS anon+file MiB, 1 thread | {n} threads | RSS MiB per extra thread | KV pool MiB per extra thread | first request ms |"
        );
        println!("|---|---|---|---|---|---|");
    }
    for l in rss_lines {
        let total = |k1: &str, k2: &str| mib(&l[k1]) + mib(&l[k2]);
        println!(
            "| {} | {:.1} ({:.1}+{:.1}) | {:.1} ({:.1}+{:.1}) | {:.2} | {:.2} | {:.1} |",
            l["mode"].as_str().unwrap_or(""),
            total("rss_anon_1", "rss_file_1"),
            mib(&l["rss_anon_1"]),
            mib(&l["rss_file_1"]),
            total("rss_anon_n", "rss_file_n"),
            mib(&l["rss_anon_n"]),
            mib(&l["rss_file_n"]),
            mib(&l["rss_per_extra_thread"]),
            mib(&l["pool_per_extra_thread"]),
            l["first_request_ms"].as_f64().unwrap_or(0.0),
        );
    }
    if let Some(m) = lines.iter().find(|l| l["mode"] == "mapped") {
        // The first request prefills the stream in every mode (the file is written off the
        // engine thread): the RAM mode's when it ran, else this one's.
        let prefill = lines.iter().find(|l| l["mode"] == "ram").unwrap_or(m)["first_request_ms"].as_f64().unwrap_or(0.0);
        let restore = m["restore_ms_median"].as_f64().unwrap_or(0.0);
        println!(
            "\nrestart: stream restored from its file in {restore:.1} ms (median of {}, page cache warm) vs prefilled in {prefill:.1} ms: {:.1}x; blocks mapped: {}",
            a.reps,
            prefill / restore.max(1e-9),
            m["blocks_mapped"]
        );
    }
    if let Some(d) = lines.iter().find(|l| l["mode"] == "disk") {
        let f = |k: &str| d[k].as_f64().unwrap_or(0.0);
        println!(
            "\n| disk ({} facts, {}-token ring of {} turns; medians of {}) | ms |",
            d["facts"], d["ring_tokens"], d["ring_turns"], a.reps
        );
        println!("|---|---|");
        println!("| engine-thread stall per fact: admission, stream file written in the background | {:.2} |", f("fact_stall_ms_median"));
        println!(
            "| the same admission waiting for write + fsync + map back (the former path) | {:.2} |",
            f("fact_stall_sync_write_ms_median")
        );
        println!("| switch to a thread whose ring is on disk, page cache warm: admission | {:.2} |", f("switch_disk_warm_admit_ms"));
        println!(
            "| ... its checksum wait (overlapped with the turn's prefill by the scheduler) | {:.2} |",
            f("switch_disk_warm_checksum_ms")
        );
        println!("| switch from disk, page cache dropped: admission | {:.2} |", f("switch_disk_cold_admit_ms"));
        println!("| ... its checksum wait (reads the files) | {:.2} |", f("switch_disk_cold_checksum_ms"));
        println!(
            "| admission + checksum, warm / dropped | {:.2} / {:.2} |",
            f("switch_disk_warm_admit_ms") + f("switch_disk_warm_checksum_ms"),
            f("switch_disk_cold_admit_ms") + f("switch_disk_cold_checksum_ms")
        );
        println!("| switch to the same thread once in RAM | {:.3} |", f("switch_ram_ms"));
        println!("| persistent stream restored at a restart, page cache warm | {:.2} |", f("stream_restore_warm_ms"));
        println!("| persistent stream restored, page cache dropped | {:.2} |", f("stream_restore_cold_ms"));
        println!("(largest fraction of a file still resident after dropping: {:.2})", f("cold_resident_fraction_max"));
    }
    println!("reproduce: engram bench dual-persist {}", std::env::args().skip(3).collect::<Vec<_>>().join(" "));
    Ok(())
}
