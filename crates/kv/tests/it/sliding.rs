//! A sliding-window model (the `tiny-gemma3` fixture: five layers over a 16-position window,
//! one global) run over the paged KV store in every format: the prompt prefilled in chunks
//! that straddle blocks and windows, then decoded token by token, against transformers'
//! logits (`crates/model/tests/golden/tiny-gemma3.json`). The window is applied by position
//! over the store's chunks; every layer keeps its whole history.

use engram_fixture::Shape;
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};

fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}

fn rel(a: &[f32], b: &[f32]) -> f32 {
    let s = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / s
}

fn argmax(x: &[f32]) -> u32 {
    x.iter().enumerate().fold((0, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0 as u32
}

/// Runs `tokens` at the end of `kv`, returning the last token's logits.
fn step(model: &Model, kv: &mut SeqKv, tokens: &[u32]) -> Vec<f32> {
    kv.reserve(tokens.len()).unwrap();
    let first_pos = kv.len();
    let mut s = [SeqStep { tokens, first_pos, positions: None, key_mask: None, kv, logits: Logits::Last }];
    model.forward(&mut s).unwrap().remove(0)
}

#[test]
fn a_sliding_window_model_matches_transformers_over_every_kv_format() {
    let path = format!("{}/../model/tests/golden/tiny-gemma3.json", env!("CARGO_MANIFEST_DIR"));
    let g: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::TinyGemma3, engram_fixture::DEFAULT_SEED, dir.path(), &[], &mut |_| {}).unwrap();
    let model = Model::load(&files.hf_dir).unwrap();
    let ids = u32s(&g["prompt_ids"]);
    let want_last: Vec<f32> = g["last_logits"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect();
    let want_greedy = u32s(&g["greedy_ids"]);
    // Bounds in the spirit of the model crate's `formats.rs` (f16 keys ~1e-3, 8-bit ~5e-2).
    for (format, tol) in [(KvFormat::F32, 1e-4), (KvFormat::F16, 5e-3), (KvFormat::Q8, 6e-2), (KvFormat::Q4, 0.2)] {
        let pool = KvPool::new(KvLayout::of(&model.config), format, 64 << 20);
        let mut kv = SeqKv::new(&pool);
        let mut last = Vec::new();
        for chunk in ids.chunks(37) {
            last = step(&model, &mut kv, chunk);
        }
        let err = rel(&last, &want_last);
        // Greedy decoding over the store: each new token attends to the last 16 positions in
        // five layers and to everything in the sixth.
        let mut got = Vec::new();
        for _ in 0..8 {
            let t = argmax(&last);
            got.push(t);
            last = step(&model, &mut kv, &[t]);
        }
        eprintln!("tiny-gemma3 over a {format:?} KV store: last-position logit error {err:.2e}; greedy {got:?}");
        assert!(err < tol, "{format:?}: {err:e} >= {tol:e}");
        if format == KvFormat::F32 {
            assert_eq!(got, want_greedy[..8], "{format:?}: greedy differs from transformers");
        }
    }
    // The store's chunks go through the window: with every layer global the answer moves.
    let mut global = Model::load(&files.hf_dir).unwrap();
    global.config.layers = vec![engram_model::LayerAttention::Global; global.config.num_layers];
    let pool = KvPool::new(KvLayout::of(&global.config), KvFormat::F32, 64 << 20);
    let mut kv = SeqKv::new(&pool);
    let mut last = Vec::new();
    for chunk in ids.chunks(37) {
        last = step(&global, &mut kv, chunk);
    }
    assert!(rel(&last, &want_last) > 0.1, "every layer global: {:e}", rel(&last, &want_last));
}
