//! The encoder equals sentence-transformers on the real all-MiniLM-L6-v2:
//! same token ids, and cosine ≥ 0.9999 between vectors, for every sentence of
//! `data/golden_minilm.json` (made by `scripts/golden_embeddings.py`), encoded
//! one by one and all in one batch.

use crate::common;
use engram_embed::cosine;
use serde_json::Value;

const MIN_COSINE: f32 = 0.9999;

fn golden() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/golden_minilm.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

#[test]
fn vectors_equal_sentence_transformers_on_the_real_minilm() {
    let Some(enc) = common::real() else { return };
    let g = golden();
    assert_eq!(enc.dim(), g["dim"].as_u64().unwrap() as usize);
    assert_eq!(enc.max_tokens(), g["max_seq_length"].as_u64().unwrap() as usize);
    let rows = g["sentences"].as_array().unwrap();
    let texts: Vec<&str> = rows.iter().map(|r| r["text"].as_str().unwrap()).collect();
    let batch = enc.encode(&texts).unwrap();
    let (mut worst, mut worst_diff) = (1.0f32, 0.0f32);
    for (i, r) in rows.iter().enumerate() {
        let ids: Vec<u32> = r["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(enc.tokenize(texts[i]).unwrap(), ids, "token ids of sentence {i} {:?}", texts[i]);
        assert_eq!(batch.num_tokens[i], ids.len());
        let want: Vec<f32> = r["embedding"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        let alone = enc.encode_one(texts[i]).unwrap();
        for (how, got) in [("alone", &alone), ("batched", &batch.vectors[i])] {
            let c = cosine(got, &want);
            let diff = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max);
            assert!(c >= MIN_COSINE, "sentence {i} ({how}, {} tokens) {:?}: cosine {c} < {MIN_COSINE}", ids.len(), texts[i]);
            worst = worst.min(c);
            worst_diff = worst_diff.max(diff);
        }
        let norm = alone.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "sentence {i}: norm {norm}");
    }
    println!("{} sentences, alone and batched: min cosine {worst:.7}, max |diff| {worst_diff:.1e}", rows.len());
}

#[test]
fn long_texts_are_truncated_at_max_seq_length() {
    let Some(enc) = common::real() else { return };
    let long = "word ".repeat(1000);
    let ids = enc.tokenize(&long).unwrap();
    assert_eq!(ids.len(), enc.max_tokens());
    assert_eq!((ids[0], *ids.last().unwrap()), (101, 102), "[CLS] … [SEP] kept after truncation");
    // Everything past the limit is ignored.
    let longer = "word ".repeat(2000);
    assert_eq!(enc.encode_one(&long).unwrap(), enc.encode_one(&longer).unwrap());
}
