//! Shared prefixes must not leak across tenants: the shared prefix
//! index is salted per owner, so one tenant never reuses blocks another
//! tenant computed (`cached_tokens` would reveal whether another tenant sent
//! that text) — in RAM, and from persisted `prefix-*` chains after a restart.

use crate::common;
use common::model;
use engram_context::{MatchKind, SessionStore};
use engram_engine::LoneSequence;
use engram_kv::{KvFormat, KvLayout, KvPool};

fn pool() -> KvPool {
    KvPool::new(KvLayout::of(&model().config), KvFormat::F32, 64 << 20)
}

/// What a (re)started process opens: a store over `pool` with a disk tier in `dir`,
/// sharing prefixes across tenants when `share`.
fn open_with_disk(pool: &KvPool, dir: &std::path::Path, share: bool) -> SessionStore {
    let m = model();
    let fp = engram_kv::cache_fingerprint(m.fingerprint, KvFormat::F32);
    let disk = engram_context::PersistedSessions::open(dir, 64 << 20, engram_kv::EvictionPolicy::Weighted, fp).unwrap();
    SessionStore::new(pool.clone(), m.fingerprint).with_disk(disk, m.config.vocab).with_shared_prefixes_across_tenants(share)
}

/// A long prompt: several whole blocks of a system prompt, then `user`'s message.
fn prompt(user: &str) -> String {
    "You are the private assistant of one patient; this is their diagnosis and history in full. ".repeat(4)
        + &format!("User: {user}\nAssistant:")
}

/// `owner` sends `text` (in the named session `session`, else matched by characters):
/// checkout, prefill what was not reused, check in. Returns (kind, reused tokens).
fn prefill(store: &mut SessionStore, owner: &str, session: Option<&str>, text: &str) -> (MatchKind, usize) {
    let m = model();
    let co = store.checkout(owner, session, text, true, &m.tokenizer).unwrap();
    assert!(co.restore.is_none());
    let (kind, reused, sid) = (co.kind, co.reused, co.session_id.clone());
    let mut g = LoneSequence::from_parts(m, co.kv, co.tokens[..reused].to_vec());
    g.prefill(&co.tokens[reused..]).unwrap();
    let (kv, _) = g.into_parts();
    store.checkin(owner, &sid, text.to_string(), co.tokens, co.token_ends, kv);
    (kind, reused)
}

#[test]
fn a_tenant_never_reuses_another_tenants_prefix_blocks() {
    let mut store = SessionStore::new(pool(), model().fingerprint);
    let text = prompt("what now?");
    assert_eq!(prefill(&mut store, "alice", None, &text), (MatchKind::Miss, 0));
    assert!(store.index().len() >= 3, "alice's full blocks are indexed");
    // bob sends alice's prompt word for word: nothing of hers is reused.
    assert_eq!(prefill(&mut store, "bob", None, &text), (MatchKind::Miss, 0), "bob reused alice's blocks");
    // What bob computed himself is his to share between his conversations (a new named one
    // does not match his first session, only the prefix index).
    let (kind, reused) = prefill(&mut store, "bob", Some("second"), &prompt("and then?"));
    assert_eq!(kind, MatchKind::Prefix);
    assert!(reused >= 64 && reused % 32 == 0, "bob's own whole blocks: {reused}");
}

/// The opt-in (`--share-prefixes-across-tenants`): every tenant reuses every tenant's blocks.
#[test]
fn sharing_across_tenants_is_opt_in() {
    let mut store = SessionStore::new(pool(), model().fingerprint).with_shared_prefixes_across_tenants(true);
    let text = prompt("what now?");
    assert_eq!(prefill(&mut store, "alice", None, &text), (MatchKind::Miss, 0));
    let (kind, reused) = prefill(&mut store, "bob", None, &text);
    assert_eq!(kind, MatchKind::Prefix);
    assert!(reused >= 96 && reused % 32 == 0, "alice's whole blocks: {reused}");
}

#[test]
fn persisted_prefix_chains_stay_with_their_tenant_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool();
    let mut store = open_with_disk(&pool, dir.path(), false);
    prefill(&mut store, "alice", None, &prompt("what now?"));
    // alice's second conversation shares her first's blocks: the chain is persisted as a prefix entry.
    let (kind, reused) = prefill(&mut store, "alice", Some("second"), &prompt("and then?"));
    assert_eq!(kind, MatchKind::Prefix);
    assert!(reused >= 64);
    drop(store);
    let is_prefix = |e: &std::fs::DirEntry| e.file_name().to_string_lossy().starts_with("prefix-");
    let prefixes = std::fs::read_dir(dir.path()).unwrap().filter(|e| is_prefix(e.as_ref().unwrap())).count();
    assert_eq!(prefixes, 1, "alice's chain is on disk");
    // After a restart bob gets none of it, not even with sharing turned on since (the chain
    // keeps the salt it was written under) ...
    for share in [false, true] {
        let mut store = open_with_disk(&pool, dir.path(), share);
        let co = store.checkout("bob", None, &prompt("is it serious?"), true, &model().tokenizer).unwrap();
        assert_eq!((co.kind, co.reused), (MatchKind::Miss, 0), "bob reused alice's persisted chain (share {share})");
    }
    // ... while alice, in a new conversation, gets it back from disk.
    let mut store = open_with_disk(&pool, dir.path(), false);
    assert_eq!(prefill(&mut store, "alice", Some("third"), &prompt("is it serious?")), (MatchKind::Prefix, reused));
}

/// Disk ids are blake3 of what they name, no longer FNV-1a-64 (whose steps
/// invert, so another tenant could pick a name with a victim's id offline). A session and a
/// prefix chain found under an FNV id (what earlier versions wrote, or any entry not at the id
/// its stored owner maps to) are a miss: deleted when the store opens, never restored.
#[test]
fn entries_under_the_old_fnv_ids_are_a_miss_and_cleaned_up() {
    let dir = tempfile::tempdir().unwrap();
    let pool = pool();
    let mut store = open_with_disk(&pool, dir.path(), false);
    prefill(&mut store, "alice", Some("s1"), &prompt("first"));
    // Her second conversation shares the first's whole blocks: persisted as a prefix chain.
    assert_eq!(prefill(&mut store, "alice", Some("s2"), &prompt("second")).0, MatchKind::Prefix);
    store.flush();
    drop(store);
    let named = |prefix: &str| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
            .collect();
        v.sort();
        v
    };
    let s1 = dir.path().join(format!("{}.safetensors", engram_context::session_disk_id("alice", "s1")));
    assert!(s1.exists(), "sessions are saved under their blake3 id");
    assert_eq!(named("prefix-").len(), 1);
    // Move both to the ids the FNV-1a-64 scheme gave them.
    let fnv = engram_model::model::fnv1a64(0, "alice\u{0}s1".as_bytes());
    let old_session = dir.path().join(format!("session-{fnv:016x}.safetensors"));
    std::fs::rename(&s1, &old_session).unwrap();
    let old_prefix = dir.path().join("prefix-0123456789abcdef.safetensors");
    std::fs::rename(&named("prefix-")[0], &old_prefix).unwrap();

    let mut store = open_with_disk(&pool, dir.path(), false);
    assert!(!old_session.exists() && !old_prefix.exists(), "entries under old ids are deleted at open");
    assert_eq!(store.on_disk_count(), 1, "only s2, at its own id, is left");
    assert_eq!(prefill(&mut store, "alice", Some("s1"), &prompt("first")), (MatchKind::Miss, 0), "s1 is recomputed");
}
