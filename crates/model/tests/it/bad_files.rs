//! Wrong, truncated and unsupported model files: each gives one clear error
//! naming the file and the field or tensor — never a panic.

use crate::common;
use std::path::{Path, PathBuf};

use common::*;
use engram_fixture::GgufFormat;
use engram_gguf::{Gguf, GgufWriter, Value};
use engram_model::Model;

fn load_err(path: &Path) -> String {
    match Model::load(path) {
        Ok(_) => panic!("{} loaded but should not", path.display()),
        Err(e) => e.to_string(),
    }
}

/// Rewrites the Q8_0 fixture with `edit` applied to its metadata and tensors.
fn rewritten(
    name: &str,
    edit: impl Fn(&mut Vec<(String, Value)>, &mut Vec<(String, Vec<u64>, u32, Vec<u8>)>),
) -> (tempfile::TempDir, PathBuf) {
    let src = std::fs::read(tiny_gguf(GgufFormat::Q8_0)).unwrap();
    let g = Gguf::parse(&src).unwrap();
    let mut meta = g.metadata.clone();
    let mut tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)> = g
        .tensors
        .iter()
        .map(|t| {
            let start = (g.data_offset + t.offset) as usize;
            (t.name.clone(), t.dims.clone(), t.ggml_type, src[start..start + t.n_bytes as usize].to_vec())
        })
        .collect();
    edit(&mut meta, &mut tensors);
    let mut w = GgufWriter::new();
    for (k, v) in meta {
        if k != "general.alignment" {
            w.add(&k, v);
        }
    }
    for (n, d, ty, data) in tensors {
        w.add_tensor(&n, &d, ty, data).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    w.write_file(&path).unwrap();
    (dir, path)
}

#[test]
fn truncated_gguf() {
    let src = std::fs::read(tiny_gguf(GgufFormat::Q8_0)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for cut in [3, 20, 200, src.len() / 2, src.len() - 1] {
        let p = dir.path().join(format!("cut{cut}.gguf"));
        std::fs::write(&p, &src[..cut]).unwrap();
        let e = load_err(&p);
        assert!(e.contains(&format!("cut{cut}.gguf")), "error does not name the file: {e}");
    }
}

#[test]
fn wrong_magic() {
    let mut src = std::fs::read(tiny_gguf(GgufFormat::Q8_0)).unwrap();
    src[0] = b'X';
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("magic.gguf");
    std::fs::write(&p, &src).unwrap();
    let e = load_err(&p);
    assert!(e.contains("magic.gguf") && e.to_lowercase().contains("gguf"), "{e}");
}

#[test]
fn unknown_architecture() {
    let (_d, p) = rewritten("mamba.gguf", |meta, _| {
        for (k, v) in meta.iter_mut() {
            if k == "general.architecture" {
                *v = Value::String("mamba".into());
            }
        }
    });
    let e = load_err(&p);
    assert!(e.contains("unsupported architecture \"mamba\"") && e.contains("mamba.gguf"), "{e}");
    assert!(e.contains("(supported: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, phi3, gemma2, gemma3, smollm3, gpt_oss)"), "{e}");
}

#[test]
fn missing_tokenizer() {
    let (_d, p) = rewritten("notok.gguf", |meta, _| meta.retain(|(k, _)| !k.starts_with("tokenizer.")));
    let e = load_err(&p);
    assert!(e.contains("tokenizer.ggml") && e.contains("notok.gguf"), "{e}");
}

#[test]
fn a_token_id_past_32_bits_is_an_error_naming_the_key() {
    let (_d, p) = rewritten("bigid.gguf", |meta, _| {
        meta.retain(|(k, _)| k != "tokenizer.ggml.bos_token_id");
        meta.push(("tokenizer.ggml.bos_token_id".into(), Value::U64((1 << 32) + 1)));
    });
    let e = load_err(&p);
    assert!(e.contains("tokenizer.ggml.bos_token_id") && e.contains("does not fit 32 bits") && e.contains("bigid.gguf"), "{e}");
}

#[test]
fn tensor_shape_mismatch() {
    let (_d, p) = rewritten("shape.gguf", |_, tensors| {
        let t = tensors.iter_mut().find(|t| t.0 == "blk.1.ffn_up.weight").unwrap();
        // Same bytes, rows and columns swapped: valid container, wrong model.
        t.1 = vec![t.1[0] / 2, t.1[1] * 2];
    });
    let e = load_err(&p);
    assert!(e.contains("blk.1.ffn_up.weight") && e.contains("shape"), "{e}");
}

#[test]
fn missing_tensor() {
    let (_d, p) = rewritten("missing.gguf", |_, tensors| tensors.retain(|t| t.0 != "blk.0.attn_k.weight"));
    let e = load_err(&p);
    assert!(e.contains("blk.0.attn_k.weight") && e.contains("missing"), "{e}");
}

#[test]
fn hf_folder_problems() {
    let dir = tempfile::tempdir().unwrap();
    let hf = dir.path().join("m");
    std::fs::create_dir(&hf).unwrap();
    for f in ["config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"] {
        std::fs::copy(tiny_hf().join(f), hf.join(f)).unwrap();
    }
    assert!(Model::load(&hf).is_ok());

    // Unsupported architecture in config.json.
    let cfg = std::fs::read_to_string(hf.join("config.json")).unwrap();
    std::fs::write(hf.join("config.json"), cfg.replace("\"llama\"", "\"gpt_neox\"")).unwrap();
    let e = load_err(&hf);
    assert!(e.contains("gpt_neox") && e.contains("config.json"), "{e}");

    // A config whose hidden size disagrees with the tensors.
    std::fs::write(hf.join("config.json"), cfg.replace("\"hidden_size\": 64", "\"hidden_size\": 128")).unwrap();
    let e = load_err(&hf);
    assert!(e.contains("shape"), "{e}");

    // Wrong field type.
    std::fs::write(hf.join("config.json"), cfg.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": \"two\"")).unwrap();
    let e = load_err(&hf);
    assert!(e.contains("num_hidden_layers"), "{e}");
    std::fs::write(hf.join("config.json"), &cfg).unwrap();

    // Missing tokenizer.
    std::fs::remove_file(hf.join("tokenizer.json")).unwrap();
    let e = load_err(&hf);
    assert!(e.contains("tokenizer.json"), "{e}");
    std::fs::copy(tiny_hf().join("tokenizer.json"), hf.join("tokenizer.json")).unwrap();

    // Truncated safetensors.
    let st = std::fs::read(hf.join("model.safetensors")).unwrap();
    std::fs::write(hf.join("model.safetensors"), &st[..st.len() / 2]).unwrap();
    let e = load_err(&hf);
    assert!(e.contains("model.safetensors"), "{e}");

    // Not a model at all.
    let e = load_err(&dir.path().join("nope"));
    assert!(e.contains("nope"), "{e}");
}
