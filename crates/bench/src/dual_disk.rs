//! The `disk` part of `engram bench dual-persist`: what dual-stream persistence
//! costs the engine thread and a thread switch, measured in one process.
//! - fact stall: per new fact, the engine thread's time for the admission that prefills it and
//!   queues the stream's file (`DualStream`'s background writer), against the same admission
//!   followed by waiting for the write, fsync and map-back — what the engine thread did before
//!   the writer (two users in two directories, alternated fact by fact: side by side);
//! - switch from disk: a thread whose ring (`--ring-tokens`, default 1.5K) was saved by a
//!   previous policy, switched to: the admission (manifest read, turn files opened and mapped,
//!   every check but the checksums) and the checksum wait that the scheduler overlaps with the
//!   turn's prefill — page cache warm, and dropped per file (`posix_fadvise(DONTNEED)`, as
//!   `bench cache` does); against switches between it and another thread once in RAM (median
//!   of 21 per restart);
//! - stream restore: a restarted policy's first admission restoring the persistent stream from
//!   its file, page cache warm and dropped.
//!
//! Medians of `--reps`. Reproduce: `engram bench dual-persist --model <llama-1b gguf>`.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use engram_dual::{DualStream, FactSegment};
use engram_engine::{ContextPolicy, Retired};
use engram_kv::{KvPool, KvView, SeqKv};
use engram_model::{Logits, Model, SeqStep};

use crate::shared::evict_from_page_cache;

/// What the `disk` measurements need of the command line.
pub struct DiskArgs<'a> {
    pub anchors: &'a [u32],
    pub ring_tokens: usize,
    pub facts: usize,
    pub reps: usize,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// `n` token ids of the fixed corpus from `skip` on (wrapping).
fn text_tokens(model: &Model, skip: usize, n: usize) -> Result<Vec<u32>> {
    let ids = model.tokenizer.encode(engram_tokenizer::FIXTURE_CORPUS, false)?.ids;
    Ok((0..n).map(|i| ids[(skip + i) % ids.len()]).collect())
}

/// One turn as the scheduler runs it, prefill only (the prompt is the whole turn): admitted,
/// prefilled on the view, a restored ring verified, retired into the ring.
fn prefill_turn(p: &mut DualStream, model: &Model, pool: &KvPool, user: &str, thread: &str, prompt: &[u32]) -> Result<()> {
    let mut c = p.admit_tokens(user, Some(thread), prompt, &model.tokenizer).map_err(anyhow::Error::msg)?;
    let restore = c.restore.take();
    let mut kv = KvView::new(c.spans, SeqKv::new(pool)).starting_at(c.own_first);
    let first = kv.own_first_position() as u32;
    kv.own_mut().reserve(c.tokens.len())?;
    let positions: Vec<u32> = (first..first + c.tokens.len() as u32).collect();
    let step = SeqStep { positions: Some(&positions), ..SeqStep::new(&c.tokens, 0, &mut kv, Logits::Last) };
    model.forward(&mut [step])?;
    anyhow::ensure!(restore.is_none_or(|r| p.verify_restore(r)), "a restored ring failed its checks");
    let n = c.tokens.len();
    p.retire(Retired {
        owner: user.into(),
        session_id: thread.into(),
        text: String::new(),
        tokens: c.tokens,
        token_ends: vec![0; n],
        kv: kv.into_own(),
        cache: None,
        unfed: None,
    });
    Ok(())
}

/// Drops every file of `dir` whose name starts with `prefix` from the page cache; returns the
/// largest fraction still resident.
fn drop_cache(dir: &Path, prefix: &str) -> Result<f64> {
    let mut worst: f64 = 0.0;
    for e in std::fs::read_dir(dir)?.flatten() {
        if e.file_name().to_string_lossy().starts_with(prefix) {
            worst = worst.max(evict_from_page_cache(&e.path())?);
        }
    }
    Ok(worst)
}

