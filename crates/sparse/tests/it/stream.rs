//! Bounded prefill (`SparseKv::offload_streaming`): a prompt streamed to the offload file as it
//! is written keeps the KV in RAM within its budget and answers every read with the bits the
//! cache prefilled in RAM and offloaded after answers with — whole forward passes on the
//! `tiny` fixture (prefill and decode logits bitwise equal), and, past several k-means
//! segments, every key read back, the index and each decode step's selection and gathered
//! keys.

use std::path::Path;

use crate::common;
use common::{decode, model, noise, prefill, tokens};

use engram_model::{KvCache, KvChunk, KvRead, Logits, Model, SeqStep};
use engram_sparse::kmeans::SEGMENT;
use engram_sparse::{Backend, Method, OffloadConfig, SparseConfig, SparseKv};

use crate::heap;

fn offload_cfg(dir: &Path, fingerprint: u64, ram_budget: usize) -> OffloadConfig {
    OffloadConfig { ram_budget, flush: 8, cache_bytes: 16 << 10, ..OffloadConfig::new(dir.to_path_buf(), fingerprint) }
}

/// Prefills `prompt` in chunks of 64 with every chunk's last logits.
fn prefill_logits(model: &Model, kv: &mut SparseKv, prompt: &[u32]) -> Vec<Vec<f32>> {
    prompt
        .chunks(64)
        .map(|part| {
            kv.reserve(part.len());
            let slot = kv.len();
            model.forward(&mut [SeqStep::new(part, slot, kv, Logits::Last)]).unwrap().remove(0)
        })
        .collect()
}

#[test]
fn a_streamed_prefill_gives_the_logits_of_offloading_after_it_bitwise() {
    let (_d, model) = model();
    let ids = tokens(700);
    let (prompt, rest) = ids.split_at(620);
    let store = tempfile::tempdir().unwrap();
    let c = &model.config;
    let row = c.num_layers * c.num_kv_heads * c.head_dim * 4;
    for (method, budget) in [(Method::DynaKv { b_max: 8, eager: false }, 96), (Method::Static, 64), (Method::Quest { page: 16 }, 64)] {
        let cfg = SparseConfig { method, budget, sinks: 4, recent: 16 };
        let mut after = SparseKv::new(c, Some(cfg));
        let want_prefill = prefill_logits(&model, &mut after, prompt);
        after.build_index();
        assert!(after.offload(offload_cfg(store.path(), model.fingerprint.0, 0)).unwrap());
        let want = decode(&model, &mut after, rest);
        for budget_tokens in [0, 100, 300] {
            let mut kv = SparseKv::new(c, Some(cfg));
            kv.offload_streaming(offload_cfg(store.path(), model.fingerprint.0, budget_tokens * row)).unwrap();
            let got_prefill = prefill_logits(&model, &mut kv, prompt);
            assert_eq!(got_prefill, want_prefill, "{} budget {budget_tokens}: prefill logits differ", method.name());
            let peak = kv.peak_ram_kv_bytes();
            // The budget (at least the recent window) and one chunk of 64, the sinks apart.
            let bound = (budget_tokens.max(16) + 64 + 4) * row;
            assert!(peak <= bound, "{} budget {budget_tokens}: {peak} bytes in RAM, bound {bound}", method.name());
            assert!(peak < kv.kv_bytes(), "the prompt never sat whole in RAM");
            kv.build_index();
            assert!(kv.is_offloaded());
            let s = kv.offload_stats().unwrap();
            assert!(s.full_bytes > 0 && s.written_bytes > 0, "{s:?}");
            let got = decode(&model, &mut kv, rest);
            assert_eq!(got, want, "{} budget {budget_tokens}: decode logits differ", method.name());
            let path = kv.offload_path().unwrap().to_path_buf();
            drop(kv);
            assert!(!path.exists(), "the file goes with the cache");
        }
    }
}

