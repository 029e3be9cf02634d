//! The disk store: hard budget, eviction policies, pins, stats across
//! reopen, bad files dropped as misses, id validation.

use std::path::Path;

use engram_kv::persist::encoded_len;
use engram_kv::{DiskError, DiskStore, EntryKind, EntryMeta, EntryStats, EvictionPolicy, KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::KvCache;

const LAYOUT: KvLayout = KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 32 };
const FP: &str = "1111222233334444-f16";
const VOCAB: usize = 1000;
const DAY: u64 = 86_400;
const T: u64 = 1_800_000_000;

fn pool() -> KvPool {
    KvPool::new(LAYOUT, KvFormat::F16, 256 << 20)
}

fn entry(pool: &KvPool, n: usize, seed: u32) -> (EntryMeta, SeqKv) {
    let mut kv = SeqKv::new(pool);
    kv.reserve(n).unwrap();
    let w = LAYOUT.num_kv_heads * LAYOUT.head_dim;
    for layer in 0..LAYOUT.num_layers {
        let k: Vec<f32> = (0..n * w).map(|i| ((i as u32 * 7 + seed) % 100) as f32 * 0.01).collect();
        kv.write(layer, 0, &k, &k, n);
    }
    let meta = EntryMeta {
        fingerprint: FP.into(),
        kind: if seed % 2 == 0 { EntryKind::Session } else { EntryKind::Prefix },
        owner: format!("owner{seed}"),
        tokens: (0..n as u32).map(|i| (i + seed) % VOCAB as u32).collect(),
        text: "x".repeat(n),
        offsets: (0..n).map(|i| (i, i + 1)).collect(),
        created_unix: T - 100 * DAY,
    };
    (meta, kv)
}

fn files_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

fn ids(store: &DiskStore) -> Vec<String> {
    store.list().into_iter().map(|s| s.id).collect()
}

#[test]
fn budget_is_never_exceeded() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let one = {
        let (m, kv) = entry(&p, 100, 0);
        encoded_len(&m, &kv).unwrap()
    };
    let budget = 5 * one;
    for policy in EvictionPolicy::ALL {
        let mut store = DiskStore::open(dir.path().join(policy.name()), budget, policy).unwrap();
        for i in 0..40u32 {
            let n = 1 + (i as usize * 37) % 200;
            let (mut m, kv) = entry(&p, n, i);
            m.owner = format!("owner{}", i % 13);
            store.set_now(Some(T + i as u64));
            store.put(&format!("e{}", i % 13), &m, &kv).unwrap();
            assert!(store.used_bytes() <= budget, "{policy}: {} > {budget}", store.used_bytes());
            assert_eq!(files_bytes(store.dir()), store.used_bytes(), "{policy}: sizes on disk agree");
            assert!(store.stats(&format!("e{}", i % 13)).is_some(), "the entry just put is there");
            if i % 3 == 0 {
                let _ = store.get(&format!("e{}", (i + 5) % 13), &format!("owner{}", (i + 5) % 13), &p, FP, VOCAB).unwrap();
            }
        }
    }
}

#[test]
fn an_entry_larger_than_the_budget_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (m, kv) = entry(&p, 300, 1);
    let mut store = DiskStore::open(dir.path(), 1000, EvictionPolicy::Lru).unwrap();
    let e = store.put("big", &m, &kv).unwrap_err();
    assert!(matches!(e, DiskError::TooLarge { .. }), "{e}");
    assert!(e.to_string().contains("larger than the whole disk budget"), "{e}");
    assert_eq!(store.used_bytes(), 0);
}

