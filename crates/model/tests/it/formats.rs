//! The same weights through every loader: the HF folder (f32) against GGUF
//! F16 / Q8_0 / Q4_0, within tolerances that reflect each format's rounding.

use crate::common;
use common::*;
use engram_fixture::GgufFormat;
use engram_model::Model;

#[test]
fn gguf_formats_track_the_f32_model() {
    let hf = Model::load(&tiny_hf()).unwrap();
    let ids = hf.tokenizer.encode(PROMPT, true).unwrap().ids;
    let reference = all_logits(&hf, &ids);
    // Tolerances: relative to the largest |logit|. F16 weights round each weight
    // once (measured 1.2e-3 on tiny); Q8_0 also quantizes activations to 8 bits
    // (measured 4.3e-2: the tiny model has 64-wide rows, so each 32-block scale is
    // set by few values); Q4_0's 16x coarser weight steps give 0.46 on this
    // random model — that bound says little, so the test below checks Q8_0 and
    // Q4_0 against their own weights expanded to f32.
    for (format, tol) in [(GgufFormat::F16, 5e-3), (GgufFormat::Q8_0, 6e-2), (GgufFormat::Q4_0, 0.6)] {
        let m = Model::load(&tiny_gguf(format)).unwrap();
        let gguf_ids = m.tokenizer.encode(PROMPT, true).unwrap().ids;
        assert_eq!(gguf_ids, ids, "{format:?}: GGUF tokenizer disagrees with tokenizer.json");
        let logits = all_logits(&m, &ids);
        let err = rel_err(&logits, &reference);
        eprintln!("{format:?}: max relative logit error {err:.2e}");
        assert!(err < tol, "{format:?}: relative error {err} exceeds {tol}");
    }
}

#[test]
fn quantized_kernels_match_their_own_dequantized_weights() {
    for format in [GgufFormat::Q8_0, GgufFormat::Q4_0] {
        let q = Model::load(&tiny_gguf(format)).unwrap();
        let ids = q.tokenizer.encode(PROMPT, true).unwrap().ids;
        let expanded = expanded_to_f32(Model::load(&tiny_gguf(format)).unwrap());
        let err = rel_err(&all_logits(&q, &ids), &all_logits(&expanded, &ids));
        eprintln!("{format:?} vs its f32 expansion: {err:.2e}");
        // Only 8-bit activation quantization separates the two.
        assert!(err < 6e-2, "{format:?}: {err}");
    }
}

#[test]
fn greedy_continuation_agrees_between_hf_and_f16_gguf() {
    let hf = Model::load(&tiny_hf()).unwrap();
    let f16 = Model::load(&tiny_gguf(GgufFormat::F16)).unwrap();
    let ids = hf.tokenizer.encode(PROMPT, true).unwrap().ids;
    let a = greedy(&hf, &ids, 16);
    let b = greedy(&f16, &ids, 16);
    let agree = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert!(agree >= 8, "F16 GGUF diverged from f32 after {agree} tokens: {a:?} vs {b:?}");
}

#[test]
fn fingerprints_are_stable_and_distinguish_files() {
    let a = Model::load(&tiny_hf()).unwrap();
    let b = Model::load(&tiny_hf()).unwrap();
    assert_eq!(a.fingerprint, b.fingerprint);
    let q8 = Model::load(&tiny_gguf(GgufFormat::Q8_0)).unwrap();
    let q4 = Model::load(&tiny_gguf(GgufFormat::Q4_0)).unwrap();
    assert_ne!(a.fingerprint, q8.fingerprint);
    assert_ne!(q8.fingerprint, q4.fingerprint);
    // Bf16 attention computes other caches: another fingerprint; back to exact, the loaded one.
    let exact = a.fingerprint;
    let mut a = a.with_attention(engram_model::AttentionPrecision::Bf16);
    assert_ne!(a.fingerprint, exact);
    assert_eq!(a.fingerprint, b.with_attention(engram_model::AttentionPrecision::Bf16).fingerprint, "stable");
    a.set_attention(engram_model::AttentionPrecision::Exact);
    assert_eq!(a.fingerprint, exact);
}

/// Qwen2: qkv bias, tied embeddings, and GGUF files that are not permuted
/// (NEOX RoPE) — the HF folder and the F16 / Q8_0 GGUF of the same weights agree.
#[test]
fn qwen2_hf_and_gguf_agree() {
    use engram_fixture::Shape;
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(
        Shape::TinyQwen2,
        engram_fixture::DEFAULT_SEED,
        dir.path(),
        &[GgufFormat::F16, GgufFormat::Q8_0],
        &mut |_| {},
    )
    .unwrap();
    let hf = Model::load(&files.hf_dir).unwrap();
    assert!(hf.config.qkv_bias && hf.config.tied_embeddings);
    let ids = hf.tokenizer.encode(PROMPT, true).unwrap().ids;
    let reference = all_logits(&hf, &ids);
    for (format, tol) in [(GgufFormat::F16, 5e-3), (GgufFormat::Q8_0, 6e-2)] {
        let m = Model::load(files.gguf(format).unwrap()).unwrap();
        assert_eq!(m.config.arch, engram_model::Arch::Qwen2);
        assert_eq!(m.config.rope.style, engram_model::RopeStyle::Neox);
        let err = rel_err(&all_logits(&m, &ids), &reference);
        assert!(err < tol, "{format:?}: {err}");
    }
}
