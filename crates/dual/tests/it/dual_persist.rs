//! Dual-stream contexts across restarts (facts, streams and rings), driven through the
//! `ContextPolicy` calls the scheduler makes:
//! - a user's persistent stream is one immutable mapped entry file that every thread attends
//!   (no KV charged per extra thread); a restarted policy restores it from the file instead of
//!   prefilling it, and answers bitwise as before; a damaged, truncated, foreign or
//!   other-format file is refused and the stream prefilled (the same answer); a stale file
//!   (the facts changed) gives only the prefix that still agrees;
//! - threads' rings are saved as their turns retire and restored at the thread's first turn
//!   after a restart: the continued conversation answers bitwise as one that never restarted
//!   (and, with no turn evicted, as a cold run over the same window); a damaged ring file
//!   starts the thread empty — the answer a fresh thread gives, never a wrong one — whether
//!   refused at admission or, for a turn file's checksum, by `verify_restore` after the
//!   prefill ran on it.

use crate::common;
use common::{assert_close, fact, ids, tiny};

use std::path::Path;
use std::sync::Arc;

use engram_dual::{stream_file_name, PersistentStream};
use engram_dual::{DualStream, FactSegment};
use engram_engine::ContextPolicy;
use engram_kv::{KvFormat, KvLayout, KvPool, KvView, SeqKv};
use engram_model::{Logits, Model, SeqStep};
use engram_policy::Checkout;

const ANSWER: usize = 5;

fn pool(m: &Model, format: KvFormat) -> KvPool {
    KvPool::new(KvLayout::of(&m.config), format, 64 << 20)
}

/// A policy over `dir` with user "u"'s system prompt and `facts`.
fn policy(m: &Arc<Model>, pool: &KvPool, dir: &Path, capacity: usize, facts: Vec<FactSegment>) -> DualStream {
    let mut p = DualStream::new(m.clone(), pool.clone(), capacity).with_dir(dir).unwrap();
    p.set_anchors("u", m.tokenizer.encode("System: answer in one line.", true).unwrap().ids);
    p.set_facts("u", facts);
    p
}

/// One turn of user "u"'s `thread` as the scheduler runs it (`common::dual_turn`).
fn turn(m: &Model, pool: &KvPool, p: &mut DualStream, thread: &str, prompt: &[u32]) -> (Vec<u32>, Vec<f32>) {
    common::dual_turn(m, pool, p, "u", thread, prompt, ANSWER)
}

/// The last logits of a cold run: the stream's live tokens at their slots' positions, then
/// `rest` at the positions following the stream (`common::cold`).
fn cold(m: &Model, pool: &KvPool, stream: &PersistentStream, rest: &[u32]) -> Vec<f32> {
    common::cold(m, pool, stream, rest, stream.len())
}

/// The logits after `prompt` on a fresh thread `thread` (admitted, never retired).
fn first_logits(m: &Model, pool: &KvPool, p: &mut DualStream, thread: &str, prompt: &[u32]) -> Vec<f32> {
    let mut c: Checkout = p.admit_tokens("u", Some(thread), prompt, &m.tokenizer).unwrap();
    let restore = c.restore.take();
    let mut kv = KvView::new(c.spans.clone(), SeqKv::new(pool)).starting_at(c.own_first);
    let first = kv.own_first_position();
    kv.own_mut().reserve(c.tokens.len()).unwrap();
    let positions: Vec<u32> = (first..first + c.tokens.len()).map(|p| p as u32).collect();
    let step = SeqStep { positions: Some(&positions), ..SeqStep::new(&c.tokens, 0, &mut kv, Logits::Last) };
    let logits = m.forward(&mut [step]).unwrap().remove(0);
    match restore.map(|r| p.verify_restore(r)) {
        Some(false) => first_logits(m, pool, p, thread, prompt),
        _ => logits,
    }
}

