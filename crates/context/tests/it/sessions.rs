//! Every reuse path — EXACT, EXTEND, DIVERGE, shared prefix — against a cold
//! run over the same tokens: same greedy tokens, logits within tolerance
//! (invariant 1), for f32 and f16 KV; plus a property test over random
//! conversations with edits, evictions under a tiny budget and sessions
//! sharing prefixes.

use crate::common;
use common::model;
use engram_context::{MatchKind, SessionStore};
use engram_engine::{LoneSequence, SamplingParams};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use proptest::prelude::*;

/// An f32 session store over `pool` with a 64 MiB disk tier in `dir`: what a
/// (re)started process opens.
fn open_with_disk(pool: &KvPool, dir: &std::path::Path, policy: engram_kv::EvictionPolicy) -> SessionStore {
    let m = model();
    let fp = engram_kv::cache_fingerprint(m.fingerprint, KvFormat::F32);
    let disk = engram_context::PersistedSessions::open(dir, 64 << 20, policy, fp).unwrap();
    SessionStore::new(pool.clone(), m.fingerprint).with_disk(disk, m.config.vocab)
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams { max_tokens: n, ignore_eos: true, ..Default::default() }
}

/// The last token's logits of a scored run.
fn last_row(m: &Model, mut logits: Vec<f32>) -> Vec<f32> {
    logits.split_off(logits.len() - m.config.vocab)
}

fn rel(a: &[f32], b: &[f32]) -> f32 {
    let s = b.iter().fold(0f32, |m, x| m.max(x.abs()));
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / s
}

/// One turn through the store; checks it against a cold run and returns (kind, reused, generated text).
fn turn(store: &mut SessionStore, owner: &str, text: &str, n: usize) -> (MatchKind, usize, String) {
    turn_on(model(), store, owner, text, n)
}

/// [`turn`] on model `m` (the store's model).
pub(crate) fn turn_on(m: &Model, store: &mut SessionStore, owner: &str, text: &str, n: usize) -> (MatchKind, usize, String) {
    let mut co = store.checkout(owner, None, text, true, &m.tokenizer).unwrap();
    // A session restored from disk is verified here, before its results are used.
    if let Some(p) = co.restore.take() {
        assert!(store.verify_restore(p), "a sound session file failed its checksum");
    }
    // The tokens a cold request computes for this text, whatever was reused.
    assert_eq!(co.tokens, m.tokenizer.encode(text, true).unwrap().ids, "{owner}: tokens differ from the text's own");
    let (kind, reused, sid) = (co.kind, co.reused, co.session_id.clone());
    if std::env::var("DBG").is_ok() {
        eprintln!(
            "{owner} {kind:?} reused {reused}/{} sid {sid} ends {:?}",
            co.tokens.len(),
            &co.token_ends[..co.token_ends.len().min(12)]
        );
    }
    // Hot: logits of the last prompt token from the reused cache.
    let mut hot = LoneSequence::from_parts(m, co.kv, co.tokens[..reused].to_vec());
    let keep = reused.min(co.tokens.len() - 1);
    hot.truncate(keep);
    let hot_logits = last_row(m, hot.score(&co.tokens[keep..]).unwrap());
    let mut cold = LoneSequence::new(m, store.pool());
    let cold_logits = last_row(m, cold.score(&co.tokens).unwrap());
    let err = rel(&hot_logits, &cold_logits);
    assert!(err < 1e-5, "{kind:?} reused {reused}: logits differ from cold by {err}");
    // Greedy continuation from both.
    hot.truncate(keep);
    let g = hot.generate(&co.tokens, &greedy(n), &mut |_| true).unwrap();
    let c = LoneSequence::new(m, store.pool()).generate(&co.tokens, &greedy(n), &mut |_| true).unwrap();
    assert_eq!(g.tokens, c.tokens, "{kind:?}: hot and cold greedy tokens differ");
    let (kv, cached) = hot.into_parts();
    let mut tokens = co.tokens.clone();
    tokens.extend(&g.tokens);
    let mut ends = co.token_ends.clone();
    ends.extend(g.token_ends.iter().map(|e| e + text.len()));
    assert!(cached.len() <= tokens.len() && tokens.starts_with(&cached));
    store.checkin(owner, &sid, format!("{text}{}", g.text), tokens, ends, kv);
    (kind, reused, g.text)
}