/// The `disk` measurements as one JSON object (see the module doc).
pub fn run(model: &Arc<Model>, pool: &KvPool, a: &DiskArgs) -> Result<serde_json::Value> {
    let policy = |dir: &Path| -> Result<DualStream> {
        let mut p = DualStream::new(model.clone(), pool.clone(), a.ring_tokens).with_dir(dir)?;
        for user in ["user", "sync"] {
            p.set_anchors(user, a.anchors.to_vec());
        }
        Ok(p)
    };
    // Tokenized once, outside every timed admission: tokenizing the corpus there left the
    // allocator's free lists full of its garbage, and the admission's first larger allocation
    // paid for consolidating them (the 1.7 ms "RAM switch" this bench used to report).
    let prompt = text_tokens(model, 7, 8)?;
    let admit = |p: &mut DualStream, user: &str, thread: &str| -> Result<(f64, Option<engram_context::PendingRestore>)> {
        let t = Instant::now();
        let mut c = p.admit_tokens(user, Some(thread), &prompt, &model.tokenizer).map_err(anyhow::Error::msg)?;
        Ok((ms(t), c.restore.take()))
    };

    // Fact stall: two users, two directories, alternated per fact.
    let (d_async, d_sync) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (mut pa, mut ps) = (policy(d_async.path())?, policy(d_sync.path())?);
    admit(&mut pa, "user", "t")?;
    admit(&mut ps, "sync", "t")?;
    ps.flush();
    pa.flush();
    let (mut stall_async, mut stall_sync, mut facts) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..a.facts {
        facts.push(FactSegment { id: i as u64 + 1, text: format!("fact {i}"), tokens: text_tokens(model, 100 + 16 * i, 16)? });
        pa.set_facts("user", facts.clone());
        ps.set_facts("sync", facts.clone());
        stall_async.push(admit(&mut pa, "user", "t")?.0);
        let t = Instant::now();
        admit(&mut ps, "sync", "t")?;
        ps.flush();
        stall_sync.push(ms(t));
        // The async policy's write lands before the next fact (not timed): one write per fact.
        pa.flush();
    }
    drop((pa, ps));

    // A thread with a full ring, saved; a restarted policy switches to it.
    let dir = tempfile::tempdir()?;
    let turn = 150.min(a.ring_tokens);
    let mut p = policy(dir.path())?;
    let mut ring_tokens = 0;
    for i in 0..a.ring_tokens / turn {
        prefill_turn(&mut p, model, pool, "user", "long", &text_tokens(model, 1000 + i * turn, turn)?)?;
        ring_tokens += turn;
    }
    p.flush();
    drop(p);
    let stream_file = dir.path().join(engram_dual::stream_file_name("user"));
    let (mut warm_admit, mut warm_check, mut cold_admit, mut cold_check, mut ram_switch) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut stream_warm, mut stream_cold, mut resident) = (vec![], vec![], 0f64);
    for _ in 0..a.reps.max(1) {
        for cold in [false, true] {
            let mut p = policy(dir.path())?;
            if cold {
                resident = resident.max(evict_from_page_cache(&stream_file)?);
            }
            // The stream restored from its file: the first admission of the restarted policy.
            let (t_stream, r) = admit(&mut p, "user", "other")?;
            anyhow::ensure!(r.is_none(), "a thread without a ring restored one");
            if cold {
                resident = resident.max(drop_cache(dir.path(), "ring-")?);
            }
            let (t_admit, r) = admit(&mut p, "user", "long")?;
            let r = r.context("the saved ring was not restored")?;
            let t = Instant::now();
            anyhow::ensure!(p.verify_restore(r), "the saved ring failed its checksum");
            let t_check = ms(t);
            // Then switches from RAM, alternating with the other thread (median of 21).
            let mut ram = Vec::new();
            for k in 0..21 {
                ram.push(admit(&mut p, "user", if k % 2 == 0 { "long" } else { "other" })?.0);
            }
            let t_ram = median(ram);
            let s = p.dual_stats();
            anyhow::ensure!(s.streams_restored == 1 && s.turns_restored as usize == a.ring_tokens / turn, "restores: {s:?}");
            let (stream, admits, checks) = if cold {
                (&mut stream_cold, &mut cold_admit, &mut cold_check)
            } else {
                (&mut stream_warm, &mut warm_admit, &mut warm_check)
            };
            stream.push(t_stream);
            admits.push(t_admit);
            checks.push(t_check);
            ram_switch.push(t_ram);
        }
    }
    Ok(serde_json::json!({
        "mode": "disk",
        "facts": a.facts,
        "fact_stall_ms_median": median(stall_async),
        "fact_stall_sync_write_ms_median": median(stall_sync),
        "ring_tokens": ring_tokens,
        "ring_turns": a.ring_tokens / turn,
        "switch_disk_warm_admit_ms": median(warm_admit),
        "switch_disk_warm_checksum_ms": median(warm_check),
        "switch_disk_cold_admit_ms": median(cold_admit),
        "switch_disk_cold_checksum_ms": median(cold_check),
        "switch_ram_ms": median(ram_switch),
        "stream_restore_warm_ms": median(stream_warm),
        "stream_restore_cold_ms": median(stream_cold),
        "cold_resident_fraction_max": resident,
    }))
}
