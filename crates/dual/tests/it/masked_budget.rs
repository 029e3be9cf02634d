//! Masked turns' files under the disk budget (`DualStream::set_disk_budget`): charged like the
//! rings and stream files, to their owner's account, as they land; within the budget the
//! answers are the unbudgeted policy's and the charge is what the files take on disk; past it
//! the least recently used masked files are deleted, each taking its turn out of the ring (the
//! thread goes on, no read of a missing file); the masked files of a thread with a turn running
//! are never the ones deleted.

use crate::common;
use crate::masked_disk::{message, Topics};
use common::{dual_turn, ids, on_view, tiny};

use std::path::Path;
use std::sync::Arc;

use engram_dual::{DualStats, DualStream, Relevance};
use engram_engine::{ContextPolicy, Retired};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

const TURNS: usize = 30;

fn pool(m: &Model) -> KvPool {
    KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20)
}

/// A policy keeping its files in `dir` and masked turns on disk in `dir/masked`.
fn policy(m: &Arc<Model>, pool: &KvPool, dir: &Path) -> DualStream {
    let relevance = Relevance { encoder: Arc::new(Topics), threshold: 0.5, keep_last: 1 };
    let mut p = DualStream::new(m.clone(), pool.clone(), 120).with_relevance(relevance).with_dir(dir).unwrap();
    p = p.with_masked_turns(dir.join("masked")).unwrap();
    p.set_anchors("u", ids(m, "A system prompt for the test."));
    p
}

/// Bytes of the files under `dir`, its subdirectories included.
fn tree_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| if e.file_type().unwrap().is_dir() { tree_bytes(&e.path()) } else { e.metadata().unwrap().len() })
        .sum()
}

/// Every writer waited for, the budget's deletions landed too.
fn settle(p: &mut DualStream) {
    p.flush_masked();
    p.flush();
    p.flush();
}

struct Run {
    answers: Vec<(Vec<u32>, Vec<u32>)>,
    /// Masked turns evicted for the disk budget before each turn.
    evicted_before: Vec<u64>,
    /// The most bytes the masked files took after a turn.
    masked_peak: u64,
    stats: DualStats,
}

/// `TURNS` turns of one thread, every write waited for after each; `budget`: the disk budget.
fn run(m: &Arc<Model>, dir: &Path, budget: Option<u64>) -> Run {
    let pool = pool(m);
    let mut p = policy(m, &pool, dir);
    if let Some(b) = budget {
        p.set_disk_budget(b, None);
    }
    let mut out = Run { answers: Vec::new(), evicted_before: Vec::new(), masked_peak: 0, stats: DualStats::default() };
    for i in 0..TURNS {
        out.evicted_before.push(p.dual_stats().masked_turns_evicted_for_disk);
        let (answer, logits) = dual_turn(m, &pool, &mut p, "u", "t", &ids(m, &message(i)), 3);
        out.answers.push((answer, logits.iter().map(|x| x.to_bits()).collect()));
        settle(&mut p);
        out.masked_peak = out.masked_peak.max(tree_bytes(&dir.join("masked")));
        if let Some(b) = budget {
            assert!(tree_bytes(dir) <= b, "turn {i}: {} bytes on disk past the {b}-byte budget", tree_bytes(dir));
            assert!(p.disk_bytes_charged() <= b);
        }
    }
    out.stats = p.dual_stats();
    out
}

#[test]
fn masked_files_count_against_the_disk_budget_and_past_it_their_turns_leave_the_ring() {
    let (_d, m) = tiny();
    let free = tempfile::tempdir().unwrap();
    let unbudgeted = run(&m, free.path(), None);
    assert!(unbudgeted.stats.turns_offloaded > 5 && unbudgeted.masked_peak > 0, "{:?}", unbudgeted.stats);

    // Room for everything: the same answers, and the charge is the bytes on disk.
    let roomy = tempfile::tempdir().unwrap();
    let r = run(&m, roomy.path(), Some(1 << 30));
    assert_eq!(r.answers, unbudgeted.answers);
    assert_eq!(r.stats.masked_turns_evicted_for_disk, 0);
    {
        let pool = pool(&m);
        let dir = tempfile::tempdir().unwrap();
        let mut p = policy(&m, &pool, dir.path());
        p.set_disk_budget(1 << 30, None);
        for i in 0..TURNS / 2 {
            dual_turn(&m, &pool, &mut p, "u", "t", &ids(&m, &message(i)), 3);
        }
        settle(&mut p);
        let masked = tree_bytes(&dir.path().join("masked"));
        assert!(masked > 0);
        assert_eq!(p.disk_bytes_charged(), tree_bytes(dir.path()), "every file charged, masked turns' included, at its size");
    }

    // Room for a third of the masked files at their peak, nothing beside: past the ring's
    // restart files and the stream file, the oldest masked files go.
    let budget = unbudgeted.masked_peak / 3;
    let dir = tempfile::tempdir().unwrap();
    let b = run(&m, dir.path(), Some(budget));
    let s = b.stats;
    assert!(s.masked_turns_evicted_for_disk > 0, "{s:?}");
    assert_eq!(s.masked_restore_failures, 0, "an evicted turn is out of the ring, never read: {s:?}");
    assert_eq!(b.answers.len(), TURNS, "every turn answered");
    // Until a masked turn had to go, the answers are the unbudgeted ones.
    let same = b.evicted_before.iter().take_while(|&&n| n == 0).count();
    assert!(same > 1 && same < TURNS, "{:?}", b.evicted_before);
    assert_eq!(b.answers[..same], unbudgeted.answers[..same]);
}

