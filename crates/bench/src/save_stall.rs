//! `engram bench save-stall`: how long the engine waits on the disk store while a long session
//! is saved. The engine thread reads the store's gauges every step under its
//! lock; a save that holds the lock while it writes and syncs the file stalls every stream for
//! the whole write.
//!
//! One run, side by side, on one session's KV in the `llama-1b` layout (16 layers, 8 KV heads
//! of 64, `--tokens` of random f16 KV: 537 MB at 16K) saved into a store on `--dir`:
//! * `under_lock` (before the fix): `DiskStore::put` with the lock held throughout;
//! * `staged` (today's persistence thread): `stage_put` and `commit_put` under the lock,
//!   `StagedPut::write` (temp file, fsync, rename) and the `index.json` write
//!   (`DiskStore::take_index`, `IndexWrite::write`) outside it.
//!
//! Meanwhile a stand-in engine thread takes the lock every millisecond to read `used_bytes`
//! (what a step does) and records how long each acquisition waited. That wait is added to the
//! inter-token gap of every stream decoding during the save. Reported: the save's duration
//! and the longest and p99 waits, and the longest time the saver held the lock, best of
//! `--reps` alternating runs.
//! Reproduce: `engram bench save-stall --tokens 16384 --dir /var/tmp`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use engram_kv::{DiskStore, EntryKind, EntryMeta, EvictionPolicy, KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::KvCache;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tokens in the saved session (llama-1b layout, f16 KV: 32 KiB a token).
    #[arg(long, default_value_t = 16384)]
    tokens: usize,
    /// Where the store is made (a temporary folder inside it, deleted after): a real disk, not tmpfs.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Alternating runs of each mode; the best of each is reported.
    #[arg(long, default_value_t = 2)]
    reps: usize,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

const LAYOUT: KvLayout = KvLayout { num_layers: 16, num_kv_heads: 8, head_dim: 64 };

/// One save: its duration and the stand-in engine's lock waits meanwhile (seconds).
struct Run {
    save_s: f64,
    max_wait_s: f64,
    p99_wait_s: f64,
    /// The longest the saver itself held the lock: the part of a wait the store causes (the
    /// rest of a longer wait is the waiting thread not being scheduled on a loaded machine).
    max_hold_s: f64,
}

pub fn run(a: Args) -> Result<()> {
    ensure!(a.tokens >= 32, "--tokens must be at least 32");
    ensure!(a.reps >= 1, "--reps must be at least 1");
    let pool = KvPool::new(LAYOUT, KvFormat::F16, (a.tokens as u64 * 40 * 1024).max(64 << 20) as usize);
    let kv = random_kv(&pool, a.tokens);
    let tmp = tempfile::Builder::new()
        .prefix("engram-save-stall")
        .tempdir_in(&a.dir)
        .with_context(|| format!("a folder in {}", a.dir.display()))?;
    let store = Arc::new(Mutex::new(DiskStore::open(tmp.path(), u64::MAX / 4, EvictionPolicy::Lru)?));
    let mut best: [Option<Run>; 2] = [None, None];
    for rep in 0..a.reps {
        for (m, staged) in [(0, false), (1, true)] {
            let r = measure(&store, &kv, staged, rep * 2 + m)?;
            if best[m].as_ref().is_none_or(|b| r.max_wait_s < b.max_wait_s) {
                best[m] = Some(r);
            }
        }
    }
    let bytes = store.lock().unwrap().used_bytes();
    if !a.json {
        println!("| mode | session | save (ms) | longest engine wait (ms) | p99 wait (ms) | longest hold by the saver (ms) |");
        println!("|---|---|---|---|---|---|");
    }
    for (m, name) in [(0, "under_lock"), (1, "staged")] {
        let r = best[m].as_ref().expect("measured");
        let mb = bytes as f64 / 2.0 / 1e6; // two entries of equal size are left in the store
        if a.json {
            println!(
                "{}",
                serde_json::json!({"mode": name, "tokens": a.tokens, "entry_mb": round(mb), "save_ms": round(r.save_s * 1e3),
                    "max_wait_ms": round(r.max_wait_s * 1e3), "p99_wait_ms": round(r.p99_wait_s * 1e3),
                    "max_hold_ms": round(r.max_hold_s * 1e3), "reps": a.reps})
            );
        } else {
            println!(
                "| {name} | {} tokens, {:.0} MB | {:.1} | {:.3} | {:.3} | {:.3} |",
                a.tokens,
                mb,
                r.save_s * 1e3,
                r.max_wait_s * 1e3,
                r.p99_wait_s * 1e3,
                r.max_hold_s * 1e3
            );
        }
    }
    if !a.json {
        println!("\nThe longest wait is what a save adds to the inter-token gap of every stream decoding meanwhile;");
        println!("the longest hold is the store's share of it (the rest is scheduling on a loaded machine).");
    }
    Ok(())
}

