//! Sliding layers released outside their window (`engram_kv::SlidingLayers`), on the
//! `tiny-gemma3` fixture (five layers over a 16-position window, one global): a sequence that
//! releases holds its global layers' whole history but only the window of the sliding ones,
//! answers exactly as one that keeps everything, in every KV format; a request that diverges
//! resumes where the window before it is whole and recomputes no more than from the first
//! released position; entries store only what is held and restore to the same answers.

use engram_fixture::Shape;
use engram_kv::{EntryKind, EntryMeta, KvFormat, KvLayout, KvPool, SeqKv, SlidingLayers, BLOCK_TOKENS};
use engram_model::{Logits, Model, SeqStep};

/// Runs `tokens` at the end of `kv`, returning the last token's logits.
fn step(model: &Model, kv: &mut SeqKv, tokens: &[u32]) -> Vec<f32> {
    kv.reserve(tokens.len()).unwrap();
    let first_pos = kv.len();
    let mut s = [SeqStep { tokens, first_pos, positions: None, key_mask: None, kv, logits: Logits::Last }];
    model.forward(&mut s).unwrap().remove(0)
}

/// Prefills `tokens` in chunks of `chunk`, returning the last logits.
fn prefill(model: &Model, kv: &mut SeqKv, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut last = Vec::new();
    for c in tokens.chunks(chunk) {
        last = step(model, kv, c);
    }
    last
}

fn argmax(x: &[f32]) -> u32 {
    x.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0 as u32
}

fn fixture() -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::TinyGemma3, engram_fixture::DEFAULT_SEED, dir.path(), &[], &mut |_| {}).unwrap();
    let model = Model::load(&files.hf_dir).unwrap();
    (dir, model)
}

/// `n` token ids below the vocabulary, varied (a deterministic walk).
fn tokens(model: &Model, n: usize, seed: u32) -> Vec<u32> {
    let v = model.config.vocab as u32;
    (0..n as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed.wrapping_mul(40503)) >> 7) % (v - 3) + 3).collect()
}

#[test]
fn released_sliding_layers_cost_only_the_window_and_answer_as_full_history() {
    let (_dir, model) = fixture();
    let g = SlidingLayers::of(&model.config).expect("tiny-gemma3 has sliding layers");
    assert_eq!((g.window(), g.num_global(), g.num_layers()), (16, 1, 6));
    // Twenty windows long, prefilled in chunks that straddle blocks and windows, then decoded.
    let prompt = tokens(&model, 320, 1);
    for format in [KvFormat::F32, KvFormat::F16, KvFormat::Q8, KvFormat::Q4] {
        let full_pool = KvPool::new(KvLayout::of(&model.config), format, 64 << 20);
        let pool = KvPool::new(KvLayout::of(&model.config), format, 64 << 20);
        let (mut full, mut kv) = (SeqKv::new(&full_pool), SeqKv::new(&pool));
        kv.release_sliding(g.clone());
        let chunk = 37;
        let want = prefill(&model, &mut full, &prompt, chunk);
        let got = prefill(&model, &mut kv, &prompt, chunk);
        assert_eq!(got, want, "{format:?}: prefill over released layers");
        let mut a = want;
        for _ in 0..40 {
            let t = argmax(&a);
            a = step(&model, &mut full, &[t]);
            let b = step(&model, &mut kv, &[t]);
            assert_eq!(a, b, "{format:?}: decoding over released layers");
        }
        kv.release_outside_window();
        let n = kv.len();
        // Global layers: every token; sliding layers: the window, a step and the slack, in blocks.
        let bound = g.bytes_for(&pool, n, chunk);
        let all = full_pool.bytes_for(n);
        eprintln!(
            "tiny-gemma3 {format:?}: {n} tokens hold {} bytes released vs {} full history ({} blocks released; bound {bound})",
            kv.num_bytes(),
            full.num_bytes(),
            kv.num_released_blocks()
        );
        assert_eq!(pool.used(), kv.num_bytes(), "{format:?}: the pool counts what the sequence holds");
        assert_eq!(full_pool.used(), all, "{format:?}: the full-history sequence holds every block");
        assert!(kv.num_bytes() <= bound, "{format:?}: {} > {bound}", kv.num_bytes());
        // Exactly: the blocks past the window hold one layer of six.
        let kept = n.div_ceil(BLOCK_TOKENS) - kv.num_released_blocks();
        let win = if pool.has_window() { pool.window_bytes() } else { 0 };
        assert_eq!(kv.num_bytes(), kept * pool.block_bytes() + kv.num_released_blocks() * pool.block_bytes() / 6 + win);
        assert!((n - (16 + 2 * BLOCK_TOKENS + BLOCK_TOKENS)).div_ceil(BLOCK_TOKENS) <= kv.num_released_blocks());
    }
}