/// Three equal entries, then a fourth that needs one evicted:
/// * `a`: 1 hit, last used 30 days ago  (weighted: 0.6*0.5 + 0.4*~0 = 0.30)
/// * `b`: 0 hits, used a minute ago     (weighted: 0 + 0.4*~1 = 0.40)
/// * `c`: 20 hits, last used 60 days ago (weighted: 0.6*0.95 + 0 = 0.57)
///
/// LRU evicts `c`, LFU evicts `b`, weighted evicts `a`.
fn evicted_by(policy: EvictionPolicy) -> String {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (m, kv) = entry(&p, 64, 0);
    let size = encoded_len(&m, &kv).unwrap();
    let mut store = DiskStore::open(dir.path(), 3 * size, policy).unwrap();
    store.set_now(Some(T - 60 * DAY));
    store.put("c", &m, &kv).unwrap();
    for _ in 0..20 {
        assert!(store.get("c", &m.owner, &p, FP, VOCAB).unwrap().is_some());
    }
    store.set_now(Some(T - 30 * DAY));
    store.put("a", &m, &kv).unwrap();
    assert!(store.get("a", &m.owner, &p, FP, VOCAB).unwrap().is_some());
    store.set_now(Some(T - 60));
    store.put("b", &m, &kv).unwrap();
    store.set_now(Some(T));
    let before = ids(&store);
    store.put("d", &m, &kv).unwrap();
    assert!(store.used_bytes() <= 3 * size);
    let after = ids(&store);
    assert_eq!(after.len(), 3);
    let gone: Vec<_> = before.into_iter().filter(|i| !after.contains(i)).collect();
    assert_eq!(gone.len(), 1);
    gone[0].clone()
}

#[test]
fn each_policy_evicts_its_victim() {
    assert_eq!(evicted_by(EvictionPolicy::Lru), "c");
    assert_eq!(evicted_by(EvictionPolicy::Lfu), "b");
    assert_eq!(evicted_by(EvictionPolicy::Weighted), "a");
}

fn stats(id: &str, hits: u64, last_used_unix: u64, pinned: bool) -> EntryStats {
    EntryStats {
        id: id.into(),
        kind: EntryKind::Session,
        owner: String::new(),
        bytes: 1,
        hits,
        created_unix: 0,
        last_used_unix,
        pinned,
        num_tokens: 1,
    }
}

#[test]
fn priority_functions() {
    let now = T;
    let s = [
        stats("old-popular", 50, now - 10 * DAY, false),
        stats("new-unused", 0, now - 5, false),
        stats("pinned-oldest", 0, 0, true),
        stats("mid", 2, now - DAY, false),
    ];
    assert_eq!(EvictionPolicy::Lru.eviction_order(&s, now), ["old-popular", "mid", "new-unused"]);
    assert_eq!(EvictionPolicy::Lfu.eviction_order(&s, now), ["new-unused", "mid", "old-popular"]);
    // Weighted: recency decays with age (the prefix-caching design's grew with it).
    let w = EvictionPolicy::Weighted;
    let fresh = w.priority(&stats("x", 3, now, false), now);
    let day = w.priority(&stats("x", 3, now - DAY, false), now);
    let month = w.priority(&stats("x", 3, now - 30 * DAY, false), now);
    assert!(fresh > day && day > month, "{fresh} {day} {month}");
    assert!((fresh - day - 0.2).abs() < 1e-9, "recency halves per day of disuse");
    assert!(w.priority(&stats("x", 4, now, false), now) > fresh, "more hits, higher priority");
    assert!(w.priority(&stats("x", u64::MAX, now, false), now) <= 1.0);
    assert_eq!(w.eviction_order(&s, now), ["new-unused", "old-popular", "mid"]);
    assert!(EvictionPolicy::ALL.iter().all(|p| !p.eviction_order(&s, now).contains(&"pinned-oldest".to_string())));
    assert_eq!("lfu".parse::<EvictionPolicy>().unwrap(), EvictionPolicy::Lfu);
}

