//! `Logits::Hidden`: every token's final-normed hidden state, the rows the LM
//! head multiplies — so hidden states × output weights are bitwise the
//! logits of `Logits::All`, alone or batched with other sequences.

use crate::common;
use common::*;
use engram_fixture::GgufFormat;
use engram_model::{Logits, Model, SeqStep};

fn hidden(model: &Model, tokens: &[u32]) -> Vec<f32> {
    let mut kv = VecKv::new(model);
    let mut step = [SeqStep::new(tokens, 0, &mut kv, Logits::Hidden)];
    model.forward(&mut step).expect("forward").remove(0)
}

/// Hidden rows through the LM head, as the forward pass applies it.
fn lm_head(model: &Model, hidden: &[f32]) -> Vec<f32> {
    let n = hidden.len() / model.config.hidden;
    let mut out = vec![0.0f32; n * model.config.vocab];
    engram_kernels::matmul(&model.weights.output.matrix(), hidden, n, &mut out);
    out
}

#[test]
fn hidden_states_times_the_lm_head_are_the_logits() {
    for path in [tiny_hf(), tiny_gguf(GgufFormat::Q8_0), tiny_gguf(GgufFormat::Q4_0)] {
        let model = Model::load(&path).unwrap();
        let ids = model.tokenizer.encode(PROMPT, true).unwrap().ids;
        let h = hidden(&model, &ids);
        assert_eq!(h.len(), ids.len() * model.config.hidden, "{}", path.display());
        assert!(h.iter().all(|x| x.is_finite()));
        assert_eq!(lm_head(&model, &h), all_logits(&model, &ids), "{}", path.display());
    }
}

#[test]
fn hidden_rows_do_not_depend_on_the_rest_of_the_step() {
    let model = Model::load(&tiny_hf()).unwrap();
    let tok = &model.tokenizer;
    let a = tok.encode("def main():\n    return 42", true).unwrap().ids;
    let b = tok.encode("A much longer prompt about caches, blocks and budgets.", true).unwrap().ids;
    let c = tok.encode("Short", true).unwrap().ids;
    let (mut ka, mut kb, mut kc) = (VecKv::new(&model), VecKv::new(&model), VecKv::new(&model));
    let mut steps = [
        SeqStep::new(&a, 0, &mut ka, Logits::Hidden),
        SeqStep::new(&b, 0, &mut kb, Logits::Last),
        SeqStep::new(&c, 0, &mut kc, Logits::Hidden),
    ];
    let out = model.forward(&mut steps).unwrap();
    let v = model.config.vocab;
    assert_eq!(out[1].len(), v);
    assert!(rel_err(&out[0], &hidden(&model, &a)) < 1e-5);
    assert!(rel_err(&out[2], &hidden(&model, &c)) < 1e-5);
    // Each sequence's hidden rows through the head equal its own logits.
    assert!(rel_err(&lm_head(&model, &out[0]), &all_logits(&model, &a)) < 1e-5);
    assert!(rel_err(&out[1], &all_logits(&model, &b)[(b.len() - 1) * v..]) < 1e-5);
}
