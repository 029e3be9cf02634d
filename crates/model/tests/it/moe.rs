//! Qwen3-MoE (a mixture of experts in every layer) against Hugging Face transformers: the
//! `tiny-qwen3-moe` fixture (Qwen3MoeForCausalLM: 8 experts, 2 per token, renormalized) run
//! from its Hugging Face folder against `tests/golden/tiny-qwen3-moe.json` (made by
//! `scripts/golden_arch.py`): ids, last-position logits, the argmax at every position,
//! a 32-token greedy continuation and the chat template. A token's experts and output do
//! not depend on what else shares its step; what the mixture does not implement is refused
//! by name. Mixtral (MixtralForCausalLM, `tiny-mixtral`) the same way, from its folder and from
//! GGUF, where llama.cpp writes it as `llama` with experts.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::arch_golden::check_model;
use crate::chunking::assert_chunking_and_batching_agree;
use crate::common::*;
use crate::golden::fixture_differences;
use engram_fixture::{GgufFormat, Shape};
use engram_model::{Arch, Model};
use serde_json::Value;

type Files = (tempfile::TempDir, PathBuf, Vec<(GgufFormat, PathBuf)>);

/// A mixture shape's Hugging Face folder and its F32 and F16 GGUF files (experts as
/// llama.cpp's 3-D tensors), made once per process.
fn files(shape: Shape) -> &'static Files {
    static QWEN3_MOE: OnceLock<Files> = OnceLock::new();
    static MIXTRAL: OnceLock<Files> = OnceLock::new();
    let cell = match shape {
        Shape::TinyQwen3Moe => &QWEN3_MOE,
        Shape::TinyMixtral => &MIXTRAL,
        other => panic!("not a mixture shape: {other:?}"),
    };
    cell.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let formats = [GgufFormat::F32, GgufFormat::F16];
        let fx = engram_fixture::generate(shape, engram_fixture::DEFAULT_SEED, dir.path(), &formats, &mut |_| {}).expect("generate");
        (dir, fx.hf_dir, fx.ggufs)
    })
}

fn fixture() -> &'static Files {
    files(Shape::TinyQwen3Moe)
}

fn gguf_of(shape: Shape, format: GgufFormat) -> &'static PathBuf {
    &files(shape).2.iter().find(|(f, _)| *f == format).expect("written").1
}

fn gguf(format: GgufFormat) -> &'static PathBuf {
    gguf_of(Shape::TinyQwen3Moe, format)
}

fn golden_of(shape: Shape) -> Value {
    let path = format!("{}/tests/golden/{}.json", env!("CARGO_MANIFEST_DIR"), shape.name());
    let g: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let problems = fixture_differences(&g, &files(shape).1);
    assert!(
        problems.is_empty(),
        "the fixture no longer matches {path}; regenerate it with scripts/golden_arch.py:\n  {}",
        problems.join("\n  ")
    );
    g
}

fn golden() -> Value {
    golden_of(Shape::TinyQwen3Moe)
}

/// Mixtral from its folder, from its GGUF (`llama` with experts) and from `engram convert`'s
/// file: each against transformers' golden.
#[test]
fn mixtral_matches_transformers_from_hf_and_gguf() {
    let g = golden_of(Shape::TinyMixtral);
    let hf = Model::load(&files(Shape::TinyMixtral).1).unwrap();
    let m = hf.config.moe.expect("a mixture of experts");
    assert_eq!((hf.config.arch, m.experts, m.top_k, m.expert_ffn, m.norm_top_k), (Arch::Mixtral, 8, 2, 64, true));
    check_model("tiny-mixtral hf", &hf, &g);
    let gguf = Model::load(gguf_of(Shape::TinyMixtral, GgufFormat::F32)).unwrap();
    assert_eq!((gguf.config.arch, gguf.config.moe), (Arch::Llama, hf.config.moe), "a llama file with the same experts");
    check_model("tiny-mixtral gguf f32", &gguf, &g);
    let converted = files(Shape::TinyMixtral).0.path().join("converted-f32.gguf");
    engram_fixture::convert_hf(&files(Shape::TinyMixtral).1, &converted, GgufFormat::F32, &mut |_| {}).unwrap();
    check_model("tiny-mixtral converted gguf", &Model::load(&converted).unwrap(), &g);
}

#[test]
fn qwen3_moe_matches_transformers_from_hf() {
    let model = Model::load(&fixture().1).unwrap();
    let m = model.config.moe.expect("a mixture of experts");
    assert_eq!((model.config.arch, m.experts, m.top_k, m.expert_ffn, m.norm_top_k), (Arch::Qwen3Moe, 8, 2, 48, true));
    check_model("tiny-qwen3-moe hf", &model, &golden());
}