#[test]
fn a_divergence_resumes_where_the_window_is_whole_and_equals_a_cold_run() {
    let (_dir, model) = fixture();
    let g = SlidingLayers::of(&model.config).unwrap();
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 64 << 20);
    let history = tokens(&model, 300, 2);
    // Turns end at 40, 100 and 200: the window before the newest two is kept.
    let mut kv = SeqKv::new(&pool);
    kv.release_sliding(g.clone());
    for (from, to) in [(0, 40), (40, 100), (100, 200), (200, 300)] {
        prefill(&model, &mut kv, &history[from..to], 37);
        if to < 300 {
            kv.keep_window_at(to);
        }
    }
    assert_eq!(kv.resume_points(), [100, 200]);
    kv.release_outside_window();
    // Released: blocks whose end is 16 + 32 positions before the end and that no turn's
    // window needs (84..100 is in blocks 2 and 3, 184..200 in blocks 5 and 6): blocks 0, 1, 4.
    let released: Vec<usize> = kv.blocks().iter().enumerate().filter(|(_, b)| b.released().is_some()).map(|(i, _)| i).collect();
    assert_eq!(released, [0, 1, 4]);
    // Where a request diverging at `d` resumes: `d` where the 16 positions before it are held,
    // else the start of the released block they reach into (the first position it must
    // recompute), and so on back: at 70 the window reaches block 1, whose own window reaches
    // block 0.
    for (d, want) in [(300, 300), (250, 250), (200, 200), (150, 128), (128, 128), (100, 100), (90, 90), (70, 0), (40, 0), (10, 0)] {
        assert_eq!(kv.resumable(d), want, "diverging at {d}");
    }
    // The recompute is no longer than needed: every later point's window reaches a released block.
    let window_whole = |m: usize| released.iter().all(|&b| b * BLOCK_TOKENS >= m || (b + 1) * BLOCK_TOKENS + 16 <= m);
    for d in 0..=300 {
        let r = kv.resumable(d);
        assert!(window_whole(r), "resuming at {r}: its window is whole");
        assert!((r + 1..=d).all(|m| !window_whole(m)), "diverging at {d}: resumed at {r}, a later point would do");
    }
    for d in [150, 100, 70] {
        let r = kv.resumable(d);
        let mut other = history[..d].to_vec();
        other.extend(tokens(&model, 60, 3));
        let mut warm = kv.fork(r);
        let got = prefill(&model, &mut warm, &other[r..], 37);
        let mut cold = SeqKv::new(&pool);
        let want = prefill(&model, &mut cold, &other, 37);
        assert_eq!(got, want, "diverging at {d}, resumed at {r}");
    }
}