/// A diverging text whose first new character merges with the last common token (" 1" then
/// "0" is " 10"): the reuse stops before that token, so the prompt is the text's own
/// tokenization and the answer a cold one. (Found by the soak test: clients "Client 1" and
/// "Client 10" of one tenant got answers a cold server did not give.)
#[test]
fn a_merge_across_the_reuse_boundary_is_not_split() {
    let pool = KvPool::new(KvLayout::of(&model().config), KvFormat::F32, 64 << 20);
    let mut store = SessionStore::new(pool, model().fingerprint);
    turn(&mut store, "o", "System: you are Client 1 of the cache tests. User: hello", 4);
    let (kind, reused, _) = turn(&mut store, "o", "System: you are Client 10 of the cache tests. User: hello", 4);
    assert_eq!(kind, MatchKind::Diverge);
    assert!(reused > 0);
}

#[test]
fn exact_extend_diverge_and_shared_prefix_equal_cold() {
    let m = model();
    for format in [KvFormat::F32, KvFormat::F16] {
        let pool = KvPool::new(KvLayout::of(&m.config), format, 256 << 20);
        // Sharing across tenants opted into: bob's turn below reuses alice's prefix blocks.
        let mut store = SessionStore::new(pool, m.fingerprint).with_shared_prefixes_across_tenants(true);
        let system = "You are a careful assistant who keeps every fact about the user's week. ".repeat(3);
        let t1 = format!("{system}User: plan my Monday.\nAssistant:");
        let (k1, r1, out1) = turn(&mut store, "alice", &t1, 8);
        assert_eq!((k1, r1), (MatchKind::Miss, 0));
        // EXTEND: the client resends the conversation plus a new message.
        let t2 = format!("{t1}{out1}\nUser: and Tuesday?\nAssistant:");
        let (k2, r2, out2) = turn(&mut store, "alice", &t2, 8);
        assert_eq!(k2, MatchKind::Extend, "{format:?}");
        assert!(r2 > 20, "reused {r2}");
        // EXACT: the same text again.
        let t2b = format!("{t2}{out2}");
        let (k3, _, _) = turn(&mut store, "alice", &t2b, 4);
        assert_eq!(k3, MatchKind::Exact);
        // DIVERGE: an edit of the last user message.
        let t3 = format!("{t1}{out1}\nUser: and Wednesday instead?\nAssistant:");
        let (k4, r4, _) = turn(&mut store, "alice", &t3, 4);
        assert_eq!(k4, MatchKind::Diverge);
        assert!(r4 > 20);
        // Another owner with the same system prompt: shared prefix blocks, not alice's session.
        let (k5, r5, _) = turn(&mut store, "bob", &format!("{system}User: hello\nAssistant:"), 4);
        assert_eq!(k5, MatchKind::Prefix, "{format:?}");
        assert!(r5 >= 32 && r5 % 32 == 0, "whole blocks: {r5}");
    }
}