#[test]
fn a_prompt_within_the_budget_stays_in_ram_and_bad_configurations_are_errors() {
    let (_d, model) = model();
    let ids = tokens(300);
    let (prompt, rest) = ids.split_at(260);
    let cfg = SparseConfig { method: Method::DynaKv { b_max: 8, eager: false }, budget: 64, sinks: 4, recent: 16 };
    let store = tempfile::tempdir().unwrap();
    let mut ram = SparseKv::new(&model.config, Some(cfg));
    prefill(&model, &mut ram, prompt);
    let want = decode(&model, &mut ram, rest);
    let mut kv = SparseKv::new(&model.config, Some(cfg));
    kv.offload_streaming(offload_cfg(store.path(), model.fingerprint.0, usize::MAX)).unwrap();
    prefill(&model, &mut kv, prompt);
    assert!(!kv.is_offloaded());
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 0, "no file left behind");
    assert_eq!(decode(&model, &mut kv, rest), want);

    let mut kv = SparseKv::new(&model.config, Some(cfg));
    let e = kv.offload_streaming(offload_cfg(&store.path().join("no/such/dir"), model.fingerprint.0, 0)).unwrap_err();
    assert!(e.to_string().contains("no/such/dir"), "{e}");
    let e = kv.offload_streaming(OffloadConfig { flush: 0, ..offload_cfg(store.path(), model.fingerprint.0, 0) }).unwrap_err();
    assert!(e.to_string().contains("flush"), "{e}");
    let e = kv
        .offload_streaming(OffloadConfig { layout: engram_sparse::Layout::DualHead, ..offload_cfg(store.path(), model.fingerprint.0, 0) })
        .unwrap_err();
    assert!(e.to_string().contains("append layout"), "{e}");
    assert!(!kv.is_offloaded());
    prefill(&model, &mut kv, prompt);
    assert!(kv.offload_streaming(offload_cfg(store.path(), model.fingerprint.0, 0)).unwrap_err().to_string().contains("before"));
    assert_eq!(std::fs::read_dir(store.path()).unwrap().count(), 0, "no file left behind");
}

/// Every (position, key bits, value bits) a read of (layer, head) yields, in its chunks' order.
fn collect(kv: &SparseKv, layer: usize, head: usize, queries: &[f32], positions: &[u32]) -> Vec<(u32, Vec<u16>, Vec<u16>)> {
    let read = KvRead { layer, kv_head: head, queries, group: 1, positions };
    let mut out = Vec::new();
    kv.for_each_chunk_of(&read, &mut |c: &KvChunk<'_>| {
        let (k, v): (&[u16], &[u16]) = (bytemuck::cast_slice(c.keys.bytes), bytemuck::cast_slice(c.values.bytes));
        let d = queries.len() / positions.len();
        for i in 0..c.len {
            let pos = c.positions.map_or((c.first_pos + i) as u32, |p| p[i]);
            let row = head * c.capacity + i;
            out.push((pos, k[row * d..(row + 1) * d].to_vec(), v[row * d..(row + 1) * d].to_vec()));
        }
    });
    out
}

#[test]
fn past_several_segments_every_read_and_choice_equals_offloading_after() {
    let (layers, heads, d) = (2, 2, 16);
    let n = 2 * SEGMENT + 1500;
    let keys: Vec<f32> =
        noise(3, n * heads * d).iter().enumerate().map(|(i, v)| v + ((i / (heads * d)) as f32 / 211.0).sin() * 2.0).collect();
    let values = noise(4, n * heads * d);
    let cfg = SparseConfig { method: Method::DynaKv { b_max: 8, eager: false }, budget: 256, sinks: 4, recent: 32 };
    let store = tempfile::tempdir().unwrap();
    let row = layers * heads * d * 4;
    let budget = 1000;
    let mut after = SparseKv::with_shape(layers, heads, d, Some(cfg));
    let mut kv = SparseKv::with_shape(layers, heads, d, Some(cfg));
    kv.offload_streaming(offload_cfg(store.path(), 7, budget * row)).unwrap();
    let w = heads * d;
    let q = noise(5, d);
    for (ci, part) in (0..n).collect::<Vec<_>>().chunks(700).enumerate() {
        let (a, m) = (part[0], part.len());
        for c in [&mut after, &mut kv] {
            c.reserve(m);
            for l in 0..layers {
                c.write(l, a, &keys[a * w..(a + m) * w], &values[a * w..(a + m) * w], m);
            }
        }
        if ci % 5 == 4 {
            // A two-token read (the prefill's exact attention) sees every key, bit for bit.
            for (l, h) in [(0, 0), (1, 1)] {
                let (qq, pos) = ([q.clone(), q.clone()].concat(), [(a + m - 2) as u32, (a + m - 1) as u32]);
                let want = collect(&after, l, h, &qq, &pos);
                assert_eq!(want.len(), a + m);
                assert!(collect(&kv, l, h, &qq, &pos) == want, "chunk {ci}: layer {l} head {h} reads differ");
            }
        }
    }
    assert!(kv.peak_ram_kv_bytes() <= (budget + 700 + 4) * row, "{} bytes", kv.peak_ram_kv_bytes());
    after.build_index();
    assert!(after.offload(offload_cfg(store.path(), 7, 0)).unwrap());
    kv.build_index();
    assert!(kv.is_offloaded());
    assert_eq!(kv.index_stats(), after.index_stats(), "the same clusters");
    assert_eq!(kv.ram_kv_bytes(), after.ram_kv_bytes());
    // Decode steps: the same choice and the same gathered bits.
    let more = 40;
    let keys2 = noise(6, more * w);
    for t in 0..more {
        let p = n + t;
        for c in [&mut after, &mut kv] {
            c.reserve(1);
            for l in 0..layers {
                c.write(l, p, &keys2[t * w..(t + 1) * w], &keys2[t * w..(t + 1) * w], 1);
            }
        }
        let qt = noise(100 + t as u64, d);
        for l in 0..layers {
            for h in 0..heads {
                let want = collect(&after, l, h, &qt, &[p as u32]);
                assert!(want.len() < p / 2, "a sparse read");
                assert!(collect(&kv, l, h, &qt, &[p as u32]) == want, "step {t}: layer {l} head {h} differs");
                assert_eq!(kv.last_selection(l, h), after.last_selection(l, h));
            }
        }
    }
}