#[test]
fn pinned_entries_survive() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (m, kv) = entry(&p, 64, 0);
    let size = encoded_len(&m, &kv).unwrap();
    let mut store = DiskStore::open(dir.path(), 3 * size, EvictionPolicy::Lru).unwrap();
    store.set_now(Some(T));
    store.put("keep", &m, &kv).unwrap();
    store.pin("keep", true).unwrap();
    for i in 0..10 {
        store.set_now(Some(T + 1 + i));
        store.put(&format!("x{i}"), &m, &kv).unwrap();
        assert!(store.stats("keep").is_some(), "the pinned (and oldest) entry was evicted");
    }
    store.pin("x9", true).unwrap();
    store.pin("x8", true).unwrap();
    let e = store.put("y", &m, &kv).unwrap_err();
    assert!(matches!(e, DiskError::PinnedFull { .. }), "{e}");
    assert_eq!(ids(&store), ["keep", "x8", "x9"], "a refused put evicts nothing");
    // gc with a smaller budget still keeps pins.
    drop(store);
    let mut store = DiskStore::open(dir.path(), size, EvictionPolicy::Lru).unwrap();
    let report = store.gc().unwrap();
    assert!(report.evicted.is_empty());
    store.pin("x8", false).unwrap();
    let report = store.gc().unwrap();
    assert_eq!(report.evicted, ["x8"]);
    assert!(matches!(store.pin("nope", true), Err(DiskError::UnknownId(_))));
}

/// `put_pinned` stores and pins in one step (a named agent's session); a plain
/// `put` of the same id keeps the pin; a pinned put that would take pinned
/// entries past the budget is refused and changes nothing on disk.
#[test]
fn put_pinned_pins_and_is_refused_past_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (m, kv) = entry(&p, 64, 0);
    let size = encoded_len(&m, &kv).unwrap();
    let mut store = DiskStore::open(dir.path(), 2 * size, EvictionPolicy::Lru).unwrap();
    store.set_now(Some(T));
    store.put_pinned("agent-a", &m, &kv).unwrap();
    store.set_now(Some(T + 1));
    store.put("agent-a", &m, &kv).unwrap();
    assert!(store.stats("agent-a").unwrap().pinned, "a plain re-save unpinned it");
    store.put("chat", &m, &kv).unwrap();
    store.set_now(Some(T + 2));
    store.put_pinned("agent-b", &m, &kv).unwrap();
    assert_eq!(ids(&store), ["agent-a", "agent-b"], "the unpinned chat makes room, not the older pin");
    let before = files_bytes(dir.path());
    let e = store.put_pinned("agent-c", &m, &kv).unwrap_err();
    assert!(matches!(e, DiskError::PinnedFull { .. }), "{e}");
    assert_eq!((ids(&store), files_bytes(dir.path())), (vec!["agent-a".to_string(), "agent-b".to_string()], before));
}

/// With a share per tenant (the owner's text before '/'), one tenant's puts past its share
/// evict its own oldest entries and never another tenant's; a pinned put past the share is
/// refused and changes nothing on disk; without the quota the same puts evict the other
/// tenant's entries (the failure the quota prevents).
#[test]
fn a_tenant_over_its_share_evicts_its_own_entries_only() {
    let p = pool();
    let (m, kv) = entry(&p, 64, 0);
    let size = encoded_len(&m, &kv).unwrap();
    let owned = |tenant: &str| EntryMeta { owner: format!("{tenant}/s"), ..m.clone() };
    for with_quota in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut store = DiskStore::open(dir.path(), 6 * size, EvictionPolicy::Lru).unwrap();
        if with_quota {
            store.set_group_quota(Some(engram_kv::GroupQuota::new(3 * size, |o: &str| o.split('/').next().unwrap_or("").to_string())));
        }
        for i in 0..3u64 {
            store.set_now(Some(T + i));
            store.put(&format!("b{i}"), &owned("bob"), &kv).unwrap();
        }
        for i in 0..6u64 {
            store.set_now(Some(T + 10 + i));
            store.put(&format!("a{i}"), &owned("alice"), &kv).unwrap();
        }
        let bob: Vec<String> = ids(&store).into_iter().filter(|i| i.starts_with('b')).collect();
        if !with_quota {
            assert!(bob.len() < 3, "without the quota alice's puts evict bob's entries");
            continue;
        }
        assert_eq!(bob, ["b0", "b1", "b2"], "bob keeps all his entries");
        assert_eq!(store.group_bytes("alice"), 3 * size);
        assert_eq!(ids(&store).into_iter().filter(|i| i.starts_with('a')).collect::<Vec<_>>(), ["a3", "a4", "a5"]);
        // Pinned entries count against the share: a third pin would pass it.
        store.put_pinned("a4", &owned("alice"), &kv).unwrap();
        store.put_pinned("a5", &owned("alice"), &kv).unwrap();
        store.put_pinned("a3", &owned("alice"), &kv).unwrap();
        let before = (ids(&store), files_bytes(dir.path()));
        let e = store.put_pinned("a6", &owned("alice"), &kv).unwrap_err();
        assert!(matches!(e, DiskError::OverQuota { .. }), "{e}");
        assert!(!e.to_string().contains("alice"), "errors do not name tenants: {e}");
        assert_eq!((ids(&store), files_bytes(dir.path())), before, "a refused put changes nothing");
    }
}

