//! What the sparse tests share.
#![allow(dead_code)] // each test binary uses its own subset

use engram_fixture::{GgufFormat, Shape};
use engram_model::{Logits, Model, SeqStep};
use engram_sparse::SparseKv;

/// The `tiny` fixture (random weights), loaded from its HF folder; keep the folder alive.
pub fn model() -> (tempfile::TempDir, Model) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    (dir, Model::load(&files.hf_dir).unwrap())
}

/// `n` deterministic token ids of the tiny vocabulary.
pub fn tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 5 + (i * 7919 + i * i * 31) % 200).collect()
}

/// Prefills `prompt` in chunks of 64 and builds the index.
pub fn prefill(model: &Model, kv: &mut SparseKv, prompt: &[u32]) {
    for part in prompt.chunks(64) {
        kv.reserve(part.len());
        let slot = kv.len();
        model.forward(&mut [SeqStep::new(part, slot, kv, Logits::None)]).unwrap();
    }
    kv.build_index();
}

/// Decodes `rest` token by token; returns each step's logits.
pub fn decode(model: &Model, kv: &mut SparseKv, rest: &[u32]) -> Vec<Vec<f32>> {
    rest.iter()
        .map(|t| {
            kv.reserve(1);
            let slot = kv.len();
            model.forward(&mut [SeqStep::new(std::slice::from_ref(t), slot, kv, Logits::Last)]).unwrap().remove(0)
        })
        .collect()
}

/// A deterministic pseudo-random stream in [-1, 1) (xorshift; the same for a seed on every run).
pub fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}