#[test]
fn eviction_under_a_tiny_budget_keeps_answers_exact() {
    let m = model();
    let layout = KvLayout::of(&m.config);
    let bb = KvPool::new(layout, KvFormat::F32, 0).block_bytes();
    let pool = KvPool::new(layout, KvFormat::F32, 12 * bb);
    let mut store = SessionStore::new(pool.clone(), m.fingerprint);
    for i in 0..6 {
        let text = format!("Conversation {i}: tell me about blocks, budgets and eviction order number {i}.");
        let co = store.checkout("u", None, &text, true, &m.tokenizer).unwrap();
        drop(co);
        assert!(store.make_room(6 * bb), "room for a new turn");
        turn(&mut store, "u", &text, 4);
        assert!(pool.used() <= pool.budget());
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    /// Random turns: extend, edit an earlier part, repeat, switch owner; under a small budget.
    #[test]
    fn random_conversations_match_cold(ops in proptest::collection::vec((0u8..4, 0usize..5, 0u8..2), 1..7)) {
        let m = model();
        let layout = KvLayout::of(&m.config);
        let bb = KvPool::new(layout, KvFormat::F16, 0).block_bytes();
        let pool = KvPool::new(layout, KvFormat::F16, 40 * bb);
        let mut store = SessionStore::new(pool.clone(), m.fingerprint);
        let words = ["cache ", "block ", "turn ", "agent ", "é日本 "];
        let mut texts: Vec<String> = vec!["Start: ".into(), "Start: ".into()];
        for (op, w, owner) in ops {
            let o = owner as usize;
            let t = &mut texts[o];
            match op {
                0 | 1 => t.push_str(words[w]),
                2 => { let cut = t.char_indices().nth(t.chars().count() / 2).map(|(i, _)| i).unwrap_or(0); t.truncate(cut); t.push_str(words[w]); }
                _ => {}
            }
            if t.is_empty() { t.push_str("x"); }
            let text = t.clone();
            prop_assert!(store.make_room(8 * bb));
            let (_, _, out) = turn(&mut store, if o == 0 { "a" } else { "b" }, &text, 3);
            texts[o] = format!("{text}{out}");
            prop_assert!(pool.used() <= pool.budget());
        }
    }
}

#[test]
fn owners_never_share_sessions_and_empty_sessions_are_dropped() {
    let m = model();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let mut store = SessionStore::new(pool, m.fingerprint);
    let text = "A private conversation that only its owner may continue.";
    turn(&mut store, "alice", text, 4);
    // Same text, other owner: no session match (only whole shared prefix blocks could be reused).
    let co = store.checkout("mallory", None, text, true, &m.tokenizer).unwrap();
    assert!(matches!(co.kind, MatchKind::Miss | MatchKind::Prefix), "{:?}", co.kind);
    assert_eq!(store.sessions_of("mallory").count(), 0);
    // A named session of another owner is not found either.
    let alice_id = store.sessions_of("alice").next().unwrap().id.clone();
    let co = store.checkout("mallory", Some(&alice_id), text, true, &m.tokenizer).unwrap();
    assert_ne!(co.kind, MatchKind::Exact);
    // Checking in nothing keeps nothing.
    let kv = engram_kv::SeqKv::new(store.pool());
    store.checkin("bob", "empty", String::new(), Vec::new(), Vec::new(), kv);
    assert_eq!(store.sessions_of("bob").count(), 0);
    store.forget_owner("alice");
    assert_eq!(store.len(), 0);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..ProptestConfig::default() })]
    /// Random turns with restarts: the store is dropped (its sessions flushed
    /// to disk) and reopened; every turn still equals a cold run, and a turn
    /// right after a restart reuses the persisted session.
    #[test]
    fn conversations_survive_restarts(ops in proptest::collection::vec((0u8..3, 0usize..5), 2..7)) {
        let m = model();
        let dir = tempfile::tempdir().unwrap();
        let layout = KvLayout::of(&m.config);
        let pool = KvPool::new(layout, KvFormat::F32, 64 << 20);
        let open = || open_with_disk(&pool, dir.path(), engram_kv::EvictionPolicy::Lru);
        let mut store = open();
        let words = ["cache ", "block ", "turn ", "agent ", "é日本 "];
        let mut text = String::from("Start: ");
        let mut restarted = false;
        let mut turns = 0;
        for (op, w) in ops {
            match op {
                0 => text.push_str(words[w]),
                1 => { text.push_str(words[w]); text.push_str(words[(w + 1) % 5]); }
                _ => { drop(store); store = open(); restarted = turns > 0; text.push_str(words[w]); }
            }
            let (kind, reused, out) = turn(&mut store, "a", &text, 3);
            if restarted {
                prop_assert!(reused > 0 && kind == MatchKind::Extend, "after a restart: {kind:?} reused {reused}");
                prop_assert_eq!(store.restored_count(), 1);
                restarted = false;
            }
            text = format!("{text}{out}");
            turns += 1;
        }
    }
}

/// With sharing across tenants opted into, a system prompt shared by two owners is
/// persisted as a prefix chain; a restarted store gives a third owner those blocks
/// from disk, and the turn still equals a cold run. (Per-tenant chains:
/// `tests/it/tenants.rs`.)
#[test]
fn shared_prefix_chains_survive_a_restart() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let open = || open_with_disk(&pool, dir.path(), engram_kv::EvictionPolicy::Weighted).with_shared_prefixes_across_tenants(true);
    let system = "You are the assistant of a clinic; answer briefly and kindly, and never guess. ".repeat(3);
    let mut store = open();
    turn(&mut store, "alice", &format!("{system}User: hi\nAssistant:"), 3);
    let (kind, reused, _) = turn(&mut store, "bob", &format!("{system}User: hello\nAssistant:"), 3);
    assert_eq!(kind, MatchKind::Prefix);
    assert!(reused >= 64);
    drop(store);
    let mut store = open();
    let (kind, reused2, _) = turn(&mut store, "carol", &format!("{system}User: good morning\nAssistant:"), 3);
    assert_eq!(kind, MatchKind::Prefix, "restored from the persisted chain");
    assert_eq!(reused2, reused);
}