/// Saves `kv` once (as entry `n`) while a stand-in engine thread reads the gauges every ms.
fn measure(store: &Arc<Mutex<DiskStore>>, kv: &SeqKv, staged: bool, n: usize) -> Result<Run> {
    let id = format!("session-{}", n % 2);
    let meta = EntryMeta {
        fingerprint: "bench-save-stall".into(),
        kind: EntryKind::Session,
        owner: format!("bench/{id}"),
        tokens: vec![0; kv.len()],
        text: String::new(),
        offsets: Vec::new(),
        created_unix: 0,
    };
    let done = Arc::new(AtomicBool::new(false));
    let engine = {
        let (store, done) = (store.clone(), done.clone());
        std::thread::spawn(move || {
            let mut waits = Vec::new();
            while !done.load(Ordering::Relaxed) {
                let t = Instant::now();
                let used = store.lock().unwrap().used_bytes();
                waits.push(t.elapsed().as_secs_f64());
                std::hint::black_box(used);
                std::thread::sleep(Duration::from_millis(1));
            }
            waits
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    let t = Instant::now();
    let mut holds = Vec::new();
    if staged {
        let h = Instant::now();
        let put = store.lock().unwrap().stage_put(&id, &meta, kv, None);
        holds.push(h.elapsed().as_secs_f64());
        let put = put?;
        put.write(kv)?;
        let h = Instant::now();
        let index = {
            let mut s = store.lock().unwrap();
            s.commit_put(put).map(|()| s.take_index())
        };
        holds.push(h.elapsed().as_secs_f64());
        if let Some(index) = index? {
            index.write()?;
        }
    } else {
        let h = Instant::now();
        store.lock().unwrap().put(&id, &meta, kv)?;
        holds.push(h.elapsed().as_secs_f64());
    }
    let save_s = t.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_millis(20));
    done.store(true, Ordering::Relaxed);
    let mut waits = engine.join().map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    waits.sort_by(f64::total_cmp);
    let p99 = waits[(waits.len() * 99 / 100).min(waits.len() - 1)];
    let max_hold_s = holds.into_iter().fold(0.0, f64::max);
    Ok(Run { save_s, max_wait_s: *waits.last().unwrap_or(&0.0), p99_wait_s: p99, max_hold_s })
}

/// `n` tokens of pseudo-random keys and values.
fn random_kv(pool: &KvPool, n: usize) -> SeqKv {
    let mut kv = SeqKv::new(pool);
    kv.reserve(n).expect("the pool was sized for it");
    let w = LAYOUT.num_kv_heads * LAYOUT.head_dim;
    let mut x = 0x9e37_79b9_u32;
    for layer in 0..LAYOUT.num_layers {
        let vals: Vec<f32> = (0..n * w)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x % 2000) as f32 / 1000.0 - 1.0
            })
            .collect();
        kv.write(layer, 0, &vals, &vals, n);
    }
    kv
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