/// The same model from a GGUF file: `qwen3moe` metadata, the router in f32, each projection's
/// experts one 3-D tensor split into views. The F32 file matches transformers as the folder
/// does; the F16 file tracks it to f16's rounding.
#[test]
fn qwen3_moe_matches_transformers_from_gguf() {
    let g = golden();
    let model = Model::load(gguf(GgufFormat::F32)).unwrap();
    assert_eq!(model.config.moe, Model::load(&fixture().1).unwrap().config.moe, "the same mixture from both files");
    check_model("tiny-qwen3-moe gguf f32", &model, &g);
    // `engram convert` writes the folder as the fixture writes its own file.
    let converted = fixture().0.path().join("converted-f32.gguf");
    engram_fixture::convert_hf(&fixture().1, &converted, GgufFormat::F32, &mut |_| {}).unwrap();
    check_model("tiny-qwen3-moe converted gguf", &Model::load(&converted).unwrap(), &g);
    let ids = crate::golden::u32s(&g["prompt_ids"]);
    let half = Model::load(gguf(GgufFormat::F16)).unwrap();
    let err = rel_err(&all_logits(&half, &ids), &all_logits(&model, &ids));
    assert!(err < 2e-2, "f16 against f32: {err:.3e}");
}

#[test]
fn qwen3_moe_chat_template_renders_like_transformers() {
    let g = golden();
    let model = Model::load(&fixture().1).unwrap();
    let tpl = model.tokenizer.chat_template().expect("a chat template");
    let messages: Vec<engram_tokenizer::ChatMessage> = g["chat_messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| engram_tokenizer::ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let (bos, eos) = (model.tokenizer.bos_token().unwrap_or(""), model.tokenizer.eos_token().unwrap_or(""));
    for case in g["chat"].as_array().unwrap() {
        let kwargs = case["kwargs"].as_object().cloned().unwrap_or_default();
        let add = case["add_generation_prompt"].as_bool().unwrap();
        let ours = tpl.render_with(&messages, add, bos, eos, &kwargs).unwrap();
        assert_eq!(ours, case["rendered"].as_str().unwrap(), "{kwargs:?} add_generation_prompt={add}");
    }
}

/// Each token is routed on its own row: one chunk, several, token by token, and batched with
/// another sequence all give the same logits (to the attention's float tolerance).
#[test]
fn a_tokens_experts_do_not_depend_on_what_shares_its_step() {
    let model = Model::load(&fixture().1).unwrap();
    let ids = model.tokenizer.encode(&PROMPT.repeat(2), true).unwrap().ids;
    assert_chunking_and_batching_agree(&model, &ids, &[1, 7], "A different prompt, routed to other experts.");
}

#[test]
fn what_the_mixture_does_not_implement_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let edits: [(&str, Value, &str); 3] = [
        ("decoder_sparse_step", 2.into(), "decoder_sparse_step"),
        ("mlp_only_layers", serde_json::json!([0]), "mlp_only_layers"),
        ("num_experts_per_tok", 9.into(), "num_experts_per_tok"),
    ];
    for (key, value, field) in edits {
        let copy = dir.path().join(key);
        std::fs::create_dir_all(&copy).unwrap();
        for e in std::fs::read_dir(&fixture().1).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), copy.join(e.file_name())).unwrap();
        }
        let mut c: Value = serde_json::from_str(&std::fs::read_to_string(copy.join("config.json")).unwrap()).unwrap();
        c[key] = value;
        std::fs::write(copy.join("config.json"), c.to_string()).unwrap();
        let e = Model::load(&copy).err().expect("refused").to_string();
        assert!(e.contains(field), "{key}: {e}");
    }
}

/// The renormalization of the chosen experts' weights is part of the model: without it the
/// logits move far beyond the parity tolerance (so the parity check would catch it dropped).
#[test]
fn without_renormalized_weights_it_is_another_model() {
    let dir = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(&fixture().1).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.path().join(e.file_name())).unwrap();
    }
    let mut c: Value = serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap()).unwrap();
    c["norm_topk_prob"] = false.into();
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    let ids = crate::golden::u32s(&golden()["prompt_ids"]);
    let (with, without) = (Model::load(&fixture().1).unwrap(), Model::load(dir.path()).unwrap());
    let err = rel_err(&all_logits(&without, &ids), &all_logits(&with, &ids));
    assert!(err > 1e-2, "renormalization changed the logits by only {err:.3e}");
}
