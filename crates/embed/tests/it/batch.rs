//! A text's vector does not depend on its batch: alone, in any order, among
//! longer or shorter texts, or split over several forward passes, it is
//! bitwise the same (packed sequences with per-sequence attention, and the
//! kernels' row-independent matmul). On the tiny fixture always, on the real
//! model where it is installed.

use crate::common;
use engram_embed::Encoder;

fn check_batch_independence(enc: &Encoder, texts: &[&str]) {
    let alone: Vec<Vec<f32>> = texts.iter().map(|t| enc.encode_one(t).unwrap()).collect();
    let together = enc.encode(texts).unwrap().vectors;
    let reversed: Vec<&str> = texts.iter().rev().copied().collect();
    let rev = enc.encode(&reversed).unwrap().vectors;
    // The same text twice in one batch, next to a long one.
    let mut doubled = vec![texts[0], texts[texts.len() - 1], texts[0]];
    doubled.extend_from_slice(texts);
    let dbl = enc.encode(&doubled).unwrap().vectors;
    for (i, a) in alone.iter().enumerate() {
        assert_eq!(a, &together[i], "text {i} alone vs batched: {:?}", texts[i]);
        assert_eq!(a, &rev[texts.len() - 1 - i], "text {i} alone vs reversed batch");
        assert_eq!(a, &dbl[3 + i], "text {i} alone vs a batch with duplicates");
    }
    assert_eq!(dbl[0], dbl[2]);
}

#[test]
fn tiny_vectors_do_not_depend_on_the_batch() {
    let (_tmp, dir) = common::tiny();
    let enc = Encoder::load(&dir).unwrap();
    assert_eq!(enc.dim(), common::HIDDEN);
    check_batch_independence(&enc, common::TINY_TEXTS);
    // A batch of thousands of texts is split into several forward passes; still the same.
    let many: Vec<&str> = common::TINY_TEXTS.iter().copied().cycle().take(3000).collect();
    let out = enc.encode(&many).unwrap();
    assert_eq!(out.vectors.len(), many.len());
    for (i, v) in out.vectors.iter().enumerate() {
        assert_eq!(v, &enc.encode_one(many[i]).unwrap(), "text {i} of a split batch");
    }
}

#[test]
fn tiny_vectors_are_unit_length_and_truncated() {
    let (_tmp, dir) = common::tiny();
    let enc = Encoder::load(&dir).unwrap();
    // The file's own truncation (128) and fixed padding are overridden by max_seq_length.
    assert_eq!(enc.tokenize("the cat").unwrap(), vec![2, 5, 7, 3]);
    let long = "the cat ".repeat(100);
    assert_eq!(enc.tokenize(&long).unwrap().len(), common::MAX_SEQ);
    for t in common::TINY_TEXTS {
        let v = enc.encode_one(t).unwrap();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{t:?}: norm {norm}");
    }
    // Different texts, different vectors; same text, same vector.
    let a = enc.encode_one("the cat sat on the mat.").unwrap();
    let b = enc.encode_one("python code in rust").unwrap();
    assert!(engram_embed::cosine(&a, &b) < 0.999);
    assert_eq!(a, enc.encode_one("the cat sat on the mat.").unwrap());
}

#[test]
fn real_vectors_do_not_depend_on_the_batch() {
    let Some(enc) = common::real() else { return };
    let long = "The session store keeps every conversation's text with its cache. ".repeat(30);
    let texts = ["", "Hello!", "A man is playing a guitar.", long.as_str(), "東京は日本の首都です。", "def f(x):\n    return x * 2"];
    check_batch_independence(enc, &texts);
}