#[test]
fn the_persistent_stream_is_one_mapped_file_every_thread_attends() {
    let (_d, m) = tiny();
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&m, KvFormat::F32);
    let mut p = policy(&m, &pool, dir.path(), 256, vec![fact(&m, 1, "Ann keeps bees")]);
    let prompt = ids(&m, " User: who am I? Assistant:");
    let want = first_logits(&m, &pool, &mut p, "t0", &prompt);
    // The file is written beside the engine thread; once it is mapped, t0 re-forks it and the
    // stream's RAM copy is freed.
    p.flush();
    let used = pool.used();
    for t in 1..8 {
        assert_eq!(first_logits(&m, &pool, &mut p, &format!("t{t}"), &prompt), want, "thread t{t}");
    }
    assert_eq!(pool.used(), used, "no KV is charged per extra thread: they all attend the one stream");
    // The file is written beside the engine thread; once it is, the mapped KV is swapped in.
    p.flush();
    let stream = p.persistent("u").unwrap();
    assert!(stream.kv().unwrap().blocks().iter().all(|b| b.is_mapped()), "the stream's blocks are the file's pages");
    assert!(dir.path().join(stream_file_name("u")).exists());
    assert_close(&want, &cold(&m, &pool, stream, &prompt), "the view of the mapped stream = cold");
    let s = p.dual_stats();
    assert_eq!((s.streams_saved, s.anchors_prefilled), (1, 1), "{s:?}");

    // A new fact: appended in RAM (the mapped partial block copied on write), saved again.
    p.set_facts("u", vec![fact(&m, 1, "Ann keeps bees"), fact(&m, 2, "Ann lives in Oslo")]);
    let after = first_logits(&m, &pool, &mut p, "t9", &prompt);
    p.flush();
    assert_eq!(first_logits(&m, &pool, &mut p, "t1", &prompt), after, "a thread re-forks the mapped stream: the same logits");
    let stream = p.persistent("u").unwrap();
    assert!(stream.kv().unwrap().blocks().iter().all(|b| b.is_mapped()));
    assert_close(&after, &cold(&m, &pool, stream, &prompt), "after an append");
    assert_eq!(p.dual_stats().streams_saved, 2);
}

#[test]
fn a_restart_restores_the_stream_from_its_file_and_refuses_bad_files() {
    let (_d, m) = tiny();
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&m, KvFormat::F32);
    let facts = || vec![fact(&m, 1, "Ann keeps bees"), fact(&m, 2, "Ann lives in Oslo")];
    let prompt = ids(&m, " User: who am I? Assistant:");
    let mut p = policy(&m, &pool, dir.path(), 256, facts());
    let want = first_logits(&m, &pool, &mut p, "t", &prompt);
    let len = p.persistent("u").unwrap().len();
    drop(p);
    let file = dir.path().join(stream_file_name("u"));
    let good = std::fs::read(&file).unwrap();
    let good_tokens = engram_kv::read_meta(&file).unwrap().meta.tokens;

    // Restored: nothing prefilled, the same logits bitwise.
    let mut p = policy(&m, &pool, dir.path(), 256, facts());
    assert_eq!(first_logits(&m, &pool, &mut p, "t", &prompt), want);
    let s = p.dual_stats();
    assert_eq!((s.anchors_prefilled, s.streams_restored, s.stream_tokens_restored, s.streams_saved), (0, 1, len as u64, 0), "{s:?}");
    assert!(p.persistent("u").unwrap().kv().unwrap().blocks().iter().all(|b| b.is_mapped()));
    drop(p);

    // Another user's file under this user's name, and one of another KV format.
    let mut v = DualStream::new(m.clone(), pool.clone(), 256).with_dir(dir.path().join("v")).unwrap();
    v.set_anchors("v", m.tokenizer.encode("System: answer in one line.", true).unwrap().ids);
    v.set_facts("v", facts());
    v.admit_tokens("v", Some("t"), &prompt, &m.tokenizer).unwrap();
    drop(v);
    let foreign = std::fs::read(dir.path().join("v").join(stream_file_name("v"))).unwrap();
    let f16 = {
        let d16 = tempfile::tempdir().unwrap();
        let pool16 = self::pool(&m, KvFormat::F16);
        let mut p = policy(&m, &pool16, d16.path(), 256, facts());
        first_logits(&m, &pool16, &mut p, "t", &prompt);
        drop(p);
        std::fs::read(d16.path().join(stream_file_name("u"))).unwrap()
    };
    let mut flipped = good.clone();
    let at = flipped.len() - 100;
    flipped[at] ^= 0x40;
    let damages: Vec<(&str, Vec<u8>)> = vec![
        ("bit flip in the KV", flipped),
        ("truncated", good[..good.len() / 2].to_vec()),
        ("empty", Vec::new()),
        ("another user's", foreign),
        ("another KV format's", f16),
    ];
    for (what, bytes) in damages {
        std::fs::write(&file, &bytes).unwrap();
        let mut p = policy(&m, &pool, dir.path(), 256, facts());
        assert_eq!(first_logits(&m, &pool, &mut p, "t", &prompt), want, "{what}: the answer is the prefilled stream's");
        p.flush();
        let s = p.dual_stats();
        assert_eq!((s.stream_files_refused, s.anchors_prefilled, s.streams_restored, s.streams_saved), (1, 1, 0, 1), "{what}: {s:?}");
        drop(p);
        assert_eq!(engram_kv::read_meta(&file).unwrap().meta.tokens, good_tokens, "{what}: the file is written again");
    }

    // Stale: the log now holds another fact 2 (superseded while down): only the prefix that
    // agrees (base and fact 1) comes from the file, the rest is prefilled; the view = cold.
    let mut p = policy(&m, &pool, dir.path(), 256, vec![fact(&m, 1, "Ann keeps bees"), fact(&m, 3, "Ann lives in Rome")]);
    let got = first_logits(&m, &pool, &mut p, "t", &prompt);
    p.flush();
    let stream = p.persistent("u").unwrap();
    let agree = stream.segments()[0].tokens.len() + stream.segments()[1].tokens.len();
    let s = p.dual_stats();
    assert_eq!((s.streams_restored, s.anchors_prefilled, s.streams_saved), (1, 1, 1), "{s:?}");
    assert!(s.stream_tokens_restored as usize >= agree && (s.stream_tokens_restored as usize) < stream.len(), "{s:?}");
    assert_close(&got, &cold(&m, &pool, stream, &prompt), "a stale file's agreeing prefix + the prefilled rest = cold");
}

