//! Dual-stream files off the engine thread and under the disk budget:
//! - a user's stream file is written by a background writer: a burst of facts answers at once
//!   on the stream in RAM, the file then holds the last generation, mapped, and the answer on
//!   the mapped stream is bitwise the one before the swap; a torn temp file a crash left is
//!   never read, and a forgotten user's queued write leaves no file;
//! - with a disk budget, the files stay within it once written (the least recently used
//!   threads' rings deleted; an active user's stream kept), every answer equals an unbudgeted
//!   policy's, and after a restart the recent threads restore while the evicted ones start empty;
//! - idle users' stream files are evicted too when the rings are not enough: the answers do not
//!   change, and after a restart an evicted stream is prefilled again and answers as the
//!   unbudgeted policy's mapped one.

use crate::common;
use common::{dual_turn, fact, ids, tiny};

use std::path::Path;
use std::sync::Arc;

use engram_dual::stream_file_name;
use engram_dual::DualStream;
use engram_engine::ContextPolicy;
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;

const ANSWER: usize = 4;

fn pool(m: &Model) -> KvPool {
    KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20)
}

fn policy(m: &Arc<Model>, pool: &KvPool, dir: &Path) -> DualStream {
    let mut p = DualStream::new(m.clone(), pool.clone(), 1024).with_dir(dir).unwrap();
    p.set_anchors("u", m.tokenizer.encode("System: answer in one line.", true).unwrap().ids);
    p
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir).unwrap().flatten().map(|e| e.metadata().unwrap().len()).sum()
}

#[test]
fn stream_files_are_written_off_the_engine_thread_and_swapped_in_whole() {
    let (_d, m) = tiny();
    let dir = tempfile::tempdir().unwrap();
    let pool = pool(&m);
    let mut p = policy(&m, &pool, dir.path());
    let prompt = ids(&m, " User: who am I? Assistant:");
    let mut facts = Vec::new();
    // A burst of facts, a turn after each: each answered on the stream as it is in RAM.
    for (i, text) in ["Ann keeps bees", "Ann lives in Oslo", "Ann rows", "Ann bakes"].iter().enumerate() {
        facts.push(fact(&m, i as u64 + 1, text));
        p.set_facts("u", facts.clone());
        dual_turn(&m, &pool, &mut p, "u", &format!("t{i}"), &prompt, ANSWER);
    }
    let before = p.dual_stats();
    let ram = dual_turn(&m, &pool, &mut p, "u", "probe-ram", &prompt, ANSWER);
    p.flush();
    let s = p.dual_stats();
    assert!(s.streams_queued >= 4 && s.streams_saved >= 1 && s.streams_saved <= s.streams_queued, "{before:?} then {s:?}");
    let stream = p.persistent("u").unwrap();
    assert!(stream.kv().unwrap().blocks().iter().all(|b| b.is_mapped()), "the last generation is the file's pages");
    let file = dir.path().join(stream_file_name("u"));
    assert_eq!(engram_kv::read_meta(&file).unwrap().meta.tokens, stream.tokens(), "the file holds the last generation");
    let mapped = dual_turn(&m, &pool, &mut p, "u", "probe-mapped", &prompt, ANSWER);
    assert_eq!(mapped, ram, "the same answer and logits on the mapped stream as on the RAM one");
    drop(p);

    // A crash mid-write leaves a temp file beside the last good one: never read as the stream.
    let good = std::fs::read(&file).unwrap();
    std::fs::write(dir.path().join(format!(".{}.tmp-1-0", stream_file_name("u"))), &good[..good.len() / 3]).unwrap();
    let mut p = policy(&m, &pool, dir.path());
    p.set_facts("u", facts.clone());
    assert_eq!(dual_turn(&m, &pool, &mut p, "u", "probe-restart", &prompt, ANSWER), ram, "restored from the good file");
    let s = p.dual_stats();
    assert_eq!((s.streams_restored, s.anchors_prefilled, s.stream_files_refused), (1, 0, 0), "{s:?}");

    // A forgotten user's write still queued: the deletion follows it, no file is left.
    p.set_facts("u", vec![fact(&m, 9, "Ann moved")]);
    dual_turn(&m, &pool, &mut p, "u", "t0", &prompt, ANSWER);
    p.forget_owner(&"u".into());
    p.flush();
    assert!(!file.exists(), "a forgotten user's stream file is deleted after its queued write");
}

