//! Offload: an offloaded DynaKV cache answers every step with the
//! same bits as the in-RAM one (logits bitwise equal, whole forward passes on the `tiny`
//! fixture, with flushes, cache misses and evictions, both readers and both policies); the
//! file returns what was written; bad files and bad configurations are clear errors that
//! change nothing.

use std::path::Path;

use crate::common;
use common::{decode, model, prefill, tokens};

use engram_model::{Logits, Model, SeqStep};
use engram_sparse::offload::{FileSpec, OffloadFile, Reader};
use engram_sparse::{Backend, Layout, Method, OffloadConfig, Policy, SparseConfig, SparseKv};

fn offload_cfg(dir: &Path, model: &Model) -> OffloadConfig {
    OffloadConfig { ram_budget: 0, flush: 8, cache_bytes: 16 << 10, ..OffloadConfig::new(dir.to_path_buf(), model.fingerprint.0) }
}

#[test]
fn offloaded_dynakv_gives_the_in_ram_logits_bitwise() {
    let (_d, model) = model();
    let ids = tokens(700);
    let (prompt, rest) = ids.split_at(620);
    let store = tempfile::tempdir().unwrap();
    for (method, budget) in
        [(Method::DynaKv { b_max: 8, eager: false }, 96), (Method::DynaKv { b_max: 8, eager: true }, 96), (Method::Static, 64)]
    {
        let cfg = SparseConfig { method, budget, sinks: 4, recent: 16 };
        let mut ram = SparseKv::new(&model.config, Some(cfg));
        prefill(&model, &mut ram, prompt);
        let want = decode(&model, &mut ram, rest);
        // Co-retrieval placement (the default) and index order, append and dual-head layouts.
        for (backend, policy, cache, co_retrieval, layout) in [
            (Backend::Thread, Policy::ClusterAligned, 40 << 10, true, Layout::Append),
            (Backend::Inline, Policy::Lru, 40 << 10, true, Layout::Append),
            (Backend::Uring, Policy::ClusterAligned, 40 << 10, true, Layout::Append),
            (Backend::Thread, Policy::Lru, 0, true, Layout::Append),
            (Backend::Inline, Policy::ClusterAligned, 40 << 10, false, Layout::Append),
            (Backend::Thread, Policy::ClusterAligned, 40 << 10, true, Layout::DualHead),
            (Backend::Inline, Policy::Lru, 0, false, Layout::DualHead),
        ] {
            let mut kv = SparseKv::new(&model.config, Some(cfg));
            prefill(&model, &mut kv, prompt);
            let oc = OffloadConfig { backend, policy, cache_bytes: cache, co_retrieval, layout, ..offload_cfg(store.path(), &model) };
            assert!(kv.offload(oc).unwrap());
            let path = kv.offload_path().unwrap().to_path_buf();
            assert!(path.exists());
            assert!(kv.ram_kv_bytes() < kv.kv_bytes() / 2, "{} of {} bytes in RAM", kv.ram_kv_bytes(), kv.kv_bytes());
            let got = decode(&model, &mut kv, rest);
            assert_eq!(
                got,
                want,
                "{} {backend:?} {policy:?} cache {cache} co-retrieval {co_retrieval} {layout:?}: offloaded logits differ",
                method.name()
            );
            let s = kv.offload_stats().unwrap();
            assert_eq!(s.moved_bytes, 0, "{s:?}");
            assert!(s.flushed_in_place_rows + s.flushed_elsewhere_rows > 0, "flushes ran: {s:?}");
            match layout {
                Layout::Append => assert_eq!((s.flushed_in_place_rows, s.slack_bytes), (0, 0), "{s:?}"),
                Layout::DualHead => assert!(s.flushed_in_place_rows > 0 && s.slack_bytes > 0, "rows grew into slack: {s:?}"),
            }
            assert!(s.read_bytes > 0 && s.read_ops > 0, "{s:?}");
            assert!(s.written_bytes > (prompt.len() as u64 - 20) * 4 * 4 * 16, "flushes and the offload: {s:?}");
            assert!(s.cache_bytes <= cache, "{s:?}");
            if cache > 0 {
                assert!(s.cache.hits > 0 && s.cache.evictions > 0, "{s:?}");
            }
            drop(kv);
            assert!(!path.exists(), "the file goes with the cache");
        }
    }
}

