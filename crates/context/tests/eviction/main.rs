//! A state machine over the session store and the KV store: random runs of
//! checkouts (EXTEND / DIVERGE / EXACT / new) whose prompts go through the `tiny` model and are
//! checked in, forks, truncations, moves of slots to new positions (`SeqKv::move_slots`), views
//! over a held sequence's spans, `SessionStore::make_room` (the one RAM eviction path) and,
//! with a disk tier, restarts that drop every RAM session so later checkouts restore them
//! from their files — all in a pool whose budget is a few sessions' worth.
//!
//! After every operation:
//! 1. `pool.used()` equals the bytes of the distinct live blocks (and recent windows). The
//!    test sees the blocks of every session (`sessions_of`) and of every sequence it holds;
//!    the prefix index only says how many entries it has. A block's `Arc::strong_count` minus
//!    the references the test knows of is the number of index entries holding it (0 or 1,
//!    asserted), so distinct blocks = blocks seen + index entries − index entries that hold a
//!    block seen. The persistence thread's forks are gone after `flush()`, which runs first.
//! 2. `pool.used() <= pool.budget()`.
//! 3. Every answer equals a cold run over the same tokens at the same positions on a fresh
//!    sequence in another pool (f32 KV: last-prompt-token logits within 1e-5 relative, greedy
//!    tokens equal): after each checkout, after a sequence is extended, after a move that
//!    keeps every token's relative distances (a whole-sequence shift), and through a view.
//!
//! `make_room` is checked as the policy it documents: nothing evicted when the bytes already
//! fit; idle prefix blocks first (exactly `ceil(missing / block)` of them when they suffice,
//! no session touched); sessions least recently used first; offloaded to the disk tier, not
//! forgotten; `false` only when nothing evictable is left; `true` only when the bytes fit —
//! and a reservation of at most those bytes then succeeds. A move never changes a sequence
//! that shares its blocks (every other sequence's rows compared bitwise).
//!
//! A q8 run checks the accounting with recent windows (charged per distinct window; answers
//! are not compared there: reused q8 KV is not bitwise a cold run's).

#[path = "../common/mod.rs"]
mod common;
mod machine;
mod support;

use std::cell::RefCell;

use common::model;
use engram_context::MatchKind;
use engram_kv::{KvFormat, SeqKv, BLOCK_TOKENS};
use machine::Machine;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use support::{op, How, Stats, OWNERS};

/// Runs `cases` random sequences of operations in `format` under a budget of `budget_blocks`
/// blocks, half of them with a disk tier; returns what happened.
fn run_machine(format: KvFormat, budget_blocks: usize, cases: u32) -> Stats {
    let total = RefCell::new(Stats::default());
    // PROPTEST_CASES=n runs more (or fewer) cases, as with `proptest!`.
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 256, ..Config::default() };
    // A fixed seed: the coverage asserted below (every kind of checkout, restores, moves) is
    // then the same on every run, not a matter of luck.
    let mut runner =
        TestRunner::new_with_rng(config, proptest::test_runner::TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha));
    let strategy = (any::<bool>(), proptest::collection::vec(op(), 1..=30));
    let result = runner.run(&strategy, |(disk, ops)| {
        let mut machine = Machine::new(format, budget_blocks, disk);
        machine.check(&[]);
        for op in &ops {
            machine.apply(op);
        }
        let stats = std::mem::take(&mut machine.stats);
        drop(machine);
        total.borrow_mut().add(stats);
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    total.into_inner()
}

#[test]
fn random_operations_keep_the_budget_the_byte_count_and_cold_answers() {
    let t = std::time::Instant::now();
    let s = run_machine(KvFormat::F32, 7, 32);
    eprintln!("f32: {s:#?}\n({:.1} s)", t.elapsed().as_secs_f32());
    // The interesting paths were taken, across the cases.
    assert!(s.sessions_evicted > 0 && s.index_evicted > 0 && s.used_dropped > 0, "eviction happened: {s:?}");
    assert!(s.restores > 0 && s.restarts > 0, "sessions were restored from disk: {s:?}");
    assert!(s.moves > 0 && s.views > 0 && s.cold_compared > s.turns, "{s:?}");
    for kind in ["exact", "extend", "diverge", "prefix"] {
        assert!(s.kinds.get(kind).copied().unwrap_or(0) > 0, "no {kind} checkout: {s:?}");
    }
}

#[test]
fn random_operations_keep_the_byte_count_with_recent_windows() {
    let t = std::time::Instant::now();
    let s = run_machine(KvFormat::Q8, 7, 16);
    eprintln!("q8: {s:#?}\n({:.1} s)", t.elapsed().as_secs_f32());
    assert!(s.sessions_evicted > 0 && s.used_dropped > 0, "eviction happened: {s:?}");
}

/// The byte count is not vacuous: a fork of a session's blocks that the census is not told
/// about (a leaked holder) makes `check` fail.
#[test]
fn the_byte_count_notices_a_holder_it_was_not_told_about() {
    let mut mc = Machine::new(KvFormat::F32, 64, false);
    mc.turn(0, How::New, 3, 4);
    mc.check(&[]);
    let s = mc.store.sessions_of(OWNERS[0]).next().unwrap();
    assert!(!s.kv.len().is_multiple_of(BLOCK_TOKENS), "a partial last block (not in the prefix index)");
    let mut hidden = s.kv.fork(s.kv.len());
    hidden.reserve(1).unwrap(); // copies the shared partial block: bytes nobody else holds
    let leaked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mc.check(&[])));
    assert!(leaked.is_err(), "a sequence the census does not see must break the count");
    mc.check(&[&hidden]);
    let shared = {
        let s = mc.store.sessions_of(OWNERS[0]).next().unwrap();
        s.kv.fork(s.kv.len())
    };
    let leaked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mc.check(&[&hidden])));
    assert!(leaked.is_err(), "a hidden second holder of a session's blocks must break the count");
    drop(shared);
    mc.check(&[&hidden]);
}