#[test]
fn a_running_threads_masked_files_are_kept_past_the_budget_until_it_retires() {
    let (_d, m) = tiny();
    let pool = pool(&m);
    let dir = tempfile::tempdir().unwrap();
    let mut p = policy(&m, &pool, dir.path());
    for i in 0..8 {
        dual_turn(&m, &pool, &mut p, "u", "t", &ids(&m, &message(i)), 3);
    }
    settle(&mut p);
    // A turn admitted and running; its mask's turns are written meanwhile; then a budget of
    // one byte.
    let prompt = ids(&m, &message(8));
    let c = p.admit_tokens("u", Some("t"), &prompt, &m.tokenizer).unwrap();
    settle(&mut p);
    let on_disk = std::fs::read_dir(dir.path().join("masked")).unwrap().count();
    assert!(on_disk > 0, "masked turns are on disk");
    p.set_disk_budget(1, None);
    settle(&mut p);
    assert_eq!(p.dual_stats().masked_turns_evicted_for_disk, 0, "the running thread's masked files are kept");
    assert_eq!(std::fs::read_dir(dir.path().join("masked")).unwrap().count(), on_disk);

    // The turn ends: the thread is idle, its masked files go and their turns leave the ring.
    let (_, kv, _) = on_view(&m, &pool, &c);
    let n = c.tokens.len();
    p.retire(Retired {
        owner: "u".into(),
        session_id: "t".into(),
        text: String::new(),
        tokens: c.tokens.clone(),
        token_ends: vec![0; n],
        kv,
        cache: None,
        unfed: None,
    });
    settle(&mut p);
    let s = p.dual_stats();
    // (Turns the ring evicted as the new one joined take their files with them uncounted.)
    assert!(s.masked_turns_evicted_for_disk > 0 && s.masked_turns_evicted_for_disk <= on_disk as u64, "{s:?}");
    assert_eq!(std::fs::read_dir(dir.path().join("masked")).unwrap().count(), 0);
    assert_eq!(p.disk_bytes_charged(), 0);
    // The thread goes on, every topic again, without reading a deleted file.
    for i in 9..15 {
        dual_turn(&m, &pool, &mut p, "u", "t", &ids(&m, &message(i)), 3);
    }
    assert_eq!(p.dual_stats().masked_restore_failures, 0);
    let gauges = p.stats().named;
    let evicted = gauges.iter().find(|g| g.name == "engram_masked_turns_evicted_for_disk_total").expect("in /metrics");
    assert!(evicted.value >= s.masked_turns_evicted_for_disk);
}

/// Bytes of `user`'s files under `dir`: its stream file, its thread `t`'s ring, and its masked
/// turns' files (by the owner their entry names); and of the masked files alone.
fn user_bytes(dir: &Path, user: &str) -> (u64, u64) {
    let ring = engram_dual::RingStore::ring_key(user, "t");
    let (mut bytes, mut masked) = (0, 0);
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with(&ring) || name == engram_dual::stream_file_name(user) {
            bytes += e.metadata().unwrap().len();
        }
    }
    for e in std::fs::read_dir(dir.join("masked")).unwrap().flatten() {
        if engram_kv::read_meta(&e.path()).is_ok_and(|i| i.meta.owner == format!("{user}/t")) {
            masked += e.metadata().unwrap().len();
        }
    }
    (bytes + masked, masked)
}

#[test]
fn a_tenant_over_its_share_loses_its_own_masked_turns_and_no_one_elses() {
    let (_d, m) = tiny();
    let pool = pool(&m);
    // "u" talks every turn, "b" only at first: with a share between the two, only u is over it
    // (b's files, the least recently used, stay: the budget itself is not reached).
    let converse = |dir: &Path, share: Option<u64>| -> (Vec<Vec<u32>>, DualStats, u64, u64) {
        let mut p = policy(&m, &pool, dir);
        p.set_anchors("b", ids(&m, "Another system prompt."));
        if let Some(s) = share {
            p.set_disk_budget(1 << 30, Some(s));
        }
        let (mut b_answers, mut u_peak, mut b_peak) = (Vec::new(), 0, 0);
        for i in 0..TURNS {
            dual_turn(&m, &pool, &mut p, "u", "t", &ids(&m, &message(i)), 3);
            if i < 2 {
                b_answers.push(dual_turn(&m, &pool, &mut p, "b", "t", &ids(&m, &message(i + 1)), 3).0);
            }
            settle(&mut p);
            (u_peak, b_peak) = (u_peak.max(user_bytes(dir, "u").1), b_peak.max(user_bytes(dir, "b").0));
            if let Some(s) = share {
                let u = user_bytes(dir, "u").0;
                assert!(u <= s, "turn {i}: u holds {u} bytes past its {s}-byte share");
            }
        }
        (b_answers, p.dual_stats(), u_peak, b_peak)
    };
    let free = tempfile::tempdir().unwrap();
    let (b_want, _, u_masked_peak, b_peak) = converse(free.path(), None);
    // Below what u's masked files alone reach: past its ring and stream, they go too.
    let share = (b_peak + b_peak / 4).max(u_masked_peak / 3);
    assert!(share < u_masked_peak, "u's masked files alone pass the share ({u_masked_peak} bytes at most, b's files {b_peak})");
    let dir = tempfile::tempdir().unwrap();
    let (b_answers, s, _, b_peak_shared) = converse(dir.path(), Some(share));
    assert!(s.masked_turns_evicted_for_disk > 0, "{s:?}");
    assert_eq!(s.masked_restore_failures, 0);
    assert_eq!(b_answers, b_want, "b's thread answers as without a share");
    assert_eq!(b_peak_shared, b_peak, "b's files are untouched");
}