/// The heap one read of every key (a prompt's exact attention over an offloaded history) takes
/// while it runs, and what it leaves allocated after: measured on this thread (file reads
/// inline) for the last KV head (whose rows sit furthest into a `[kv_head][rows]` chunk) over
/// histories of 1 and 3 segments plus a part.
fn full_read_heap(n: usize) -> (isize, isize) {
    let (layers, heads, d) = (1, 4, 32);
    let w = heads * d;
    let cfg = SparseConfig { method: Method::DynaKv { b_max: 8, eager: false }, budget: 256, sinks: 4, recent: 32 };
    let store = tempfile::tempdir().unwrap();
    let mut kv = SparseKv::with_shape(layers, heads, d, Some(cfg));
    let off = OffloadConfig { backend: Backend::Inline, prefetch: false, ..offload_cfg(store.path(), 7, 500 * layers * w * 4) };
    kv.offload_streaming(off).unwrap();
    let (keys, values) = (noise(11, 2048 * w), noise(12, 2048 * w));
    let mut a = 0;
    while a < n {
        let m = (n - a).min(2048);
        kv.reserve(m);
        kv.write(0, a, &keys[..m * w], &values[..m * w], m);
        a += m;
    }
    let q = noise(13, 2 * d);
    let pos = [n as u32 - 2, n as u32 - 1];
    let read = KvRead { layer: 0, kv_head: heads - 1, queries: &q, group: 1, positions: &pos };
    let mut seen = 0;
    // Once before measuring: the calibration set keeps a read's queries (bounded, warmed here).
    kv.for_each_chunk_of(&read, &mut |c: &KvChunk<'_>| seen += c.len);
    assert_eq!(seen, n);
    let base = heap::live();
    heap::reset_peak();
    seen = 0;
    kv.for_each_chunk_of(&read, &mut |c: &KvChunk<'_>| seen += c.len);
    assert_eq!(seen, n, "every key read");
    assert!(kv.read_failure().is_none());
    (heap::peak() - base, heap::live() - base)
}

#[test]
fn a_read_of_every_offloaded_key_takes_heap_independent_of_the_history_and_keeps_none() {
    // One head's rows of one segment (keys and values, f16): what a read sized by the
    // segment would hold; the chunk's layout for the last head would hold `heads` times more.
    let segment_head = (SEGMENT * 32 * 2 * 2) as isize;
    let (small, small_kept) = full_read_heap(SEGMENT + 700);
    let (large, large_kept) = full_read_heap(3 * SEGMENT + 700);
    assert!(small_kept <= 4096 && large_kept <= 4096, "left allocated after the read: {small_kept}, {large_kept} bytes");
    assert!(large <= small + 4096, "a longer history took more heap: {large} vs {small} bytes");
    assert!(large < segment_head / 2, "the read took {large} bytes of heap (one head's segment: {segment_head})");
}
