//! Exactness of chunking and batching: one chunk vs several vs token by
//! token, alone vs batched with other sequences of different lengths — the
//! same logits within float tolerance (bit-identical where the kernels are).

use crate::common;
use common::*;
use engram_fixture::GgufFormat;
use engram_model::{Logits, Model, SeqStep};

/// `ids` run `chunk` tokens per step (each of `chunks`) give one-shot logits within 1e-5, and
/// run in one step beside `other` (a prompt routed elsewhere) give the same bits, while `other`
/// gets its own one-shot logits: a token's result depends on its sequence alone.
pub(crate) fn assert_chunking_and_batching_agree(model: &Model, ids: &[u32], chunks: &[usize], other: &str) {
    let whole = chunked_logits(model, ids, ids.len());
    for &chunk in chunks {
        let err = rel_err(&chunked_logits(model, ids, chunk), &whole);
        assert!(err < 1e-5, "chunk {chunk}: relative error {err}");
    }
    let other = model.tokenizer.encode(other, true).unwrap().ids;
    let (mut ka, mut kb) = (VecKv::new(model), VecKv::new(model));
    let mut steps = [
        SeqStep { tokens: ids, first_pos: 0, positions: None, key_mask: None, kv: &mut ka, logits: Logits::All },
        SeqStep { tokens: &other, first_pos: 0, positions: None, key_mask: None, kv: &mut kb, logits: Logits::All },
    ];
    let out = model.forward(&mut steps).unwrap();
    assert_eq!(out[0], whole, "batched with another sequence: the same bits");
    assert!(rel_err(&out[1], &all_logits(model, &other)) < 1e-5);
}

/// Every token's logits, the prompt run `chunk` tokens per step through one cache.
pub(crate) fn chunked_logits(model: &Model, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut kv = VecKv::new(model);
    let mut out = Vec::new();
    let mut pos = 0;
    for c in tokens.chunks(chunk) {
        let mut step = [SeqStep { tokens: c, first_pos: pos, positions: None, key_mask: None, kv: &mut kv, logits: Logits::All }];
        out.extend(model.forward(&mut step).unwrap().remove(0));
        pos += c.len();
    }
    out
}

#[test]
fn one_chunk_several_chunks_and_token_by_token_agree() {
    for path in [tiny_hf(), tiny_gguf(GgufFormat::Q8_0), tiny_gguf(GgufFormat::Q4_0)] {
        let model = Model::load(&path).unwrap();
        let ids = model.tokenizer.encode(&PROMPT.repeat(3), true).unwrap().ids;
        let whole = chunked_logits(&model, &ids, ids.len());
        for chunk in [1, 5, 16] {
            let err = rel_err(&chunked_logits(&model, &ids, chunk), &whole);
            assert!(err < 1e-5, "{}: chunk {chunk}: relative error {err}", path.display());
        }
    }
}

#[test]
fn batched_sequences_match_each_sequence_alone() {
    let model = Model::load(&tiny_hf()).unwrap();
    let tok = &model.tokenizer;
    let a = tok.encode("def main():\n    return 42", true).unwrap().ids;
    let b = tok.encode("A much longer prompt about caches, blocks and budgets that keeps going.", true).unwrap().ids;
    let c_prefix = tok.encode("Short", true).unwrap().ids;

    let alone_a = all_logits(&model, &a);
    let alone_b = all_logits(&model, &b);
    let alone_c = all_logits(&model, &c_prefix);

    // Prefill a and b together, plus c as a prompt of another length.
    let (mut ka, mut kb, mut kc) = (VecKv::new(&model), VecKv::new(&model), VecKv::new(&model));
    let mut steps = [
        SeqStep { tokens: &a, first_pos: 0, positions: None, key_mask: None, kv: &mut ka, logits: Logits::All },
        SeqStep { tokens: &b, first_pos: 0, positions: None, key_mask: None, kv: &mut kb, logits: Logits::All },
        SeqStep { tokens: &c_prefix, first_pos: 0, positions: None, key_mask: None, kv: &mut kc, logits: Logits::All },
    ];
    let out = model.forward(&mut steps).unwrap();
    assert!(rel_err(&out[0], &alone_a) < 1e-5);
    assert!(rel_err(&out[1], &alone_b) < 1e-5);
    assert!(rel_err(&out[2], &alone_c) < 1e-5);

    // Then a decode token for a, batched with a prefill chunk for b: equal to alone.
    let next = [5u32];
    let mut full_a = a.clone();
    full_a.push(5);
    let extra_b = tok.encode(" and more", false).unwrap().ids;
    let mut full_b = b.clone();
    full_b.extend(&extra_b);
    let mut steps = [
        SeqStep { tokens: &next, first_pos: a.len(), positions: None, key_mask: None, kv: &mut ka, logits: Logits::Last },
        SeqStep { tokens: &extra_b, first_pos: b.len(), positions: None, key_mask: None, kv: &mut kb, logits: Logits::All },
    ];
    let out = model.forward(&mut steps).unwrap();
    let ref_a = all_logits(&model, &full_a);
    let ref_b = all_logits(&model, &full_b);
    let v = model.config.vocab;
    assert!(rel_err(&out[0], &ref_a[(full_a.len() - 1) * v..]) < 1e-5);
    assert!(rel_err(&out[1], &ref_b[b.len() * v..]) < 1e-5);
}

#[test]
fn bad_forward_input_is_an_error() {
    let model = Model::load(&tiny_hf()).unwrap();
    let mut kv = VecKv::new(&model);
    let bad = [model.config.vocab as u32];
    let mut step = [SeqStep { tokens: &bad, first_pos: 0, positions: None, key_mask: None, kv: &mut kv, logits: Logits::Last }];
    let e = model.forward(&mut step).unwrap_err().to_string();
    assert!(e.contains("outside the vocabulary"), "{e}");
    let empty: [u32; 0] = [];
    let mut step = [SeqStep { tokens: &empty, first_pos: 0, positions: None, key_mask: None, kv: &mut kv, logits: Logits::Last }];
    assert!(model.forward(&mut step).is_err());
}
