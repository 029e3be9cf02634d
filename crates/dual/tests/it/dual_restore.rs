//! A dual-stream thread's ring restored after a restart, through the scheduler: the
//! ring's turn files are opened at admission and their checksums computed beside the new
//! turn's prefill, settled by `ContextPolicy::verify_restore` before the first token.
//! - sound files: the continued conversation answers exactly as one that never restarted;
//! - a bit flip in a turn file (which only the checksum catches): `verify_restore` refuses it,
//!   the job is admitted again on an empty ring and answers what a fresh thread answers; the
//!   damaged files are gone, and the thread's next restart restores the new turn.

use crate::common;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Instant;

use common::{assert_close, ids, on_view, tiny, Collect};
use engram_dual::{DualStats, DualStream};
use engram_engine::{run_engine, Command, ContextPolicy, Metrics, Retired, SamplingParams, SchedulerConfig};
use engram_engine::{AdmitRequest, PolicyLayer};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_policy::Checkout;

/// The policy, its counts copied out after every retirement.
struct Recorder {
    inner: DualStream,
    stats: Arc<Mutex<DualStats>>,
}

impl PolicyLayer for Recorder {
    common::inner_layer!();
    fn admit(&mut self, req: &AdmitRequest<'_>) -> Result<Checkout, String> {
        self.inner.admit(req)
    }
    fn retire(&mut self, r: Retired) {
        self.inner.retire(r);
        *self.stats.lock().unwrap() = self.inner.dual_stats();
    }
    fn idle_slice(&mut self, interrupt: &engram_engine::IdleInterrupt) -> bool {
        self.inner.idle_slice(interrupt)
    }
}

/// Runs `prompts` in order as turns of user "u"'s thread "t" on one engine whose policy keeps
/// its files in `dir`; returns the answers, the policy's counts and the engine's metrics.
fn run(m: &Arc<Model>, dir: &Path, prompts: &[Vec<u32>]) -> (Vec<String>, DualStats, Arc<Metrics>) {
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let mut p = DualStream::new(m.clone(), pool.clone(), 1024).with_dir(dir).unwrap();
    p.set_anchors("u", m.tokenizer.encode("System: answer in one line.", true).unwrap().ids);
    let stats = Arc::new(Mutex::new(DualStats::default()));
    let recorder = Recorder { inner: p, stats: stats.clone() };
    let (tx, rx) = mpsc::channel();
    let (pending, metrics) = (Arc::new(AtomicUsize::new(0)), Arc::new(Metrics::default()));
    let engine = {
        let (m, pending, metrics) = (m.clone(), pending.clone(), metrics.clone());
        std::thread::spawn(move || run_engine(&m, pool, SchedulerConfig::default(), Box::new(recorder), metrics, pending, rx))
    };
    let params = SamplingParams { max_tokens: 5, ignore_eos: true, ..Default::default() };
    let sinks: Vec<Collect> = prompts.iter().map(|_| Collect::default()).collect();
    for (prompt, sink) in prompts.iter().zip(&sinks) {
        let job = engram_engine::Job { session: Some("t".into()), ..common::job("u", prompt, &params) };
        pending.fetch_add(1, Relaxed);
        tx.send(Command::Submit(job, Box::new(sink.clone()), Instant::now())).unwrap();
    }
    drop(tx);
    // The engine returns once every job is done; dropping the policy drains its writers.
    engine.join().unwrap();
    let answers = sinks.iter().map(|s| s.outcome().0).collect();
    let stats = *stats.lock().unwrap();
    (answers, stats, metrics)
}

fn turn_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().unwrap().to_str().unwrap();
            name.starts_with("ring-") && name.ends_with(".safetensors")
        })
        .collect();
    out.sort();
    out
}