/// Runs `prompts` as turns of thread "t"; with `restart_after`, the policy is dropped after
/// that many turns (its writer flushed) and a new one over the same directory goes on.
fn conversation(
    m: &Arc<Model>,
    dir: &Path,
    capacity: usize,
    prompts: &[Vec<u32>],
    restart_after: Option<usize>,
) -> (Vec<Vec<u32>>, Vec<Vec<f32>>, DualStream) {
    let pool = pool(m, KvFormat::F32);
    let mut p = policy(m, &pool, dir, capacity, vec![fact(m, 1, "Ann keeps bees")]);
    let (mut answers, mut logits) = (Vec::new(), Vec::new());
    for (i, prompt) in prompts.iter().enumerate() {
        if restart_after == Some(i) {
            p.flush();
            drop(p);
            p = policy(m, &pool, dir, capacity, vec![fact(m, 1, "Ann keeps bees")]);
        }
        let (a, l) = turn(m, &pool, &mut p, "t", prompt);
        answers.push(a);
        logits.push(l);
    }
    p.flush();
    (answers, logits, p)
}

fn prompts(m: &Model, n: usize) -> Vec<Vec<u32>> {
    let topics = ["bees", "a KV cache", "sourdough", "Oslo", "lifetimes", "the weather"];
    (0..n).map(|i| ids(m, &format!(" User: tell me about {} ({i}). Assistant:", topics[i % topics.len()]))).collect()
}

#[test]
fn a_conversation_continued_after_a_restart_answers_as_without_it() {
    let (_d, m) = tiny();
    let ps = prompts(&m, 8);
    // A ring small enough that turns are evicted and moved before and after the restart.
    for capacity in [40, 1024] {
        let (d1, d2) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (want, want_logits, _) = conversation(&m, d1.path(), capacity, &ps, None);
        let (got, got_logits, p) = conversation(&m, d2.path(), capacity, &ps, Some(4));
        assert_eq!(got, want, "capacity {capacity}: answers after the restart");
        assert_eq!(got_logits, want_logits, "capacity {capacity}: logits bitwise");
        let s = p.dual_stats();
        assert_eq!((s.rings_restored, s.ring_files_refused), (1, 0), "{s:?}");
        assert!(s.turns_restored >= 1, "{s:?}");
        if capacity == 40 {
            assert!(s.turns_evicted > 0, "{s:?}: the small ring evicts");
        }
    }

    // With nothing evicted, the continued turn is a cold run over the whole window: the stream,
    // every earlier turn (each with its answer's fed tokens, the last answer's unfed token
    // carried into the next prompt) and the prompt.
    let d = tempfile::tempdir().unwrap();
    let (answers, logits, p) = conversation(&m, d.path(), 1024, &ps[..5], Some(3));
    let pool = pool(&m, KvFormat::F32);
    let mut window: Vec<u32> = Vec::new();
    let mut carry = None;
    for (prompt, answer) in ps[..4].iter().zip(&answers) {
        window.extend(carry.into_iter().chain(prompt.iter().copied()).chain(answer[..ANSWER - 1].iter().copied()));
        carry = Some(answer[ANSWER - 1]);
    }
    window.extend(carry.into_iter().chain(ps[4].iter().copied()));
    assert_close(&logits[4], &cold(&m, &pool, p.persistent("u").unwrap(), &window), "the restored window = cold");
}