#[test]
fn reopen_keeps_stats_and_rebuilds_a_bad_index() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (m, kv) = entry(&p, 40, 2);
    {
        let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Weighted).unwrap();
        store.set_now(Some(T));
        store.put("s1", &m, &kv).unwrap();
        store.put("s2", &m, &kv).unwrap();
        store.set_now(Some(T + 50));
        let (m2, kv2) = store.get("s1", &m.owner, &p, FP, VOCAB).unwrap().unwrap();
        assert_eq!((m2, kv2.len()), (m.clone(), 40));
        store.get("s1", &m.owner, &p, FP, VOCAB).unwrap().unwrap();
        store.pin("s2", true).unwrap();
    }
    let store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Weighted).unwrap();
    let s1 = store.stats("s1").unwrap();
    assert_eq!((s1.hits, s1.last_used_unix, s1.pinned, s1.num_tokens), (2, T + 50, false, 40));
    assert_eq!((s1.kind, s1.owner.as_str(), s1.created_unix), (m.kind, m.owner.as_str(), m.created_unix));
    assert!(store.stats("s2").unwrap().pinned);
    drop(store);

    std::fs::write(dir.path().join("index.json"), b"{ not json").unwrap();
    let store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Weighted).unwrap();
    assert_eq!(ids(&store), ["s1", "s2"], "entries come from the headers");
    assert_eq!(store.stats("s1").unwrap().hits, 0);
    std::fs::remove_file(dir.path().join("index.json")).unwrap();
    assert_eq!(ids(&DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Weighted).unwrap()), ["s1", "s2"]);
}

fn flip_byte(path: &Path, from_end: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    let i = bytes.len() - from_end as usize;
    bytes[i] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn corrupt_files_are_dropped_as_misses() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (m, kv) = entry(&p, 70, 3);
    let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    for id in ["a", "b", "c", "d"] {
        store.put(id, &m, &kv).unwrap();
    }
    // Data corruption found at `get`: a miss, and the file is gone.
    flip_byte(&store.entry_path("a").unwrap(), 100);
    assert!(store.get("a", &m.owner, &p, FP, VOCAB).unwrap().is_none());
    assert!(!store.entry_path("a").unwrap().exists());
    assert!(store.stats("a").is_none());
    // Another model's or format's entry is a miss that stays.
    assert!(store.get("b", &m.owner, &p, "9999999999999999-f16", VOCAB).unwrap().is_none());
    assert!(store.stats("b").is_some());
    // A file that vanished behind the store's back is a miss.
    std::fs::remove_file(store.entry_path("d").unwrap()).unwrap();
    assert!(store.get("d", &m.owner, &p, FP, VOCAB).unwrap().is_none());
    assert!(store.stats("d").is_none());
    // A bad header is dropped at open; bad data is dropped by gc.
    drop(store);
    std::fs::write(dir.path().join("junk.safetensors"), b"\x08\0\0\0\0\0\0\0{}      ").unwrap();
    flip_byte(&dir.path().join("c.safetensors"), 7);
    std::fs::write(dir.path().join("notes.txt"), b"not ours").unwrap();
    let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    assert_eq!(ids(&store), ["b", "c"]);
    assert!(!dir.path().join("junk.safetensors").exists());
    let report = store.gc().unwrap();
    assert_eq!(report.dropped, ["c"]);
    assert_eq!(ids(&store), ["b"]);
    assert!(dir.path().join("notes.txt").exists(), "files that are not entries are left alone");
    assert!(store.get("b", &m.owner, &p, FP, VOCAB).unwrap().is_some());
}