#[test]
fn an_entry_stores_what_is_held_and_restores_exactly() {
    let (_dir, model) = fixture();
    let g = SlidingLayers::of(&model.config).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for format in [KvFormat::F16, KvFormat::Q4] {
        let pool = KvPool::new(KvLayout::of(&model.config), format, 64 << 20);
        let history = tokens(&model, 250, 4);
        let mut kv = SeqKv::new(&pool);
        kv.release_sliding(g.clone());
        prefill(&model, &mut kv, &history[..120], 37);
        kv.keep_window_at(120);
        prefill(&model, &mut kv, &history[120..], 37);
        kv.release_outside_window();
        assert!(kv.num_released_blocks() > 0);
        let fp = engram_kv::cache_fingerprint(model.fingerprint, format);
        let meta = EntryMeta {
            fingerprint: fp.clone(),
            kind: EntryKind::Session,
            owner: "a".into(),
            tokens: history.clone(),
            text: String::new(),
            offsets: vec![],
            created_unix: 0,
        };
        let path = dir.path().join(format!("e-{format}.safetensors"));
        let written = engram_kv::write_entry(&path, &meta, &kv).unwrap() as usize;
        let full_rows = kv.blocks().len() * pool.block_bytes();
        assert!(written < full_rows, "{format:?}: {written} bytes written, full history is {full_rows}");
        let bytes = engram_kv::persist::encode_entry(&meta, &kv).unwrap();
        let restores = [
            engram_kv::read_entry(&path, &pool, &fp, model.config.vocab).unwrap().1,
            engram_kv::persist::decode_entry("value", &bytes, &pool, &fp, model.config.vocab).unwrap().1,
        ];
        let next = tokens(&model, 50, 5);
        let mut live = kv.fork(kv.len());
        let want = prefill(&model, &mut live, &next, 37);
        for mut r in restores {
            assert_eq!(r.num_released_blocks(), kv.num_released_blocks());
            assert_eq!(r.num_bytes(), kv.num_bytes(), "{format:?}: restored holds what was saved");
            assert_eq!(r.resume_points(), kv.resume_points());
            assert_eq!(r.resumable(140), kv.resumable(140));
            let got = prefill(&model, &mut r, &next, 37);
            assert_eq!(got, want, "{format:?}: continuing a restored entry");
        }
    }
}

#[test]
fn spans_of_released_rows_are_an_error() {
    let (_dir, model) = fixture();
    let g = SlidingLayers::of(&model.config).unwrap();
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 64 << 20);
    let mut kv = SeqKv::new(&pool);
    kv.release_sliding(g);
    prefill(&model, &mut kv, &tokens(&model, 200, 6), 37);
    kv.release_outside_window();
    assert!(kv.blocks()[1].released().is_some() && kv.blocks()[5].released().is_none());
    // Rows in a released block: refused, naming the first released slot asked for.
    assert_eq!(kv.try_spans(0..200).err(), Some(engram_kv::KvError::Released { slot: 0 }));
    assert_eq!(kv.try_spans(40..70).err(), Some(engram_kv::KvError::Released { slot: 40 }));
    // Rows the sequence still holds whole: spans as before.
    let spans = kv.try_spans(160..200).unwrap();
    assert_eq!(spans.iter().map(|s| s.len()).sum::<usize>(), 40);
    assert_eq!(spans[0].positions()[0], 160);
}

/// What `SlidingLayers::bytes_held` says a sequence holds is what it holds at rest, and bounds
/// what the pool is charged while it is prefilled in steps; far below full history.
#[test]
fn bytes_held_is_what_a_released_sequence_holds() {
    let (_dir, model) = fixture();
    let g = SlidingLayers::of(&model.config).unwrap();
    for format in [KvFormat::F32, KvFormat::Q4] {
        for spaced in [false, true] {
            let pool = KvPool::new(KvLayout::of(&model.config), format, 64 << 20);
            let mut kv = SeqKv::new(&pool);
            kv.release_sliding(g.clone());
            if spaced {
                kv.keep_spaced_windows();
            }
            let chunk = 45;
            let prompt = tokens(&model, 900, 8);
            kv.keep_window_at(130);
            kv.keep_window_at(500);
            let mut peak = 0;
            for c in prompt.chunks(chunk) {
                step(&model, &mut kv, c);
                peak = peak.max(pool.used());
            }
            let n = kv.len();
            let bound = g.bytes_held(&pool, n, chunk, kv.resume_points(), spaced);
            assert!(peak <= bound, "{format:?} spaced {spaced}: charged {peak} while prefilling, bound {bound}");
            kv.release_outside_window();
            let at_rest = g.bytes_held(&pool, n, 0, kv.resume_points(), spaced);
            assert_eq!(kv.num_bytes(), at_rest, "{format:?} spaced {spaced}: held at rest");
            assert_eq!(kv.bytes_held_at(n), at_rest);
            assert_eq!(pool.used(), at_rest);
            // Without spaced windows (the two resume points only) well under half of full
            // history; the spaced windows (about 3·log2(900 / 64) blocks here) keep more.
            let cap = if spaced { pool.bytes_for(n) * 2 / 3 } else { pool.bytes_for(n) / 2 };
            assert!(at_rest < cap, "{format:?} spaced {spaced}: {at_rest} of {} full history", pool.bytes_for(n));
            eprintln!("{format:?} spaced {spaced}: {n} tokens hold {at_rest} bytes (full history {})", pool.bytes_for(n));
        }
    }
}

