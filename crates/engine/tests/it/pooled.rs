//! `PooledEncoder`: the LLM's mean-pooled final-normed hidden states as a
//! text encoder. Vectors have the model's hidden size and unit norm, equal
//! the mean of `Logits::Hidden` rows without BOS, and depend on their text
//! only (bitwise, alone or batched, whatever the order).

use std::sync::Arc;

use engram_embed::{cosine, TextEncoder};
use engram_engine::pooled::{PooledEncoder, MAX_TEXT_TOKENS};
use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::{Logits, Model, SeqStep};

fn model() -> (tempfile::TempDir, Arc<Model>) {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let m = Model::load(&files.gguf(GgufFormat::Q8_0).unwrap()).unwrap();
    (dir, Arc::new(m))
}

fn strings(texts: &[&str]) -> Vec<String> {
    texts.iter().map(|s| s.to_string()).collect()
}

#[test]
fn vectors_are_normalized_means_of_the_hidden_states_without_bos() {
    let (_dir, m) = model();
    let enc = PooledEncoder::new(m.clone(), "tiny");
    assert_eq!(enc.id(), "tiny:pooled-hidden");
    assert_eq!(enc.dim(), m.config.hidden);
    let text = "The cache keeps every block it was given.";
    let out = enc.encode(&strings(&[text])).unwrap();
    let v = &out.vectors[0];
    assert_eq!(v.len(), m.config.hidden);
    let norm = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-6, "norm {norm}");

    // By hand: the hidden rows of the prompt encoding, BOS left out, averaged, normalized.
    let ids = m.tokenizer.encode(text, true).unwrap().ids;
    assert_eq!(out.num_tokens, vec![ids.len()]);
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let mut kv = SeqKv::new(&pool);
    kv.reserve(ids.len()).unwrap();
    let rows = m.forward(&mut [SeqStep::new(&ids, 0, &mut kv, Logits::Hidden)]).unwrap().remove(0);
    let h = m.config.hidden;
    let skip = usize::from(m.tokenizer.bos_id() == Some(ids[0]));
    let mut mean = vec![0.0f32; h];
    for row in rows.chunks_exact(h).skip(skip) {
        mean.iter_mut().zip(row).for_each(|(a, &x)| *a += x);
    }
    assert!(cosine(&mean, v) > 0.99999, "cosine {}", cosine(&mean, v));
}

#[test]
fn a_texts_vector_depends_on_that_text_only() {
    let (_dir, m) = model();
    let enc = PooledEncoder::new(m, "tiny");
    let texts =
        strings(&["def main():\n    return 42", "", "a much longer text about caches, blocks and budgets ".repeat(30).as_str(), "cats"]);
    let together = enc.encode(&texts).unwrap();
    for (i, t) in texts.iter().enumerate() {
        let alone = enc.encode(std::slice::from_ref(t)).unwrap();
        assert_eq!(alone.vectors[0], together.vectors[i], "text {i}");
        assert_eq!(alone.num_tokens[0], together.num_tokens[i]);
    }
    let reversed: Vec<String> = texts.iter().rev().cloned().collect();
    let back = enc.encode(&reversed).unwrap();
    for i in 0..texts.len() {
        assert_eq!(back.vectors[texts.len() - 1 - i], together.vectors[i]);
    }
    // Again: deterministic.
    assert_eq!(enc.encode(&texts).unwrap().vectors, together.vectors);
    // The empty text is one token (BOS or EOS) and still a unit vector.
    assert_eq!(together.num_tokens[1], 1);
    assert!(together.vectors[1].iter().all(|x| x.is_finite()));
    // Long texts are cut.
    let long = enc.encode(&[("word ".repeat(4 * MAX_TEXT_TOKENS))]).unwrap();
    assert_eq!(long.num_tokens[0], MAX_TEXT_TOKENS);
    // Texts totalling more than one forward's worth run in several, same vectors.
    let many: Vec<String> = (0..40).map(|i| format!("{} {i}", texts[2])).collect();
    let all = enc.encode(&many).unwrap();
    assert_eq!(all.vectors[17], enc.encode(&many[17..18]).unwrap().vectors[0]);
}