#[test]
fn replacing_an_entry_keeps_its_stats_and_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (m, kv) = entry(&p, 64, 0);
    let (mut m2, kv2) = entry(&p, 90, 4);
    m2.owner = m.owner.clone();
    let size2 = encoded_len(&m2, &kv2).unwrap();
    let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    store.put("s", &m, &kv).unwrap();
    store.get("s", &m.owner, &p, FP, VOCAB).unwrap().unwrap();
    store.pin("s", true).unwrap();
    store.put("s", &m2, &kv2).unwrap();
    let s = store.stats("s").unwrap();
    assert_eq!((s.hits, s.pinned, s.num_tokens, s.bytes), (1, true, 90, size2));
    assert_eq!(store.used_bytes(), size2);
    assert_eq!(store.get("s", &m.owner, &p, FP, VOCAB).unwrap().unwrap().0, m2);
    assert!(store.remove("s", &m.owner).unwrap());
    assert!(!store.remove("s", &m.owner).unwrap());
    assert_eq!(store.used_bytes(), 0);
    // An entry that only fits once its old version is gone still goes in.
    let mut store = DiskStore::open(dir.path(), size2 + 10, EvictionPolicy::Lru).unwrap();
    store.put("t", &m2, &kv2).unwrap();
    store.put("t", &m2, &kv2).unwrap();
    assert_eq!(store.used_bytes(), size2);
}

#[test]
fn ids_that_are_not_plain_names_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (m, kv) = entry(&p, 8, 0);
    let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    let long = "x".repeat(201);
    for id in ["a/b", "../x", "..", "a\\b", "nul\0", "", long.as_str(), ".hidden", "/abs"] {
        assert!(matches!(store.put(id, &m, &kv), Err(DiskError::InvalidId { .. })), "put accepted {id:?}");
        assert!(matches!(store.get(id, &m.owner, &p, FP, VOCAB), Err(DiskError::InvalidId { .. })), "get accepted {id:?}");
        assert!(store.remove(id, &m.owner).is_err() && store.remove_any(id).is_err() && store.pin(id, true).is_err());
    }
    assert_eq!(files_bytes(dir.path()), 0);
    assert!(std::fs::read_dir(dir.path().parent().unwrap()).unwrap().all(|e| !e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .starts_with("x.safetensors")));
    for id in ["agent-7:session 3", "é", &"y".repeat(200)] {
        store.put(id, &m, &kv).unwrap();
    }
    assert_eq!(store.list().len(), 3);
}

#[test]
fn open_removes_only_temp_files_of_dead_writers() {
    let dir = tempfile::tempdir().unwrap();
    let dead = dir.path().join(".e.safetensors.tmp-4000000000-0");
    let live = dir.path().join(format!(".e.safetensors.tmp-{}-99", std::process::id()));
    std::fs::write(&dead, b"half a write").unwrap();
    std::fs::write(&live, b"a write in progress").unwrap();
    let store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    assert!(store.list().is_empty(), "temp files are not entries");
    assert!(!dead.exists(), "an interrupted write is cleaned up");
    assert!(live.exists(), "a live writer's temp file is left alone");
}