#[test]
fn the_dual_files_stay_within_the_disk_budget_and_answers_do_not_change() {
    let (_d, m) = tiny();
    let pool = pool(&m);
    let topics = ["bees", "a KV cache", "sourdough", "Oslo", "rowing", "lifetimes"];
    let ps: Vec<Vec<u32>> = topics.iter().map(|t| ids(&m, &format!(" User: tell me about {t}. Assistant:"))).collect();
    // Six threads, two turns each, the threads taking turns: t0 is the least recently used.
    let script: Vec<(String, &Vec<u32>)> = (0..12).map(|i| (format!("t{}", i % 6), &ps[(i + i / 6) % ps.len()])).collect();
    let run = |p: &mut DualStream| -> Vec<Vec<u32>> {
        script.iter().map(|(t, prompt)| dual_turn(&m, &pool, p, "u", t, prompt, ANSWER).0).collect()
    };
    let free = tempfile::tempdir().unwrap();
    let mut unbudgeted = policy(&m, &pool, free.path());
    let want = run(&mut unbudgeted);
    unbudgeted.flush();
    let all = dir_bytes(free.path());
    let stream = std::fs::metadata(free.path().join(stream_file_name("u"))).unwrap().len();
    // Room for the stream and about half the rings.
    let budget = stream + (all - stream) / 2;

    let dir = tempfile::tempdir().unwrap();
    let mut p = policy(&m, &pool, dir.path());
    p.set_disk_budget(budget, None);
    assert_eq!(run(&mut p), want, "answers with the budget = without (rings in RAM are untouched)");
    p.flush();
    let s = p.dual_stats();
    assert!(s.rings_evicted_for_disk > 0, "{s:?}");
    assert!(dir_bytes(dir.path()) <= budget, "{} bytes on disk past the {budget}-byte budget", dir_bytes(dir.path()));
    assert!(p.disk_bytes_charged() <= budget);
    assert!(dir.path().join(stream_file_name("u")).exists(), "the active user's stream is not the least recently used");
    assert_eq!(s.streams_evicted_for_disk, 0, "{s:?}");
    drop(p);

    // After a restart: the most recent thread restores its two turns, the oldest starts empty.
    let mut p = policy(&m, &pool, dir.path());
    p.set_disk_budget(budget, None);
    dual_turn(&m, &pool, &mut p, "u", "t5", &ps[0], ANSWER);
    dual_turn(&m, &pool, &mut p, "u", "t0", &ps[0], ANSWER);
    let s = p.dual_stats();
    assert_eq!((s.rings_restored, s.turns_restored, s.ring_files_refused), (1, 2, 0), "{s:?}");
}

#[test]
fn idle_users_stream_files_are_evicted_past_the_budget_and_rebuilt_with_the_same_answers() {
    let (_d, m) = tiny();
    let pool = pool(&m);
    let users = ["ann", "bob", "cy", "dee"];
    let prompt = ids(&m, " User: what do you know about me? Assistant:");
    let setup = |p: &mut DualStream| {
        for (i, u) in users.iter().enumerate() {
            p.set_anchors(u, ids(&m, &format!("System: you are talking to {u}; answer in one line.")));
            p.set_facts(u, (1..=3).map(|f| fact(&m, f, &format!("{u} likes number {}", i as u64 * 10 + f))).collect());
        }
    };
    let turns = |p: &mut DualStream, thread: &str| -> Vec<Vec<u32>> {
        users.iter().map(|u| dual_turn(&m, &pool, p, u, thread, &prompt, ANSWER).0).collect()
    };
    let open = |dir: &Path, budget: Option<u64>| {
        let mut p = DualStream::new(m.clone(), pool.clone(), 1024).with_dir(dir).unwrap();
        setup(&mut p);
        if let Some(b) = budget {
            p.set_disk_budget(b, None);
        }
        p
    };
    let free = tempfile::tempdir().unwrap();
    let mut unbudgeted = open(free.path(), None);
    let want = turns(&mut unbudgeted, "t");
    unbudgeted.flush();
    drop(unbudgeted);
    // Room for about half the files: the rings alone are not enough.
    let budget = dir_bytes(free.path()) / 2;

    let dir = tempfile::tempdir().unwrap();
    let mut p = open(dir.path(), Some(budget));
    assert_eq!(turns(&mut p, "t"), want, "answers with the budget = without");
    p.flush();
    p.flush();
    let s = p.dual_stats();
    assert!(s.streams_evicted_for_disk > 0 && s.rings_evicted_for_disk > 0, "{s:?}");
    assert!(dir_bytes(dir.path()) <= budget, "{} bytes on disk past the {budget}-byte budget", dir_bytes(dir.path()));
    let evicted: Vec<&str> = users.iter().copied().filter(|u| !dir.path().join(stream_file_name(u)).exists()).collect();
    assert!(!evicted.is_empty());
    drop(p);

    // After a restart, a new thread of every user: evicted streams are prefilled again, the
    // others mapped from their files; the answers are the unbudgeted policy's.
    let mut unbudgeted = open(free.path(), None);
    let want = turns(&mut unbudgeted, "t2");
    assert_eq!(unbudgeted.dual_stats().streams_restored, users.len() as u64);
    let mut p = open(dir.path(), Some(budget));
    assert_eq!(turns(&mut p, "t2"), want, "rebuilt streams answer as the mapped ones");
    let s = p.dual_stats();
    // (Files evicted during this run too, before their user's turn, are prefilled as well.)
    assert!(s.streams_restored <= (users.len() - evicted.len()) as u64, "{s:?}: the evicted streams were prefilled");
}