#[test]
fn with_a_full_budget_the_offloaded_cache_is_exact_attention() {
    let (_d, model) = model();
    let ids = tokens(600);
    let (prompt, rest) = ids.split_at(560);
    let mut exact = SparseKv::new(&model.config, None);
    prefill(&model, &mut exact, prompt);
    let want = decode(&model, &mut exact, rest);
    let store = tempfile::tempdir().unwrap();
    let mut kv = SparseKv::new(
        &model.config,
        Some(SparseConfig { method: Method::DynaKv { b_max: 8, eager: false }, budget: 4096, sinks: 4, recent: 16 }),
    );
    prefill(&model, &mut kv, prompt);
    assert!(kv.offload(offload_cfg(store.path(), &model)).unwrap());
    assert_eq!(decode(&model, &mut kv, rest), want);
}

#[test]
fn delayed_splits_read_less_for_splitting_than_eager_ones() {
    let (_d, model) = model();
    let ids = tokens(760);
    let (prompt, rest) = ids.split_at(600);
    let store = tempfile::tempdir().unwrap();
    let mut split = Vec::new();
    for eager in [false, true] {
        let cfg = SparseConfig { method: Method::DynaKv { b_max: 64, eager }, budget: 96, sinks: 4, recent: 16 };
        let mut kv = SparseKv::new(&model.config, Some(cfg));
        prefill(&model, &mut kv, prompt);
        kv.offload(OffloadConfig { cache_bytes: 0, ..offload_cfg(store.path(), &model) }).unwrap();
        decode(&model, &mut kv, rest);
        split.push(kv.offload_stats().unwrap().split_bytes);
    }
    assert!(split[1] > 0, "eager splits read clusters: {split:?}");
    assert!(split[0] < split[1], "delayed {} vs eager {}", split[0], split[1]);
}

#[test]
fn bad_configurations_are_errors_that_change_nothing() {
    let (_d, model) = model();
    let ids = tokens(400);
    let (prompt, rest) = ids.split_at(360);
    let cfg = SparseConfig { method: Method::DynaKv { b_max: 8, eager: false }, budget: 64, sinks: 4, recent: 16 };
    let mut ram = SparseKv::new(&model.config, Some(cfg));
    prefill(&model, &mut ram, prompt);
    let want = decode(&model, &mut ram, rest);
    let mut kv = SparseKv::new(&model.config, Some(cfg));
    prefill(&model, &mut kv, prompt);
    let store = tempfile::tempdir().unwrap();
    let missing = store.path().join("no/such/dir");
    let e = kv.offload(OffloadConfig { dir: missing, ..offload_cfg(store.path(), &model) }).unwrap_err();
    assert!(e.to_string().contains("no/such/dir"), "{e}");
    let e = kv.offload(OffloadConfig { flush: 0, ..offload_cfg(store.path(), &model) }).unwrap_err();
    assert!(e.to_string().contains("flush"), "{e}");
    // Under the budget: stays in RAM.
    assert!(!kv.offload(OffloadConfig { ram_budget: usize::MAX, ..offload_cfg(store.path(), &model) }).unwrap());
    assert!(!kv.is_offloaded());
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 0, "no file left behind");
    assert_eq!(decode(&model, &mut kv, rest), want);
    let mut exact = SparseKv::new(&model.config, None);
    prefill(&model, &mut exact, prompt);
    assert!(exact.offload(offload_cfg(store.path(), &model)).unwrap_err().to_string().contains("sparse method"));
}

