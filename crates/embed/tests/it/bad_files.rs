//! A broken or foreign folder gives one clear error naming the file and what
//! is wrong — never a panic, never a silently different encoder: missing
//! files, invalid JSON, unsupported modules and settings, truncated and
//! foreign weight files, missing or misshapen tensors, broken tokenizers.

use crate::common;
use std::path::Path;

use engram_embed::{EmbedError, Encoder};
use serde_json::{json, Value};

fn load_err(dir: &Path) -> EmbedError {
    match Encoder::load(dir) {
        Ok(_) => panic!("{} loaded, but it is broken", dir.display()),
        Err(e) => e,
    }
}

/// Asserts the error's message mentions every piece of `parts`.
fn says(e: &EmbedError, parts: &[&str]) {
    let msg = e.to_string();
    for p in parts {
        assert!(msg.contains(p), "error {msg:?} should mention {p:?}");
    }
}

fn edit_json(path: &Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn the_tiny_fixture_loads() {
    let (_tmp, dir) = common::tiny();
    let enc = Encoder::load(&dir).unwrap();
    assert_eq!(enc.id(), "tiny-minilm");
    assert!(enc.normalizes());
    assert_eq!(enc.max_tokens(), common::MAX_SEQ);
}

#[test]
fn missing_folder_and_missing_files() {
    let (tmp, dir) = common::tiny();
    let e = load_err(&tmp.path().join("nope"));
    assert!(matches!(e, EmbedError::Io { .. }), "{e}");
    says(&e, &["nope"]);

    for (file, kind) in [
        ("config.json", "Io"),
        ("model.safetensors", "Io"),
        ("tokenizer.json", "Tokenizer"),
        ("1_Pooling/config.json", "Io"),
        ("modules.json", "Unsupported"),
    ] {
        let (_t, dir2) = common::tiny();
        std::fs::remove_file(dir2.join(file)).unwrap();
        let e = load_err(&dir2);
        assert!(format!("{e:?}").starts_with(kind), "without {file}: {e:?}");
        let name = Path::new(file).file_name().unwrap().to_str().unwrap();
        says(&e, &[if file == "modules.json" { "modules.json" } else { name }]);
    }
    drop(dir);
}

#[test]
fn invalid_json_names_the_file() {
    for file in ["modules.json", "config.json", "1_Pooling/config.json", "sentence_bert_config.json"] {
        let (_t, dir) = common::tiny();
        std::fs::write(dir.join(file), b"{not json").unwrap();
        let e = load_err(&dir);
        assert!(matches!(e, EmbedError::Json { .. }), "{file}: {e:?}");
        says(&e, &[Path::new(file).file_name().unwrap().to_str().unwrap()]);
    }
    // Valid JSON without a required field.
    let (_t, dir) = common::tiny();
    edit_json(&dir.join("config.json"), |v| {
        v.as_object_mut().unwrap().remove("hidden_size");
    });
    says(&load_err(&dir), &["config.json", "hidden_size"]);
}

#[test]
fn unsupported_modules_and_settings_are_refused() {
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit, &[&str])> = vec![
        (
            "modules.json",
            Box::new(|v| {
                v.as_array_mut()
                    .unwrap()
                    .insert(2, json!({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}))
            }),
            &["Dense"],
        ),
        ("modules.json", Box::new(|v| v.as_array_mut().unwrap().truncate(1)), &["Pooling"]),
        ("config.json", Box::new(|v| v["hidden_act"] = json!("relu")), &["relu"]),
        ("config.json", Box::new(|v| v["model_type"] = json!("roberta")), &["roberta"]),
        ("config.json", Box::new(|v| v["position_embedding_type"] = json!("relative_key")), &["relative_key"]),
        ("config.json", Box::new(|v| v["num_attention_heads"] = json!(5)), &["num_attention_heads"]),
        ("config.json", Box::new(|v| v["num_hidden_layers"] = json!(0)), &["num_hidden_layers"]),
        ("1_Pooling/config.json", Box::new(|v| v["pooling_mode_cls_token"] = json!(true)), &["several pooling modes"]),
        ("1_Pooling/config.json", Box::new(|v| v["pooling_mode_mean_tokens"] = json!(false)), &["no pooling mode"]),
        ("1_Pooling/config.json", Box::new(|v| v["pooling_mode_lasttoken"] = json!(true)), &["last-token"]),
        ("1_Pooling/config.json", Box::new(|v| v["word_embedding_dimension"] = json!(64)), &["word_embedding_dimension"]),
        ("sentence_bert_config.json", Box::new(|v| v["max_seq_length"] = json!(1)), &["max_seq_length"]),
    ];
    for (file, edit, parts) in cases {
        let (_t, dir) = common::tiny();
        edit_json(&dir.join(file), edit);
        let e = load_err(&dir);
        says(&e, parts);
        says(&e, &[Path::new(file).file_name().unwrap().to_str().unwrap()]);
    }
}

