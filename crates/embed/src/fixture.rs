//! A tiny random-weight BERT written as a sentence-transformers folder in
//! the layout of all-MiniLM-L6-v2 (mean pooling, Normalize, a tokenizer.json
//! whose own truncation and fixed padding the encoder must override), for
//! tests here and in the server. Not a stable API.
//!
//! Invariant: the files are a pure function of the code: every weight is a
//! hash of its tensor name and index, so two folders written are identical.

use std::path::Path;

use serde_json::json;

/// Words of the tiny fixture's WordPiece vocabulary (after 5 special tokens).
const WORDS: &[&str] = &[
    "the", "a", "cat", "dog", "sat", "on", "mat", "is", "playing", "guitar", "rain", "sun", "code", "python", "rust", "cache", "token",
    "session", "memory", "disk", "fast", "slow", "and", "or", "not", "of", "to", "in", "it", "we", "##s", "##ing", "##ed", "##er", ",",
    ".", "!", "?", "(", ")", "0", "1", "2", "3",
];

/// The tiny fixture's shape.
pub const HIDDEN: usize = 32;
pub const LAYERS: usize = 2;
pub const HEADS: usize = 4;
pub const INTERMEDIATE: usize = 64;
pub const MAX_POS: usize = 40;
pub const MAX_SEQ: usize = 24;

/// A deterministic value in [-scale, scale) for (tensor, index).
fn value(name: &str, i: usize, scale: f32) -> f32 {
    let mut h: u64 = 0xcbf29ce484222325;
    for b in name.bytes().chain(i.to_le_bytes()) {
        h = (h ^ b as u64).wrapping_mul(0x100000001b3);
    }
    h ^= h >> 29;
    ((h >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
}

/// The tiny model's tensors: `(name, shape, f32 values)`.
pub fn tiny_tensors() -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let vocab = 5 + WORDS.len();
    let mut t = Vec::new();
    let mut add = |name: String, shape: Vec<usize>, center: f32, scale: f32| {
        let n = shape.iter().product();
        let v = (0..n).map(|i| center + value(&name, i, scale)).collect();
        t.push((name, shape, v));
    };
    add("embeddings.word_embeddings.weight".into(), vec![vocab, HIDDEN], 0.0, 0.5);
    add("embeddings.position_embeddings.weight".into(), vec![MAX_POS, HIDDEN], 0.0, 0.2);
    add("embeddings.token_type_embeddings.weight".into(), vec![2, HIDDEN], 0.0, 0.1);
    add("embeddings.LayerNorm.weight".into(), vec![HIDDEN], 1.0, 0.1);
    add("embeddings.LayerNorm.bias".into(), vec![HIDDEN], 0.0, 0.1);
    for l in 0..LAYERS {
        let p = format!("encoder.layer.{l}");
        for (name, rows, cols) in [
            ("attention.self.query", HIDDEN, HIDDEN),
            ("attention.self.key", HIDDEN, HIDDEN),
            ("attention.self.value", HIDDEN, HIDDEN),
            ("attention.output.dense", HIDDEN, HIDDEN),
            ("intermediate.dense", INTERMEDIATE, HIDDEN),
            ("output.dense", HIDDEN, INTERMEDIATE),
        ] {
            add(format!("{p}.{name}.weight"), vec![rows, cols], 0.0, 0.3);
            add(format!("{p}.{name}.bias"), vec![rows], 0.0, 0.05);
        }
        for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
            add(format!("{p}.{norm}.weight"), vec![HIDDEN], 1.0, 0.1);
            add(format!("{p}.{norm}.bias"), vec![HIDDEN], 0.0, 0.1);
        }
    }
    t
}

/// Writes `tensors` (f32) as a safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> std::io::Result<()> {
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| Ok((n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).map_err(other)?)))
        .collect::<std::io::Result<_>>()?;
    std::fs::write(path, safetensors::serialize(views, None).map_err(other)?)
}

fn other(e: impl std::error::Error + Send + Sync + 'static) -> std::io::Error {
    std::io::Error::other(e)
}

/// The tokenizer.json of the tiny fixture: BERT normalizer and pre-tokenizer,
/// WordPiece, `[CLS] … [SEP]`, and (like the real file) truncation at 128 and
/// fixed padding that the encoder must override.
pub fn tiny_tokenizer() -> serde_json::Value {
    let specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"];
    let vocab: serde_json::Map<String, serde_json::Value> =
        specials.iter().chain(WORDS).enumerate().map(|(i, w)| (w.to_string(), json!(i))).collect();
    let added: Vec<_> = specials
        .iter()
        .enumerate()
        .map(|(i, s)| json!({"id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    json!({
        "version": "1.0",
        "truncation": {"direction": "Right", "max_length": 128, "strategy": "LongestFirst", "stride": 0},
        "padding": {"strategy": {"Fixed": 128}, "direction": "Right", "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"},
        "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}, {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]}, "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": vocab}
    })
}

fn write_json(path: &Path, v: &serde_json::Value) -> std::io::Result<()> {
    std::fs::write(path, serde_json::to_vec_pretty(v).map_err(other)?)
}

/// Writes the tiny fixture as a sentence-transformers folder at `dir`
/// (mean pooling, then Normalize, as all-MiniLM-L6-v2).
pub fn write_tiny(dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("1_Pooling"))?;
    std::fs::create_dir_all(dir.join("2_Normalize"))?;
    write_json(
        &dir.join("modules.json"),
        &json!([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        ]),
    )?;
    write_json(
        &dir.join("config.json"),
        &json!({"architectures": ["BertModel"], "model_type": "bert", "hidden_act": "gelu", "hidden_size": HIDDEN,
                "intermediate_size": INTERMEDIATE, "layer_norm_eps": 1e-12, "max_position_embeddings": MAX_POS,
                "num_attention_heads": HEADS, "num_hidden_layers": LAYERS, "pad_token_id": 0,
                "position_embedding_type": "absolute", "type_vocab_size": 2, "vocab_size": 5 + WORDS.len()}),
    )?;
    write_json(&dir.join("sentence_bert_config.json"), &json!({"max_seq_length": MAX_SEQ, "do_lower_case": false}))?;
    write_json(
        &dir.join("1_Pooling/config.json"),
        &json!({"word_embedding_dimension": HIDDEN, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true,
                "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false}),
    )?;
    write_json(&dir.join("tokenizer.json"), &tiny_tokenizer())?;
    write_safetensors(&dir.join("model.safetensors"), &tiny_tensors())
}

/// Texts of varied length for the tiny vocabulary (unknown words become `[UNK]`).
pub const TINY_TEXTS: &[&str] = &[
    "",
    "the cat sat on the mat.",
    "a dog is playing guitar in the rain!",
    "rust code and python code",
    "session memory, disk cache, token cache and the sun and the rain and the cat and the dog and a mat on it",
    "unknown words: zebra xylophone",
    "cats playing",
    "0 1 2 3 (0) (1)",
];
