//! A full disk: a replacement whose write fails keeps the old version.
//!
//! The write failure is real: this process's file-size limit (`RLIMIT_FSIZE`) is lowered
//! below the new version's size, so the write of its temp file fails (`EFBIG`) as it would
//! with `ENOSPC` on a full disk. One test in its own binary, since the limit is the whole
//! process's.

use std::path::Path;

use engram_kv::persist::encoded_len;
use engram_kv::{DiskStore, EntryKind, EntryMeta, EvictionPolicy, KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::KvCache;

const LAYOUT: KvLayout = KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 32 };
const FP: &str = "1111222233334444-f16";
const VOCAB: usize = 1000;

fn entry(pool: &KvPool, n: usize, seed: u32) -> (EntryMeta, SeqKv) {
    let mut kv = SeqKv::new(pool);
    kv.reserve(n).unwrap();
    let k: Vec<f32> = (0..n * LAYOUT.num_kv_heads * LAYOUT.head_dim).map(|i| ((i as u32 * 7 + seed) % 100) as f32 * 0.01).collect();
    for layer in 0..LAYOUT.num_layers {
        kv.write(layer, 0, &k, &k, n);
    }
    let meta = EntryMeta {
        fingerprint: FP.into(),
        kind: EntryKind::Session,
        owner: "alice/s".into(),
        tokens: (0..n as u32).map(|i| (i + seed) % VOCAB as u32).collect(),
        text: "x".repeat(n),
        offsets: (0..n).map(|i| (i, i + 1)).collect(),
        created_unix: 1_800_000_000,
    };
    (meta, kv)
}

/// Sets the soft file-size limit of this process (`None`: back to the hard limit).
fn limit_file_size(bytes: Option<u64>) {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `r` is a valid rlimit to fill in and read.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_FSIZE, &mut r), 0);
        r.rlim_cur = bytes.map_or(r.rlim_max, |b| b as libc::rlim_t);
        assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &r), 0);
    }
}

fn entry_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.retain(|n| n != "index.json");
    v.sort();
    v
}

/// The budget fits the new version but not both: before the fix the old version was
/// deleted to make room before the new one was written, so a failed write lost both.
#[test]
fn a_replacement_that_cannot_be_written_keeps_the_old_version() {
    // SAFETY: ignoring SIGXFSZ has no preconditions; a write past the limit then fails
    // with EFBIG instead of killing the process.
    unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    let dir = tempfile::tempdir().unwrap();
    let p = KvPool::new(LAYOUT, KvFormat::F16, 64 << 20);
    let (old, old_kv) = entry(&p, 64, 1);
    let (new, new_kv) = entry(&p, 300, 2);
    let (old_bytes, new_bytes) = (encoded_len(&old, &old_kv).unwrap(), encoded_len(&new, &new_kv).unwrap());
    let mut store = DiskStore::open(dir.path(), old_bytes + new_bytes - 1, EvictionPolicy::Lru).unwrap();
    store.put("s", &old, &old_kv).unwrap();

    limit_file_size(Some(old_bytes + 4096)); // the index still fits; the new version does not
    let e = store.put("s", &new, &new_kv);
    limit_file_size(None);
    let e = e.unwrap_err();
    assert!(e.to_string().contains("s.safetensors"), "the error names the entry: {e}");

    assert_eq!(entry_files(dir.path()), ["s.safetensors"], "the old version and no temp file");
    assert_eq!(store.used_bytes(), old_bytes);
    let (meta, kv) = store.get("s", "alice/s", &p, FP, VOCAB).unwrap().expect("the old version is still there");
    assert_eq!((meta, kv.len()), (old.clone(), 64));
    // Once there is room again the replacement goes through, within the budget.
    store.put("s", &new, &new_kv).unwrap();
    assert_eq!(store.used_bytes(), new_bytes);
    assert_eq!(store.get("s", "alice/s", &p, FP, VOCAB).unwrap().unwrap().0, new);
}