#[test]
fn spaced_points_leave_for_good_and_stay_few() {
    let (_dir, model) = fixture();
    let g = SlidingLayers::of(&model.config).unwrap();
    let s = g.spacing();
    assert_eq!(s, 2 * BLOCK_TOKENS, "four windows of 16");
    let mut prev = g.spaced_points(0);
    assert!(prev.is_empty());
    for len in 1..20_000 {
        let now = g.spaced_points(len);
        // A point at or below the old length is in the new set only if it was in the old one.
        for p in now.iter().filter(|&&p| p <= len - 1) {
            assert!(prev.contains(p), "len {len}: point {p} came back");
        }
        assert!(now.iter().all(|&p| p > 0 && p <= len && p % s == 0));
        let levels = (len / s).max(1).ilog2() as usize + 1;
        assert!(now.len() <= 3 * levels, "len {len}: {} points", now.len());
        prev = now;
    }
}

/// With spaced windows, a request diverging at `d` of `n` tokens resumes after `d / 2` and less
/// than `max(2·spacing, 3·(n - d))` before `d`, and the answer after resuming equals a cold run.
#[test]
fn spaced_windows_resume_near_any_divergence_and_equal_cold() {
    let (_dir, model) = fixture();
    let g = SlidingLayers::of(&model.config).unwrap();
    let s = g.spacing();
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 64 << 20);
    let history = tokens(&model, 700, 9);
    let mut plain = SeqKv::new(&pool);
    plain.release_sliding(g.clone());
    let mut kv = SeqKv::new(&pool);
    kv.release_sliding(g.clone());
    kv.keep_spaced_windows();
    for c in history.chunks(61) {
        step(&model, &mut plain, c);
        step(&model, &mut kv, c);
    }
    plain.release_outside_window();
    kv.release_outside_window();
    let n = kv.len();
    assert!(kv.num_released_blocks() > 0);
    let (mut spaced_recompute, mut plain_recompute) = (0, 0);
    for d in 0..=n {
        let r = kv.resumable(d);
        assert!(r <= d);
        if d >= s {
            assert!(2 * r > d, "diverging at {d}: resumed at {r}, not after half");
        }
        assert!(d - r < (2 * s).max(3 * (n - d)), "diverging at {d} of {n}: resumed at {r}");
        assert!(r >= plain.resumable(d), "diverging at {d}: spaced windows resume no earlier");
        spaced_recompute += n - r;
        plain_recompute += n - plain.resumable(d);
    }
    eprintln!(
        "700 tokens, every divergence point: {spaced_recompute} tokens recomputed with spaced windows, {plain_recompute} without; \
         {} vs {} bytes held",
        kv.num_bytes(),
        plain.num_bytes()
    );
    for d in [650, 400, 333, 130, 70] {
        let r = kv.resumable(d);
        let mut other = history[..d].to_vec();
        other.extend(tokens(&model, 40, 10));
        let mut warm = kv.fork(r);
        let got = prefill(&model, &mut warm, &other[r..], 37);
        let mut cold = SeqKv::new(&pool);
        let want = prefill(&model, &mut cold, &other, 37);
        assert_eq!(got, want, "diverging at {d}, resumed at {r}");
    }
}