/// A session file whose KV bytes were damaged on disk: the restore hands out
/// its blocks at once, the checksum fails, the file is deleted, and the next
/// checkout recomputes cold.
#[test]
fn a_damaged_session_file_is_caught_and_recomputed() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let open = || open_with_disk(&pool, dir.path(), engram_kv::EvictionPolicy::Lru);
    let mut store = open();
    let text = "Notes: the meeting moved to Thursday at noon. ".repeat(4);
    let (_, _, out) = turn(&mut store, "a", &text, 4);
    drop(store);
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("session-"))
        .collect();
    assert_eq!(files.len(), 1);
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x08;
    std::fs::write(&files[0], &bytes).unwrap();

    let mut store = open();
    let next = format!("{text}{out} And Friday?");
    let co = store.checkout("a", None, &next, true, &m.tokenizer).unwrap();
    assert_eq!(co.kind, MatchKind::Extend, "the header is sound, so the session is restored");
    let p = co.restore.expect("a restored session comes with its pending check");
    drop(co.kv);
    assert!(!store.verify_restore(p), "damaged KV bytes must fail the checksum");
    assert!(!files[0].exists(), "the damaged file is deleted");
    assert_eq!(store.restored_count(), 0);
    let (kind, reused, _) = turn(&mut store, "a", &next, 2);
    assert_eq!((kind, reused), (MatchKind::Miss, 0), "recomputed cold");
}

/// Forgetting an owner deletes its persisted sessions — even one whose save
/// is still queued — and leaves other owners' alone: after a restart the
/// forgotten owner starts cold and the other is restored.
#[test]
fn a_forgotten_owner_is_gone_from_disk_too() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let open = || open_with_disk(&pool, dir.path(), engram_kv::EvictionPolicy::Lru);
    let mut store = open();
    let (_, _, a_out) = turn(&mut store, "alice", "Alice: my locker is 31.", 3);
    let (_, _, b_out) = turn(&mut store, "bob", "Bob: my locker is 12.", 3);
    // Alice's save may still be queued: the removal is ordered after it.
    store.forget_owner("alice");
    drop(store);
    let mut store = open();
    assert_eq!(store.on_disk_count(), 1, "only bob's session is left on disk");
    let (_, reused, _) = turn(&mut store, "alice", &format!("Alice: my locker is 31.{a_out} Which?"), 3);
    assert_eq!(reused, 0, "alice starts cold");
    let (kind, reused, _) = turn(&mut store, "bob", &format!("Bob: my locker is 12.{b_out} Which?"), 3);
    assert!(kind == MatchKind::Extend && reused > 0, "bob is restored: {kind:?} {reused}");
}

/// A queued save holds its cache's blocks until the writer reaches it, so making room
/// sheds saves not yet started once no idle session is left to evict: every byte comes
/// back however far behind the writer is. What was shed is a miss after a restart, what
/// was written is restored, and either way the next turn equals a cold run.
#[test]
fn making_room_sheds_queued_saves_and_what_survives_is_exact() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let open = || open_with_disk(&pool, dir.path(), engram_kv::EvictionPolicy::Lru);
    let mut store = open();
    let owners: Vec<String> = (0..12).map(|i| format!("owner{i}")).collect();
    // Every cache is computed first, then all are checked in at once: the writer is behind.
    let (mut texts, mut done, mut largest) = (Vec::new(), Vec::new(), 0);
    for o in &owners {
        let text = format!("{o}: the locker code is {}. ", o.len() * 7).repeat(6);
        let co = store.checkout(o, None, &text, true, &m.tokenizer).unwrap();
        assert_eq!(co.kind, MatchKind::Miss);
        let before = pool.used();
        let mut g = LoneSequence::from_parts(m, co.kv, Vec::new());
        g.prefill(&co.tokens).unwrap();
        largest = largest.max(pool.used() - before);
        done.push((co.session_id, co.tokens, co.token_ends, g.into_parts().0));
        texts.push(text);
    }
    for ((o, text), (sid, tokens, ends, kv)) in owners.iter().zip(&texts).zip(done) {
        store.checkin(o, &sid, text.clone(), tokens, ends, kv);
    }
    assert!(pool.used() > largest);
    store.make_room(pool.budget());
    // The one save the writer may be in the middle of keeps its blocks until it is written.
    assert!(pool.used() <= largest, "{} bytes still held; one save holds at most {largest}", pool.used());
    store.flush();
    // Prefix-index blocks it shared are idle now, and go too.
    assert!(store.make_room(pool.budget()));
    assert_eq!(pool.used(), 0);
    let shed = store.saves_shed();
    drop(store);

    let mut store = open();
    let mut missed = 0;
    for (o, text) in owners.iter().zip(&texts) {
        let (kind, reused, _) = turn(&mut store, o, &format!("{text} And the door?"), 2);
        match kind {
            MatchKind::Extend => assert!(reused > 0),
            MatchKind::Miss => missed += 1,
            other => panic!("{o}: {other:?}"),
        }
    }
    assert_eq!(missed as u64, shed, "exactly the shed saves are misses");
    assert_eq!(store.restored_count() as usize, owners.len() - missed);
}