#[test]
fn truncated_weight_files_are_refused_at_every_length() {
    let (_t, dir) = common::tiny();
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let mut cuts: Vec<usize> = vec![0, 1, 7, 8, 9, 100];
    cuts.extend((1..16).map(|i| bytes.len() * i / 16));
    cuts.push(bytes.len() - 1);
    for cut in cuts {
        std::fs::write(&path, &bytes[..cut]).unwrap();
        let e = load_err(&dir);
        assert!(matches!(e, EmbedError::Safetensors { .. } | EmbedError::Io { .. }), "cut at {cut}: {e:?}");
        says(&e, &["model.safetensors"]);
    }
    // One byte too many is as wrong as one too few.
    let mut longer = bytes.clone();
    longer.push(0);
    std::fs::write(&path, &longer).unwrap();
    says(&load_err(&dir), &["model.safetensors", "safetensors"]);
}

#[test]
fn foreign_weight_files_are_refused() {
    let gguf = {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend(std::iter::repeat_n(0u8, 4096));
        b
    };
    let json_file = br#"{"hidden_size": 32}"#.to_vec();
    let noise: Vec<u8> = (0..10_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    // A valid header whose length prefix claims more than the file has.
    let mut huge_header = (1u64 << 40).to_le_bytes().to_vec();
    huge_header.extend_from_slice(b"{}");
    for (what, bytes) in [("gguf", gguf), ("json", json_file), ("noise", noise), ("huge header", huge_header)] {
        let (_t, dir) = common::tiny();
        std::fs::write(dir.join("model.safetensors"), bytes).unwrap();
        let e = load_err(&dir);
        assert!(matches!(e, EmbedError::Safetensors { .. }), "{what}: {e:?}");
        says(&e, &["model.safetensors"]);
    }
}

#[test]
fn missing_misshapen_and_mistyped_tensors_are_named() {
    // Missing.
    let (_t, dir) = common::tiny();
    let mut t = common::tiny_tensors();
    t.retain(|(n, _, _)| n != "encoder.layer.1.output.dense.weight");
    common::write_safetensors(&dir.join("model.safetensors"), &t).unwrap();
    let e = load_err(&dir);
    assert!(matches!(e, EmbedError::Tensor { .. }), "{e:?}");
    says(&e, &["encoder.layer.1.output.dense.weight", "missing"]);

    // The config says a shape the file does not have.
    let (_t, dir) = common::tiny();
    edit_json(&dir.join("config.json"), |v| v["intermediate_size"] = json!(80));
    says(&load_err(&dir), &["encoder.layer.0.intermediate.dense.weight", "shape"]);
    let (_t, dir) = common::tiny();
    edit_json(&dir.join("config.json"), |v| v["num_hidden_layers"] = json!(3));
    says(&load_err(&dir), &["encoder.layer.2", "missing"]);

    // An integer tensor where floats belong.
    let (_t, dir) = common::tiny();
    let t = common::tiny_tensors();
    let bytes: Vec<Vec<u8>> = t.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> = t
        .iter()
        .zip(&bytes)
        .map(|((n, s, _), b)| {
            let dtype = if n == "embeddings.LayerNorm.bias" { safetensors::Dtype::I32 } else { safetensors::Dtype::F32 };
            (n.clone(), safetensors::tensor::TensorView::new(dtype, s.clone(), b).unwrap())
        })
        .collect();
    std::fs::write(dir.join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    says(&load_err(&dir), &["embeddings.LayerNorm.bias", "I32"]);
}

#[test]
fn broken_tokenizers_are_refused() {
    let (_t, dir) = common::tiny();
    std::fs::write(dir.join("tokenizer.json"), b"{\"version\": \"1.0\"}").unwrap();
    let e = load_err(&dir);
    assert!(matches!(e, EmbedError::Tokenizer { .. }), "{e:?}");
    says(&e, &["tokenizer.json"]);

    // A vocabulary larger than the model's embedding table.
    let (_t, dir) = common::tiny();
    edit_json(&dir.join("tokenizer.json"), |v| {
        v["model"]["vocab"]["zebra"] = json!(5000);
    });
    says(&load_err(&dir), &["tokenizer.json", "vocab_size"]);
}

#[test]
fn out_of_range_ids_are_an_error_not_a_panic() {
    let (_t, dir) = common::tiny();
    let enc = Encoder::load(&dir).unwrap();
    let e = enc.embed_ids(&[vec![2, 9999, 3]]).unwrap_err();
    says(&e, &["9999"]);
    let e = enc.embed_ids(&[vec![]]).unwrap_err();
    says(&e, &["0 tokens"]);
    let e = enc.embed_ids(&[vec![5; common::MAX_POS + 1]]).unwrap_err();
    says(&e, &["tokens"]);
    assert!(enc.embed_ids(&[]).unwrap().is_empty());
}