/// Tenant isolation on disk: an entry is its stored owner's alone. Another owner's `get` of its
/// id is a miss, and its `put`, `remove` and `drop_corrupt` are refused; none of them
/// changes the entry. The operator's `remove_any` still deletes it.
#[test]
fn another_owners_entry_is_a_miss_and_is_neither_replaced_nor_removed() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (alice, kv) = entry(&p, 40, 2);
    let (mut mallory, kv2) = entry(&p, 70, 4);
    mallory.owner = "mallory/s".into();
    let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    store.put("x", &alice, &kv).unwrap();
    let before = std::fs::read(store.entry_path("x").unwrap()).unwrap();

    assert!(store.get("x", &mallory.owner, &p, FP, VOCAB).unwrap().is_none(), "another owner read the entry");
    let e = store.put("x", &mallory, &kv2).unwrap_err();
    assert!(matches!(e, DiskError::OwnerMismatch { .. }), "{e}");
    assert!(!e.to_string().contains(&alice.owner), "the refusal names the stored owner: {e}");
    assert!(matches!(store.remove("x", &mallory.owner), Err(DiskError::OwnerMismatch { .. })));
    let why = engram_kv::PersistError::NotFound { path: "x".into() };
    assert!(matches!(store.drop_corrupt("x", &mallory.owner, &why), Err(DiskError::OwnerMismatch { .. })));
    assert_eq!(std::fs::read(store.entry_path("x").unwrap()).unwrap(), before, "the entry changed");
    assert_eq!(store.stats("x").unwrap().hits, 0, "a refused read counted a hit");

    let (got, _) = store.get("x", &alice.owner, &p, FP, VOCAB).unwrap().unwrap();
    assert_eq!(got, alice);
    // A file that changed owner behind the store's back is a miss for the owner the
    // store knew, and stays (it is not that owner's to delete).
    engram_kv::write_entry(&store.entry_path("x").unwrap(), &mallory, &kv2).unwrap();
    assert!(store.get("x", &alice.owner, &p, FP, VOCAB).unwrap().is_none());
    assert!(store.entry_path("x").unwrap().exists());
    assert!(store.remove_any("x").unwrap(), "the operator deletes any entry");
    assert!(!store.entry_path("x").unwrap().exists());
}

/// Rewrites the `version` of the entry file at `path` in place (same length).
fn set_version(path: &Path, version: &str) {
    let bytes = std::fs::read(path).unwrap();
    let (from, to) = (r#""version":"2""#, format!(r#""version":"{version}""#));
    let at = bytes.windows(from.len()).position(|w| w == from.as_bytes()).expect("a version in the header");
    let mut out = bytes.clone();
    out[at..at + to.len()].copy_from_slice(to.as_bytes());
    std::fs::write(path, out).unwrap();
}

/// Version skew: an entry of another format version (older or newer) is a miss that
/// stays: opening the store (what the read-only `engram cache ls` does), `get`, `gc` and a
/// fresh open leave the file as it was; entries of this version around it are untouched.
#[test]
fn an_entry_of_another_version_is_a_miss_and_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (m, kv) = entry(&p, 40, 2);
    let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    for id in ["older", "newer", "ours"] {
        store.put(id, &m, &kv).unwrap();
    }
    drop(store);
    let path = |id: &str| dir.path().join(format!("{id}.safetensors"));
    set_version(&path("older"), "1");
    set_version(&path("newer"), "3");
    let before = [std::fs::read(path("older")).unwrap(), std::fs::read(path("newer")).unwrap()];

    let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    assert_eq!(ids(&store), ["ours"], "entries this build cannot read are not listed");
    assert!(store.get("newer", &m.owner, &p, FP, VOCAB).unwrap().is_none());
    assert!(store.gc().unwrap().dropped.is_empty(), "gc dropped another version's entry");
    drop(store);
    let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    let after = [std::fs::read(path("older")).unwrap(), std::fs::read(path("newer")).unwrap()];
    assert!(before == after, "an entry of another version was changed or deleted");
    assert!(store.get("ours", &m.owner, &p, FP, VOCAB).unwrap().is_some());
}