#[test]
fn a_restored_ring_is_verified_beside_the_prefill_and_a_damaged_one_answers_as_a_fresh_thread() {
    let (_d, m) = tiny();
    let topics = ["bees", "a KV cache", "sourdough", "Oslo"];
    let ps: Vec<Vec<u32>> = topics.iter().map(|t| ids(&m, &format!(" User: tell me about {t}. Assistant:"))).collect();
    let uninterrupted = run(&m, tempfile::tempdir().unwrap().path(), &ps).0;
    let fresh = run(&m, tempfile::tempdir().unwrap().path(), &ps[3..]).0;
    assert_ne!(uninterrupted[3], fresh[0], "the fixture answers differently with and without the earlier turns");

    // Sound files: the restored ring gives the uninterrupted answer.
    let d = tempfile::tempdir().unwrap();
    run(&m, d.path(), &ps[..3]);
    let (got, s, metrics) = run(&m, d.path(), &ps[3..]);
    assert_eq!(got[0], uninterrupted[3], "the restored conversation answers as without the restart");
    assert_eq!((s.rings_restored, s.turns_restored, s.ring_files_refused), (1, 3, 0), "{s:?}");
    assert_eq!(metrics.restores_failed.load(Relaxed), 0);

    // A bit flip in a turn's KV: caught by the checksum after admission, the job admitted again.
    let d = tempfile::tempdir().unwrap();
    run(&m, d.path(), &ps[..3]);
    let damaged = turn_files(d.path());
    assert_eq!(damaged.len(), 3, "one file per turn");
    let mut bytes = std::fs::read(&damaged[1]).unwrap();
    let at = bytes.len() - 64;
    bytes[at] ^= 0x10;
    std::fs::write(&damaged[1], bytes).unwrap();
    let (got, s, metrics) = run(&m, d.path(), &ps[3..]);
    assert_eq!(got[0], fresh[0], "a damaged ring answers as a fresh thread, never on the damaged KV");
    assert_eq!((s.rings_restored, s.ring_files_refused), (0, 1), "{s:?}");
    assert_eq!(metrics.restores_failed.load(Relaxed), 1, "refused by verify_restore, not at admission");
    assert!(damaged.iter().all(|f| !f.exists()), "the damaged ring's files are deleted");
    // The thread now holds the one new turn: the next restart restores it.
    let (_, s, _) = run(&m, d.path(), &ps[..1]);
    assert_eq!((s.rings_restored, s.turns_restored, s.ring_files_refused), (1, 1, 0), "{s:?}");
}

/// The state entry and the ring's verification: a state entry set while a restored
/// ring's checksums still run is not lost when the ring proves damaged — the thread starts
/// empty but for it, exactly as a fresh thread given that state entry.
#[test]
fn a_state_entry_set_while_a_damaged_ring_is_verified_is_kept_on_the_fresh_ring() {
    let (_d, m) = tiny();
    let tok = &m.tokenizer;
    let ps: Vec<Vec<u32>> = ["bees", "Oslo", "tea"].iter().map(|t| ids(&m, &format!(" User: tell me about {t}. Assistant:"))).collect();
    let d = tempfile::tempdir().unwrap();
    run(&m, d.path(), &ps[..2]);
    let files = turn_files(d.path());
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let at = bytes.len() - 64;
    bytes[at] ^= 0x10;
    std::fs::write(&files[0], bytes).unwrap();

    // After the restart, as the scheduler calls the policy: the turn admitted on the restored
    // ring (unverified), a state entry set meanwhile, then the check fails.
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let anchors = tok.encode("System: answer in one line.", true).unwrap().ids;
    let mut p = DualStream::new(m.clone(), pool.clone(), 1024).with_dir(d.path()).unwrap();
    p.set_anchors("u", anchors.clone());
    let c = p.admit_tokens("u", Some("t"), &ps[2], tok).unwrap();
    let restore = c.restore.expect("the ring restored from disk, its checksums running");
    let state = ids(&m, " State: ran 3 km today.");
    p.set_state("u", "t", state.clone()).unwrap();
    assert!(!p.verify_restore(restore), "the damaged ring is refused");
    assert_eq!(p.dual_stats().ring_files_refused, 1);
    // The entry set on the damaged ring and the one set again on the fresh ring: only the
    // second is kept.
    assert_eq!(engram_engine::drain_background(&m, pool.clone(), &mut p), 2);
    assert_eq!(p.dual_stats().states_set, 1);

    // Admitted again: anchors + the state entry, as a fresh thread given that state.
    let again = p.admit_tokens("u", Some("t"), &ps[2], tok).unwrap();
    assert!(again.restore.is_none(), "never the damaged ring again");
    let attended: usize = again.spans.iter().map(|s| s.len()).sum();
    assert_eq!(attended, anchors.len() + state.len(), "the anchors and the state entry, no restored turn");
    let mut fresh = DualStream::new(m.clone(), pool.clone(), 1024);
    fresh.set_anchors("u", anchors);
    fresh.set_state("u", "t", state).unwrap();
    engram_engine::drain_background(&m, pool.clone(), &mut fresh);
    let want = fresh.admit_tokens("u", Some("t"), &ps[2], tok).unwrap();
    let ((got, _, got_first), (want, _, want_first)) = (on_view(&m, &pool, &again), on_view(&m, &pool, &want));
    assert_eq!(got_first, want_first);
    assert_close(&got, &want, "the state entry kept on the fresh ring, as a fresh thread's");
}