/// A session offloaded to disk whose restore does not fit the RAM budget at that moment
/// (the pool is full of running sequences) must stay restorable once RAM frees up:
/// "offloaded to disk, not forgotten".
#[test]

fn a_restore_refused_by_the_ram_budget_leaves_the_session_restorable() {
    let mut mc = Machine::new(KvFormat::F32, 12, true);
    mc.turn(0, How::New, 0, 2);
    let text = mc.texts[0].clone();
    let blocks = mc.store.sessions_of(OWNERS[0]).next().unwrap().kv.blocks().len();
    assert!(blocks >= 2);
    // Offload everything: the session goes to disk.
    assert!(mc.make_room(mc.pool.budget(), &[]));
    assert_eq!(mc.store.on_disk_count(), 1);
    // Running sequences fill the pool but for one block: the session's blocks do not fit.
    let bb = mc.pool.block_bytes();
    let mut hog = SeqKv::new(&mc.pool);
    hog.reserve((mc.pool.budget() - mc.pool.used()) / bb * BLOCK_TOKENS - BLOCK_TOKENS).unwrap();
    let next = format!("{text}turn ");
    let co = mc.store.checkout(OWNERS[0], None, &next, true, &model().tokenizer).unwrap();
    assert!(co.restore.is_none(), "the restore cannot fit");
    drop(co);
    drop(hog);
    assert_eq!(mc.store.on_disk_count(), 1, "the session is still on disk and in the catalog after a refused restore");
    let mut co = mc.store.checkout(OWNERS[0], None, &next, true, &model().tokenizer).unwrap();
    if let Some(p) = co.restore.take() {
        assert!(mc.store.verify_restore(p));
    }
    assert_eq!(co.kind, MatchKind::Extend, "restored once RAM is free");
}

/// A restore makes room first. With other owners' idle sessions filling the
/// RAM budget, an offloaded session that matches is restored — the idle ones offloaded in its
/// place — rather than missing.
#[test]
fn a_restore_offloads_idle_sessions_to_make_room() {
    let mut mc = Machine::new(KvFormat::F32, 12, true);
    mc.turn(0, How::New, 0, 2);
    let text = mc.texts[0].clone();
    let bb = mc.pool.block_bytes();
    let need = mc.store.sessions_of(OWNERS[0]).next().unwrap().kv.blocks().len() * bb;
    assert!(mc.make_room(mc.pool.budget(), &[]));
    assert_eq!(mc.store.on_disk_count(), 1);
    let mut turns = 0;
    while mc.pool.budget() - mc.pool.used() >= need {
        mc.turn(1 + turns % 2, How::Extend, turns, 2);
        turns += 1;
        assert!(turns < 60, "idle sessions never filled the pool");
    }
    let next = format!("{text}turn ");
    let mut co = mc.store.checkout(OWNERS[0], None, &next, true, &model().tokenizer).unwrap();
    let p = co.restore.take().expect("restored after offloading idle sessions");
    assert!(mc.store.verify_restore(p));
    assert_eq!(co.kind, MatchKind::Extend);
    assert!(mc.pool.used() <= mc.pool.budget());
}
