//! Moving cached tokens to new positions (RAG's position-independent chunk reuse): keys are
//! re-rotated by the shift. A moved chunk's layer-0 keys equal the keys
//! computed at the new positions (within float rounding), its values are
//! identical, and shifting there and back restores every layer.

use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};

fn run(model: &Model, kv: &mut SeqKv, tokens: &[u32]) {
    kv.reserve(tokens.len()).unwrap();
    let first_pos = kv.len();
    let mut step = [SeqStep { tokens, first_pos, positions: None, key_mask: None, kv, logits: Logits::None }];
    model.forward(&mut step).unwrap();
}

fn rel(a: &[f32], b: &[f32]) -> f32 {
    let s = b.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / s
}

#[test]
fn a_moved_chunk_equals_one_computed_at_the_new_position() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Model::load(&files.hf_dir).unwrap();
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 64 << 20);
    let tok = &model.tokenizer;
    let chunk = tok.encode("A retrieved document chunk about KV caches, reused at a new position.", false).unwrap().ids;
    let prefix: Vec<u32> = tok.encode(&"Some earlier conversation. ".repeat(6), true).unwrap().ids[..37].to_vec();
    let (n, p) = (chunk.len(), prefix.len());

    let mut alone = SeqKv::new(&pool);
    run(&model, &mut alone, &chunk);
    let mut cold = SeqKv::new(&pool);
    run(&model, &mut cold, &prefix);
    run(&model, &mut cold, &chunk);
    let mut moved = SeqKv::new(&pool);
    run(&model, &mut moved, &prefix);
    moved.extend_shifted(&alone, 0..n, &model.config.rope).unwrap();
    assert_eq!(moved.len(), p + n);

    let (k_moved, v_moved) = moved.read_rows(0, p..p + n);
    let (k_cold, v_cold) = cold.read_rows(0, p..p + n);
    let err = rel(&k_moved, &k_cold);
    assert!(err < 1e-5, "layer-0 keys moved vs computed at the new position: {err}");
    assert_eq!(v_moved, v_cold, "layer-0 values do not depend on position");

    // There and back again: every layer's keys return (rotation composes).
    let mut back = SeqKv::new(&pool);
    back.extend_shifted(&moved, p..p + n, &model.config.rope).unwrap();
    for layer in 0..model.config.num_layers {
        let (k0, v0) = alone.read_rows(layer, 0..n);
        let (k1, v1) = back.read_rows(layer, 0..n);
        assert!(rel(&k1, &k0) < 1e-5, "layer {layer}: {}", rel(&k1, &k0));
        assert_eq!(v1, v0);
    }
}

/// Gemma 3's sliding layers rotate with their own RoPE base (1e4 against the global layers'
/// 1e6): moved with the model's per-layer RoPEs, a chunk's layer-0 (sliding) keys equal the
/// keys computed at the new position; moved with the global RoPE alone they do not.
#[test]
fn a_moved_chunk_follows_each_layers_rope() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::TinyGemma3, engram_fixture::DEFAULT_SEED, dir.path(), &[], &mut |_| {}).unwrap();
    let model = Model::load(&files.hf_dir).unwrap();
    assert!(model.config.layer_attention(0).window().is_some() && model.config.layer_rope(0) != &model.config.rope);
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 64 << 20);
    let tok = &model.tokenizer;
    let chunk = tok.encode("A retrieved document chunk about KV caches, reused at a new position.", false).unwrap().ids;
    let prefix: Vec<u32> = tok.encode(&"Some earlier conversation. ".repeat(6), true).unwrap().ids[..37].to_vec();
    let (n, p) = (chunk.len(), prefix.len());
    let mut alone = SeqKv::new(&pool);
    run(&model, &mut alone, &chunk);
    let mut cold = SeqKv::new(&pool);
    run(&model, &mut cold, &prefix);
    run(&model, &mut cold, &chunk);
    let (k_cold, _) = cold.read_rows(0, p..p + n);
    let mut errs = Vec::new();
    for per_layer in [true, false] {
        let mut moved = SeqKv::new(&pool);
        run(&model, &mut moved, &prefix);
        if per_layer {
            moved.extend_shifted(&alone, 0..n, &model.config).unwrap();
        } else {
            moved.extend_shifted(&alone, 0..n, &model.config.rope).unwrap();
        }
        errs.push(rel(&moved.read_rows(0, p..p + n).0, &k_cold));
    }
    assert!(errs[0] < 1e-5 && errs[1] > 1e-2, "layer-0 keys moved with per-layer RoPEs / the global one: {errs:?}");
    // move_slots likewise: the moved chunk moved back to where `alone` has it.
    let mut back = SeqKv::new(&pool);
    run(&model, &mut back, &prefix);
    run(&model, &mut back, &chunk);
    back.move_slots(p..p + n, 0, &model.config).unwrap();
    // Layer 0's keys depend on the token and its position alone (deeper ones also on the prefix).
    let (k0, k1) = (alone.read_rows(0, 0..n).0, back.read_rows(0, p..p + n).0);
    assert!(rel(&k1, &k0) < 1e-5, "move_slots layer 0: {}", rel(&k1, &k0));
}