/// A save that does not stall the engine: a put in three steps, so the file is written without the store's lock.
/// Between the steps the store serves the old version and counts only it; the commit records
/// the new one with the old one's hits and pin.
#[test]
fn a_staged_put_serves_the_old_version_until_committed() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (m, kv) = entry(&p, 64, 0);
    let (mut m2, kv2) = entry(&p, 90, 2);
    m2.owner = m.owner.clone();
    let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    store.put("s", &m, &kv).unwrap();
    store.get("s", &m.owner, &p, FP, VOCAB).unwrap().unwrap();
    let old_bytes = store.used_bytes();
    let staged = store.stage_put("s", &m2, &kv2, Some(true)).unwrap();
    assert_eq!(store.get("s", &m.owner, &p, FP, VOCAB).unwrap().unwrap().0, m, "staged: the old version");
    staged.write(&kv2).unwrap();
    assert_eq!(store.used_bytes(), old_bytes, "written, not committed: only the old version counts");
    store.commit_put(staged).unwrap();
    let s = store.stats("s").unwrap();
    assert_eq!((s.hits, s.pinned, s.num_tokens), (2, true, 90));
    assert_eq!(store.used_bytes(), encoded_len(&m2, &kv2).unwrap());
    assert_eq!(store.get("s", &m.owner, &p, FP, VOCAB).unwrap().unwrap().0, m2);
    // Another owner's id is refused at the first step; nothing is written.
    let (m3, kv3) = entry(&p, 32, 4);
    assert!(matches!(store.stage_put("s", &m3, &kv3, None), Err(DiskError::OwnerMismatch { .. })));
    // Over the budget: refused before anything is written.
    let mut small = DiskStore::open(tempfile::tempdir().unwrap().path(), 100, EvictionPolicy::Lru).unwrap();
    assert!(matches!(small.stage_put("t", &m, &kv, None), Err(DiskError::TooLarge { .. })));
}

/// The `index.json` write leaves the store's lock: puts and restores only mark the stats
/// changed, [`DiskStore::take_index`] hands out a snapshot to write outside the lock, a pin
/// is written at once, drop writes what is left, and a snapshot older than the file on disk
/// never replaces it.
#[test]
fn index_writes_are_taken_out_of_the_store_and_never_go_back() {
    let dir = tempfile::tempdir().unwrap();
    let p = pool();
    let (m, kv) = entry(&p, 32, 0);
    let index = dir.path().join("index.json");
    let hits_on_disk = || -> u64 {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
        v["entries"]["s"]["hits"].as_u64().unwrap()
    };
    let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    store.put("s", &m, &kv).unwrap();
    assert!(!index.exists(), "a put does not write the index under the lock");
    store.take_index().expect("the put changed the stats").write().unwrap();
    assert_eq!(hits_on_disk(), 0);
    assert!(store.take_index().is_none(), "nothing changed since");

    store.get("s", &m.owner, &p, FP, VOCAB).unwrap().unwrap();
    let older = store.take_index().expect("a restore counts a hit");
    store.get("s", &m.owner, &p, FP, VOCAB).unwrap().unwrap();
    let newer = store.take_index().unwrap();
    newer.write().unwrap();
    older.write().unwrap();
    assert_eq!(hits_on_disk(), 2, "the older snapshot, written last, was skipped");

    store.pin("s", true).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    assert_eq!(v["entries"]["s"]["pinned"], true, "a pin is on disk at once");

    store.get("s", &m.owner, &p, FP, VOCAB).unwrap().unwrap();
    drop(store);
    assert_eq!(hits_on_disk(), 3, "drop writes the stats not yet written");
    let mut store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    let s = store.stats("s").unwrap();
    assert_eq!((s.hits, s.pinned), (3, true));

    // A pinned entry removed leaves the index at once: a new entry of the same id, its stats
    // never written (the process dies: `forget` skips drop), is not pinned after a restart.
    assert!(store.remove("s", &m.owner).unwrap());
    store.put("s", &m, &kv).unwrap();
    std::mem::forget(store);
    let store = DiskStore::open(dir.path(), 1 << 30, EvictionPolicy::Lru).unwrap();
    assert!(!store.stats("s").unwrap().pinned, "a removed entry's pin came back");
}