#[test]
fn a_file_truncated_under_a_running_decode_is_an_error_and_the_sequence_ends() {
    let (_d, model) = model();
    let ids = tokens(540);
    let (prompt, rest) = ids.split_at(500);
    let store = tempfile::tempdir().unwrap();
    let cfg = SparseConfig { method: Method::DynaKv { b_max: 8, eager: false }, budget: 64, sinks: 4, recent: 16 };
    for (backend, layout) in [
        (Backend::Thread, Layout::Append),
        (Backend::Inline, Layout::Append),
        (Backend::Uring, Layout::Append),
        (Backend::Thread, Layout::DualHead),
    ] {
        let mut kv = SparseKv::new(&model.config, Some(cfg));
        prefill(&model, &mut kv, prompt);
        // No cluster cache: every step reads the file.
        assert!(kv.offload(OffloadConfig { backend, layout, cache_bytes: 0, ..offload_cfg(store.path(), &model) }).unwrap());
        decode(&model, &mut kv, &rest[..3]);
        assert!(kv.offload_failure().is_none());
        let path = kv.offload_path().unwrap().to_path_buf();
        std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(4096 + 4 * 256).unwrap();
        let len = kv.len();
        for (i, &t) in rest[3..6].iter().enumerate() {
            kv.reserve(1);
            let slot = kv.len();
            let e = model.forward(&mut [SeqStep::new(&[t], slot, &mut kv, Logits::Last)]).unwrap_err();
            assert!(e.to_string().contains("truncated") && e.to_string().contains("offload read failed"), "{backend:?} step {i}: {e}");
        }
        let why = kv.offload_failure().expect("the failure stays recorded");
        assert!(why.contains(&path.display().to_string()), "{why}");
        assert!(kv.len() <= len + 1, "a failed cache takes no more tokens");
        drop(kv);
        assert!(!path.exists(), "the file still goes with the cache");
    }
}

#[test]
fn layer_ahead_prefetch_hits_and_changes_no_logit() {
    let (_d, model) = model();
    let ids = tokens(680);
    let (prompt, rest) = ids.split_at(620);
    let store = tempfile::tempdir().unwrap();
    let cfg = SparseConfig { method: Method::DynaKv { b_max: 8, eager: false }, budget: 96, sinks: 4, recent: 16 };
    let mut runs = Vec::new();
    for (prefetch, backend) in [(false, Backend::Thread), (true, Backend::Thread), (true, Backend::Uring)] {
        let mut kv = SparseKv::new(&model.config, Some(cfg));
        prefill(&model, &mut kv, prompt);
        let oc = OffloadConfig { prefetch, backend, cache_bytes: 40 << 10, ..offload_cfg(store.path(), &model) };
        assert!(kv.offload(oc).unwrap());
        let logits = decode(&model, &mut kv, rest);
        runs.push((logits, kv.offload_stats().unwrap()));
    }
    let off = runs[0].1;
    assert_eq!((off.prefetch_bytes, off.cache.prefetched, off.cache.prefetch_hits), (0, 0, 0), "{off:?}");
    for (logits, on) in &runs[1..] {
        assert_eq!(logits, &runs[0].0, "prefetch changed the logits ({:?})", on.backend);
        assert!(on.prefetch_bytes > 0 && on.cache.prefetched > 0, "{on:?}");
        assert!(on.cache.prefetch_hits > 0, "no prefetched cluster was used: {on:?}");
        assert!(on.cache.prefetch_hits + on.cache.prefetch_unused <= on.cache.prefetched, "{on:?}");
        assert!(on.read_bytes >= on.prefetch_bytes, "prefetch reads are disk reads too: {on:?}");
        eprintln!("prefetch {:?}: {on:?} (off: {off:?})", on.backend);
    }
}

fn spec(fp: u8) -> FileSpec {
    FileSpec { layers: 2, heads: 3, dim: 8, fingerprint: [fp; 32] }
}

