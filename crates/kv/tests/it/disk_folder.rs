//! Folder entries of the disk store: counted against the budget and the owner's group share
//! once committed, evicted like KV entries, found again at reopen, dropped when their
//! metadata is missing or damaged, never restored as KV.

use engram_kv::{DiskError, DiskStore, EvictionPolicy, GroupQuota, KvFormat, KvLayout, KvPool};

fn write_files(store: &mut DiskStore, id: &str, owner: &str, bytes: usize) -> std::path::PathBuf {
    let dir = store.begin_folder(id, owner).unwrap();
    std::fs::write(dir.join("state"), vec![7u8; bytes]).unwrap();
    dir
}

#[test]
fn folders_count_against_the_budget_and_are_evicted_like_entries() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = DiskStore::open(tmp.path(), 10_000, EvictionPolicy::Lru).unwrap();
    store.set_now(Some(1_000));
    write_files(&mut store, "long-a", "alice/s1", 4_000);
    let a = store.commit_folder("long-a", "alice/s1", 40).unwrap();
    assert!(a >= 4_000 && a < 4_300, "the files and the metadata: {a}");
    assert_eq!(store.used_bytes(), a);
    assert!(store.is_folder("long-a"));

    store.set_now(Some(2_000));
    write_files(&mut store, "long-b", "bob/s2", 4_000);
    store.commit_folder("long-b", "bob/s2", 40).unwrap();
    // A third one passes the budget: the least recently used (a) goes, files and all.
    store.set_now(Some(3_000));
    let c_dir = write_files(&mut store, "long-c", "carol/s3", 4_000);
    store.commit_folder("long-c", "carol/s3", 40).unwrap();
    assert!(store.used_bytes() <= 10_000);
    assert!(store.stats("long-a").is_none());
    assert!(!store.folder_path("long-a").unwrap().exists(), "evicted folder deleted");
    assert!(c_dir.join("state").exists());

    // Larger than the budget: refused, and its folder deleted.
    let big = write_files(&mut store, "long-d", "dave/s4", 20_000);
    assert!(matches!(store.commit_folder("long-d", "dave/s4", 1), Err(DiskError::TooLarge { .. })));
    assert!(!big.exists());

    // Another owner can neither write nor remove it; KV restores miss.
    assert!(matches!(store.begin_folder("long-b", "mallory/s2"), Err(DiskError::OwnerMismatch { .. })));
    assert!(matches!(store.remove("long-b", "mallory/s2"), Err(DiskError::OwnerMismatch { .. })));
    let pool = KvPool::new(KvLayout { num_layers: 1, num_kv_heads: 1, head_dim: 4 }, KvFormat::F16, 1 << 20);
    assert!(store.get("long-b", "bob/s2", &pool, "fp", 10).unwrap().is_none());
    assert!(store.stats("long-b").is_some(), "a miss, not damage");

    // Reopen: both folders found again with their owners and bytes.
    let used = store.used_bytes();
    drop(store);
    let mut store = DiskStore::open(tmp.path(), 10_000, EvictionPolicy::Lru).unwrap();
    assert_eq!(store.used_bytes(), used);
    assert_eq!(store.stats("long-c").unwrap().owner, "carol/s3");
    assert!(store.is_folder("long-b"));
    assert!(store.remove("long-b", "bob/s2").unwrap());
    assert!(!tmp.path().join("long-b.folder").exists());
}

#[test]
fn a_folder_without_sound_metadata_is_dropped_at_open() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = DiskStore::open(tmp.path(), 1 << 20, EvictionPolicy::Lru).unwrap();
    write_files(&mut store, "long-a", "alice/s1", 100);
    // Never committed: an interrupted first write.
    write_files(&mut store, "long-b", "bob/s1", 100);
    store.commit_folder("long-a", "alice/s1", 1).unwrap();
    let meta = tmp.path().join("long-a.folder/.entry");
    let mut bytes = std::fs::read(&meta).unwrap();
    let last = bytes.len() - 2;
    bytes[last] ^= 1;
    std::fs::write(&meta, bytes).unwrap();
    drop(store);
    let store = DiskStore::open(tmp.path(), 1 << 20, EvictionPolicy::Lru).unwrap();
    assert_eq!(store.used_bytes(), 0);
    assert!(!tmp.path().join("long-a.folder").exists(), "damaged metadata: dropped");
    assert!(!tmp.path().join("long-b.folder").exists(), "uncommitted: dropped");
}

#[test]
fn a_folder_counts_against_its_owners_share() {
    let tmp = tempfile::tempdir().unwrap();
    let mut store = DiskStore::open(tmp.path(), 100_000, EvictionPolicy::Lru).unwrap();
    store.set_group_quota(Some(GroupQuota::new(5_000, |o: &str| o.split('/').next().unwrap_or("").to_string())));
    store.set_now(Some(1));
    write_files(&mut store, "long-a", "alice/s1", 3_000);
    store.commit_folder("long-a", "alice/s1", 1).unwrap();
    store.set_now(Some(2));
    write_files(&mut store, "long-b", "bob/s1", 3_000);
    store.commit_folder("long-b", "bob/s1", 1).unwrap();
    store.set_now(Some(3));
    write_files(&mut store, "long-c", "alice/s2", 3_000);
    store.commit_folder("long-c", "alice/s2", 1).unwrap();
    assert!(store.stats("long-a").is_none(), "alice's older folder evicted for her share");
    assert!(store.stats("long-b").is_some(), "bob's untouched");
    assert!(store.group_bytes("alice") <= 5_000);
}
