//! A save's snapshot (`SparseKv::snapshot_state`) shares the index and the position → file row
//! tables with its cache, copy on write: written after the cache decoded on, it resumes as the
//! cache was when it was taken, bit for bit, and the cache decodes as one never snapshotted;
//! taking and writing it takes heap independent of the history.

use std::path::Path;

use crate::common;
use common::{decode, model, noise, prefill, tokens};

use engram_model::{KvCache, Model};
use engram_sparse::kmeans::SEGMENT;
use engram_sparse::{Backend, Method, OffloadConfig, SparseConfig, SparseKv, StateMeta};

use crate::heap;

const CFG: SparseConfig = SparseConfig { method: Method::DynaKv { b_max: 8, eager: false }, budget: 96, sinks: 4, recent: 16 };

fn offload_cfg(dir: &Path, fingerprint: u64) -> OffloadConfig {
    OffloadConfig { ram_budget: 0, flush: 8, cache_bytes: 16 << 10, ..OffloadConfig::new(dir.to_path_buf(), fingerprint) }
}

fn meta(ids: &[u32]) -> StateMeta {
    StateMeta { fingerprint: "tiny-f16".into(), owner: "alice".into(), tokens: ids.to_vec() }
}

/// A cache over `prompt` streamed to a file in `live`, then `turn` decoded one by one.
fn offloaded(model: &Model, live: &Path, prompt: &[u32], turn: &[u32]) -> SparseKv {
    let mut kv = SparseKv::new(&model.config, Some(CFG));
    kv.offload_streaming(offload_cfg(live, model.fingerprint.0)).unwrap();
    prefill(model, &mut kv, prompt);
    decode(model, &mut kv, turn);
    kv
}

#[test]
fn a_snapshot_written_after_its_cache_decoded_on_resumes_as_the_cache_was_when_taken() {
    let (_d, model) = model();
    let ids = tokens(760);
    let (prompt, rest) = ids.split_at(560);
    let (turn, rest) = rest.split_at(100);
    let (more, next) = rest.split_at(40);
    let live = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let (at_once, later) = (state.path().join("at-once"), state.path().join("later"));
    let held = &ids[..660];

    let mut kv = offloaded(&model, live.path(), prompt, turn);
    let mut twin = offloaded(&model, live.path(), prompt, turn);
    kv.save_state(&at_once, &meta(held)).unwrap();
    let snapshot = kv.snapshot_state(&later, &meta(held)).unwrap();
    assert!(snapshot.copied_bytes() < snapshot.ram_bytes() / 2, "the index and the row tables are shared, not copied");
    // The cache decodes on while the snapshot waits: its index changes at every step and its
    // write buffer is flushed (the row tables grow) every 8 tokens. It decodes as a cache
    // never snapshotted.
    let got = decode(&model, &mut kv, more);
    assert_eq!(got, decode(&model, &mut twin, more), "the snapshot changed the cache's decode");
    let written = snapshot.write().unwrap();
    let reference = std::fs::metadata(at_once.join("state")).unwrap().len();
    assert_eq!(std::fs::metadata(later.join("state")).unwrap().len(), reference, "the same state, its size");
    assert!(written > reference);
    drop((kv, twin));

    // Both resume to the cache as it was at the snapshot: the same logits for the same tokens.
    let resume = |dir: &Path| {
        let (mut back, m) =
            SparseKv::resume_state(dir, &model.config, CFG, &meta(&[]), Some(offload_cfg(live.path(), model.fingerprint.0))).unwrap();
        assert_eq!(m, meta(held));
        decode(&model, &mut back, &ids[660..660 + more.len() + next.len()])
    };
    let want = resume(&at_once);
    assert_eq!(&want[..more.len()], &got[..], "resumed at once: the cache's own next logits");
    assert_eq!(resume(&later), want, "the snapshot written later resumes as the one written at once");
}

/// On this thread (inline file reads, no prefetch): the heap a snapshot of an offloaded cache
/// of `n` tokens (2 layers × 8 KV heads) takes while it is taken and while it is written,
/// and the bytes its index and row tables take (shared).
fn save_heap(n: usize) -> (isize, isize, usize) {
    let (layers, heads, d) = (2, 8, 32);
    let w = heads * d;
    let cfg = SparseConfig { method: Method::DynaKv { b_max: 8, eager: false }, budget: 256, sinks: 4, recent: 32 };
    let live = tempfile::tempdir().unwrap();
    let state = tempfile::tempdir().unwrap();
    let mut kv = SparseKv::with_shape(layers, heads, d, Some(cfg));
    let off = OffloadConfig { backend: Backend::Inline, prefetch: false, ram_budget: 500 * layers * w * 4, ..offload_cfg(live.path(), 7) };
    kv.offload_streaming(off).unwrap();
    let (keys, values) = (noise(21, 2048 * w), noise(22, 2048 * w));
    let mut a = 0;
    while a < n {
        let m = (n - a).min(2048);
        kv.reserve(m);
        for l in 0..layers {
            kv.write(l, a, &keys[..m * w], &values[..m * w], m);
        }
        a += m;
    }
    kv.build_index();
    assert!(kv.is_offloaded());
    let (dir, meta) = (state.path().join("conv"), meta(&vec![0u32; n]));
    let base = heap::live();
    heap::reset_peak();
    let snapshot = kv.snapshot_state(&dir, &meta).unwrap();
    let take = heap::peak() - base;
    let shared = snapshot.ram_bytes() - snapshot.copied_bytes();
    heap::reset_peak();
    let base = heap::live();
    snapshot.write().unwrap();
    (take, heap::peak() - base, shared)
}

#[test]
fn taking_and_writing_a_snapshot_takes_heap_independent_of_the_history() {
    let (small_take, small_write, small_shared) = save_heap(SEGMENT + 700);
    let (large_take, large_write, large_shared) = save_heap(3 * SEGMENT + 700);
    let grown = large_shared - small_shared;
    assert!(grown > 1 << 20, "the index and the row tables grew with the history: {small_shared} → {large_shared} bytes");
    // Taking it copies the RAM tail, the sinks and the last selections, the same at both, and
    // the token list (4 bytes a token, what the state must name).
    let tokens = (4 * 2 * SEGMENT) as isize;
    assert!(large_take <= small_take + tokens + 4096, "a longer history took more heap to snapshot: {large_take} vs {small_take} bytes");
    assert!((large_take as usize) < large_shared / 8, "the snapshot took {large_take} bytes; its shared parts are {large_shared}");
    // Writing it holds one head's index (1/16 of the index) and fixed buffers (the offload
    // file's checksum reads, the file writer): not a copy of the state.
    assert!(
        ((large_write - small_write).max(0) as usize) < grown / 4,
        "a longer history took more heap to write: {large_write} vs {small_write} bytes (index and tables grew {grown})"
    );
}