#[test]
fn the_reader_returns_the_written_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv");
    let mut f = OffloadFile::create(&path, spec(1)).unwrap();
    let rb = spec(1).row_bytes();
    let rows: Vec<u8> = (0..100 * rb).map(|i| (i * 31 % 251) as u8).collect();
    assert_eq!(f.append(&rows[..40 * rb]).unwrap(), 0);
    assert_eq!(f.append(&rows[40 * rb..]).unwrap(), 40);
    assert!(OffloadFile::create(&path, spec(1)).is_err(), "never overwrites");
    for backend in [Backend::Thread, Backend::Inline, Backend::Uring] {
        let r = Reader::new(f.reader().unwrap(), rb, backend).unwrap();
        let got = r.read(vec![(3, 5), (90, 10), (0, 1)]).unwrap();
        let want: Vec<u8> = [&rows[3 * rb..8 * rb], &rows[90 * rb..100 * rb], &rows[..rb]].concat();
        assert_eq!(got, want, "{backend:?}");
        let e = r.read(vec![(95, 10)]).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
    }
    let g = OffloadFile::open(&path, spec(1)).unwrap();
    assert_eq!(g.rows(), 100);
    let mut one = vec![0u8; rb];
    g.read_rows(57, &mut one).unwrap();
    assert_eq!(one, rows[57 * rb..58 * rb]);
}

#[test]
fn corrupt_truncated_and_foreign_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kv");
    let mut f = OffloadFile::create(&path, spec(1)).unwrap();
    f.append(&vec![7u8; 10 * spec(1).row_bytes()]).unwrap();
    drop(f);
    let good = std::fs::read(&path).unwrap();
    let check = |bytes: &[u8], expect: FileSpec, what: &str| {
        std::fs::write(&path, bytes).unwrap();
        let e = OffloadFile::open(&path, expect).err().unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(e.to_string().contains(what), "{what}: {e}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "opening changes nothing");
    };
    check(&good, spec(2), "fingerprint");
    check(&good, FileSpec { dim: 16, ..spec(1) }, "fingerprint");
    check(&good[..100], spec(1), "shorter than its");
    check(&good[..good.len() - 3], spec(1), "truncated");
    let mut bad = good.clone();
    bad[0] ^= 1;
    check(&bad, spec(1), "magic");
    let mut bad = good.clone();
    bad[20] ^= 1; // the header length field
    check(&bad, spec(1), "checksum");
    let mut bad = good.clone();
    bad[40] ^= 0x80; // the fingerprint
    check(&bad, spec(1), "checksum");
    check(b"GGUF and then some other file entirely", spec(1), "shorter than its");
    let mut foreign = vec![0u8; 8192];
    foreign[..4].copy_from_slice(b"GGUF");
    check(&foreign, spec(1), "magic");
    std::fs::write(&path, &good).unwrap();
    assert!(OffloadFile::open(&path, spec(1)).is_ok());
}

/// A dual-head file names its layout in its fingerprint: opened as an append-layout file of
/// the same model and configuration it is rejected (and the other way round it opens).
#[test]
fn a_dual_head_file_is_not_read_as_an_append_layout_one() {
    let (_d, model) = model();
    let ids = tokens(300);
    let cfg = SparseConfig { method: Method::DynaKv { b_max: 8, eager: false }, budget: 64, sinks: 4, recent: 16 };
    let store = tempfile::tempdir().unwrap();
    let mut kv = SparseKv::new(&model.config, Some(cfg));
    prefill(&model, &mut kv, &ids);
    assert!(kv.offload(OffloadConfig { layout: Layout::DualHead, ..offload_cfg(store.path(), &model) }).unwrap());
    let c = &model.config;
    let spec = |layout| FileSpec {
        layers: c.num_layers as u32,
        heads: c.num_kv_heads as u32,
        dim: c.head_dim as u32,
        fingerprint: engram_sparse::offload::fingerprint(model.fingerprint.0, &cfg, c.num_layers, c.num_kv_heads, c.head_dim, layout),
    };
    let path = kv.offload_path().unwrap();
    let e = OffloadFile::open(path, spec(Layout::Append)).err().expect("a dual-head file opened as append layout");
    assert!(e.to_string().contains("fingerprint"), "{e}");
    let f = OffloadFile::open(path, spec(Layout::DualHead)).unwrap();
    assert_eq!(f.rows() % (4096 / f.spec().row_bytes()) as u64, 0, "regions are whole pages");
}