#[test]
fn a_damaged_ring_file_starts_the_thread_empty_never_wrong() {
    let (_d, m) = tiny();
    let ps = prompts(&m, 4);
    let pool = pool(&m, KvFormat::F32);
    // What a fresh thread answers to the last prompt (no earlier turns, no carry).
    let fresh = {
        let d = tempfile::tempdir().unwrap();
        let mut p = policy(&m, &pool, d.path(), 1024, vec![fact(&m, 1, "Ann keeps bees")]);
        turn(&m, &pool, &mut p, "t", &ps[3]).0
    };
    type Damage = fn(&Path);
    let flip_turn: Damage = |dir| {
        let f = files(dir, ".safetensors").into_iter().find(|f| !f.file_name().unwrap().to_str().unwrap().starts_with("stream-")).unwrap();
        let mut b = std::fs::read(&f).unwrap();
        let at = b.len() - 64;
        b[at] ^= 1;
        std::fs::write(&f, b).unwrap();
    };
    let truncate_manifest: Damage = |dir| {
        let f = &files(dir, ".ring")[0];
        let b = std::fs::read(f).unwrap();
        std::fs::write(f, &b[..b.len() - 10]).unwrap();
    };
    let delete_turn: Damage = |dir| {
        let f = files(dir, ".safetensors").into_iter().find(|f| !f.file_name().unwrap().to_str().unwrap().starts_with("stream-")).unwrap();
        std::fs::remove_file(f).unwrap();
    };
    for (what, damage) in
        [("a bit flip in a turn's KV", flip_turn), ("a truncated manifest", truncate_manifest), ("a missing turn file", delete_turn)]
    {
        let d = tempfile::tempdir().unwrap();
        let (_, _, p) = conversation(&m, d.path(), 1024, &ps[..3], None);
        drop(p);
        damage(d.path());
        let mut p = policy(&m, &pool, d.path(), 1024, vec![fact(&m, 1, "Ann keeps bees")]);
        // A bit flip passes every check but the checksum: the admission hands the ring out with
        // its check running, and verify_restore refuses it (the scheduler then admits the job
        // again); the others are refused at admission.
        let mut c = p.admit_tokens("u", Some("t"), &ps[3], &m.tokenizer).unwrap();
        let by_checksum = what.starts_with("a bit flip");
        assert_eq!(c.restore.is_some(), by_checksum, "{what}: a restore still to verify");
        if let Some(r) = c.restore.take() {
            assert!(!p.verify_restore(r), "{what}: verify_restore refuses the damaged ring");
        }
        drop(c);
        assert_eq!(turn(&m, &pool, &mut p, "t", &ps[3]).0, fresh, "{what}: the thread starts empty");
        let s = p.dual_stats();
        assert_eq!((s.ring_files_refused, s.rings_restored), (1, 0), "{what}: {s:?}");
        p.flush();
        drop(p);
        // The thread's files were replaced by the new turn's: the next restart restores it.
        let mut p = policy(&m, &pool, d.path(), 1024, vec![fact(&m, 1, "Ann keeps bees")]);
        turn(&m, &pool, &mut p, "t", &ps[0]);
        let s = p.dual_stats();
        assert_eq!((s.ring_files_refused, s.rings_restored, s.turns_restored), (0, 1, 1), "{what}: {s:?}");
    }
}

fn files(dir: &Path, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().ends_with(suffix))
        .collect();
    out.sort();
    out
}
