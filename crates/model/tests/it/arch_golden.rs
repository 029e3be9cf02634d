//! Parity of the architectures beyond Llama against Hugging Face transformers:
//! the `tiny-qwen3` fixture (Qwen3ForCausalLM: q/k RMSNorm, head size wider than
//! hidden / heads, tied embeddings) and `tiny-phi3` (Phi3ForCausalLM: fused
//! q/k/v and gate/up, partial rotary 0.75, LongRoPE) and `tiny-gemma3`
//! (Gemma3ForCausalLM: five layers sliding over a 16-position window to one
//! global, separate RoPE bases, q/k norms, four block norms, √hidden embedding
//! scale, GELU-tanh, `query_pre_attn_scalar`) and `tiny-gemma2`
//! (Gemma2ForCausalLM: alternating sliding and global layers, attention and
//! final-logit softcapping) and `tiny-gpt-oss` (GptOssForCausalLM: alternating sliding
//! and global layers, attention sinks, q/k/v/o biases, YaRN, 4 of 8 biased experts routed
//! top-k then softmax through the clamped SwiGLU), each run from its Hugging
//! Face folder and from the GGUF file `convert_hf` writes from that folder,
//! against `tests/golden/<shape>.json` (made by `scripts/golden_arch.py`):
//! the prompt's ids, the last-position logits, the argmax at every one of a few
//! hundred positions, a 32-token greedy continuation and the chat template.
//!
//! If the fixture generator changes, the first check fails and says how to
//! regenerate the golden file.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::common::*;
use crate::golden::{f32s, fixture_differences, u32s, LOGIT_TOL};
use engram_fixture::{GgufFormat, Shape};
use engram_model::{Arch, LayerAttention, Model};
use engram_tokenizer::ChatMessage;
use serde_json::Value;

const REGENERATE: &str = "cargo build --release -p engram-cli && /work/venv-torch/bin/python scripts/golden_arch.py \
     (needs torch + transformers; see scripts/README.md)";

/// A shape's HF folder, the F32 GGUF converted from it, and the fixture's own F16 and Q8_0
/// GGUF files (and, for a mixture, one with MXFP4 experts), made once per process.
pub(crate) struct Files {
    _dir: tempfile::TempDir,
    pub(crate) hf: PathBuf,
    pub(crate) gguf: PathBuf,
    pub(crate) quantized: Vec<(GgufFormat, PathBuf)>,
}

pub(crate) fn files(shape: Shape) -> &'static Files {
    static QWEN3: OnceLock<Files> = OnceLock::new();
    static PHI3: OnceLock<Files> = OnceLock::new();
    static GEMMA3: OnceLock<Files> = OnceLock::new();
    static GEMMA2: OnceLock<Files> = OnceLock::new();
    static GPT_OSS: OnceLock<Files> = OnceLock::new();
    let cell = match shape {
        Shape::TinyQwen3 => &QWEN3,
        Shape::TinyPhi3 => &PHI3,
        Shape::TinyGemma3 => &GEMMA3,
        Shape::TinyGemma2 => &GEMMA2,
        Shape::TinyGptOss => &GPT_OSS,
        other => panic!("no golden file for {other:?}"),
    };
    cell.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        // MXFP4 experts are written for mixtures only (the others skip the format).
        let formats = [GgufFormat::F16, GgufFormat::Q8_0, GgufFormat::Mxfp4Moe];
        let fx = engram_fixture::generate(shape, engram_fixture::DEFAULT_SEED, dir.path(), &formats, &mut |_| {}).expect("generate");
        let gguf = dir.path().join(format!("{}-converted-f32.gguf", shape.name()));
        engram_fixture::convert_hf(&fx.hf_dir, &gguf, GgufFormat::F32, &mut |_| {}).expect("convert the HF folder");
        Files { _dir: dir, hf: fx.hf_dir, gguf, quantized: fx.ggufs }
    })
}

/// The golden file of `shape`, after checking that the generated fixture is the one it was made from.
pub(crate) fn golden(shape: Shape) -> Value {
    let path = format!("{}/tests/golden/{}.json", env!("CARGO_MANIFEST_DIR"), shape.name());
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let g: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {path}: {e}"));
    let problems = fixture_differences(&g, &files(shape).hf);
    assert!(
        problems.is_empty(),
        "the {} fixture no longer matches {path} (was the fixture generator changed?):\n  {}\n\
         If the change is intended, regenerate the golden file: {REGENERATE}",
        shape.name(),
        problems.join("\n  ")
    );
    g
}

/// Both ways of loading `shape`: its HF folder and its GGUF conversion.
pub(crate) fn models(shape: Shape) -> [(&'static str, Model); 2] {
    let f = files(shape);
    [("hf", Model::load(&f.hf).expect("load the HF folder")), ("gguf", Model::load(&f.gguf).expect("load the converted GGUF"))]
}

/// Checks ids, last-position logits, per-position argmax and greedy decoding against the golden file.
fn check_parity(shape: Shape) {
    let g = golden(shape);
    let ids = u32s(&g["prompt_ids"]);
    assert!(ids.len() >= 200, "the golden prompt has {} tokens; a few hundred are wanted", ids.len());
    for (how, model) in models(shape) {
        check_model(&format!("{} {how}", shape.name()), &model, &g);
    }
}

/// One loaded model against a golden file: ids, last-position logits, argmax, greedy.
pub(crate) fn check_model(what: &str, model: &Model, g: &Value) {
    let ids = u32s(&g["prompt_ids"]);
    {
        let ours = model.tokenizer.encode(g["prompt"].as_str().unwrap(), true).unwrap().ids;
        assert_eq!(ours, ids, "{what}: token ids differ from transformers'");

        let vocab = model.config.vocab;
        let all = all_logits(model, &ids);
        let last = &all[(ids.len() - 1) * vocab..];
        let err = rel_err(last, &f32s(&g["last_logits"]));
        eprintln!("{what} vs transformers ({} tokens): max relative last-position logit error {err:.3e}", ids.len());
        assert!(err < LOGIT_TOL, "{what}: last-position logits differ from transformers: {err:.3e} >= {LOGIT_TOL:e}");

        let (mut bad, mut equal) = (Vec::new(), 0);
        for (pos, &w) in u32s(&g["argmax_per_position"]).iter().enumerate() {
            let row = &all[pos * vocab..(pos + 1) * vocab];
            let mine = argmax(row);
            equal += usize::from(mine == w);
            // Only a true near-tie may differ: transformers' pick within the tolerance of our maximum.
            let scale = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            if mine != w && row[mine as usize] - row[w as usize] > LOGIT_TOL * scale {
                bad.push(format!("position {pos}: ours {mine}, transformers {w}"));
            }
        }
        eprintln!("{what}: argmax equal to transformers' at {equal} of {} positions", ids.len());
        assert!(bad.is_empty(), "{what}: argmax differs from transformers:\n  {}", bad.join("\n  "));

        let want = u32s(&g["greedy_ids"]);
        let got = greedy(model, &ids, want.len());
        let agree = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
        assert_eq!(got, want, "{what}: greedy continuation diverges from transformers after {agree} tokens");
    }
}

/// Checks every recorded `apply_chat_template` rendering, from both loaders' templates.
fn check_chat(shape: Shape) {
    let g = golden(shape);
    let msgs: Vec<ChatMessage> = g["chat_messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let cases = g["chat"].as_array().unwrap();
    assert!(!cases.is_empty());
    for (how, model) in models(shape) {
        let tk = &model.tokenizer;
        let template = tk.chat_template().unwrap_or_else(|| panic!("{} {how} has no chat template", shape.name()));
        for case in cases {
            let add = case["add_generation_prompt"].as_bool().unwrap();
            let extra = case["kwargs"].as_object().unwrap();
            let rendered = template.render_with(&msgs, add, tk.bos_token().unwrap_or(""), tk.eos_token().unwrap_or(""), extra).unwrap();
            assert_eq!(
                rendered,
                case["rendered"].as_str().unwrap(),
                "{} {how}: chat template (add_generation_prompt={add}, {extra:?}) renders differently from transformers",
                shape.name()
            );
        }
    }
}

#[test]
fn qwen3_matches_transformers_from_hf_and_gguf() {
    check_parity(Shape::TinyQwen3);
}

#[test]
fn phi3_matches_transformers_from_hf_and_gguf() {
    check_parity(Shape::TinyPhi3);
}

/// 326 prompt tokens over a 16-position window: every sliding layer's window moves 300 times.
#[test]
fn gemma3_matches_transformers_from_hf_and_gguf() {
    check_parity(Shape::TinyGemma3);
}

#[test]
fn gemma3_chat_template_renders_like_transformers() {
    check_chat(Shape::TinyGemma3);
}

/// The window is what makes the answer: the same model with every layer global is far from
/// transformers' logits (and from its own sliding self), from both loaders.
#[test]
fn gemma3_without_its_sliding_window_is_another_model() {
    let g = golden(Shape::TinyGemma3);
    assert_eq!(g["sliding_window"].as_u64(), Some(16));
    let ids = u32s(&g["prompt_ids"]);
    let want = f32s(&g["last_logits"]);
    for (how, mut model) in models(Shape::TinyGemma3) {
        let c = &model.config;
        let sliding = (0..c.num_layers).filter(|&l| c.layer_attention(l).window() == Some(16)).count();
        assert_eq!((sliding, c.num_layers), (5, 6), "{how}: five sliding layers, one global");
        let vocab = c.vocab;
        let with = rel_err(&all_logits(&model, &ids)[(ids.len() - 1) * vocab..], &want);
        model.config.layers = vec![LayerAttention::Global; model.config.num_layers];
        let without = rel_err(&all_logits(&model, &ids)[(ids.len() - 1) * vocab..], &want);
        eprintln!("tiny-gemma3 {how}: last-position error with the window {with:.2e}, with every layer global {without:.2e}");
        assert!(with < LOGIT_TOL && without > 100.0 * LOGIT_TOL, "{how}: {with:e} / {without:e}");
    }
}

#[test]
fn gemma2_matches_transformers_from_hf_and_gguf() {
    check_parity(Shape::TinyGemma2);
}

/// 326 prompt tokens over a 16-position window on the even layers: sinks, biases, YaRN and
/// the routed experts from the folder and from its GGUF conversion (`gpt_oss.rs` has the rest).
#[test]
fn gpt_oss_matches_transformers_from_hf_and_gguf() {
    check_parity(Shape::TinyGptOss);
}

#[test]
fn gemma2_chat_template_renders_like_transformers() {
    check_chat(Shape::TinyGemma2);
}

/// Each of Gemma 2's three departures from the Llama attention — the window, the attention
/// softcap, the final softcap — changes the answer: without any one of them the last-position
/// logits are far from transformers'.
#[test]
fn gemma2_without_its_window_or_either_softcap_is_another_model() {
    let g = golden(Shape::TinyGemma2);
    let ids = u32s(&g["prompt_ids"]);
    let want = f32s(&g["last_logits"]);
    for (how, model) in models(Shape::TinyGemma2) {
        let c = model.config.clone();
        assert_eq!((c.attn_softcap, c.final_softcap), (Some(4.0), Some(6.0)), "{how}");
        assert_eq!(c.layers, [LayerAttention::Sliding { window: 16 }, LayerAttention::Global].repeat(2), "{how}: alternating");
        let mut model = model;
        let vocab = c.vocab;
        let err = |m: &Model| rel_err(&all_logits(m, &ids)[(ids.len() - 1) * vocab..], &want);
        assert!(err(&model) < LOGIT_TOL, "{how}");
        type Edit = fn(&mut engram_model::ModelConfig);
        let edits: [(&str, Edit); 3] = [
            ("every layer global", |c| c.layers = vec![LayerAttention::Global; c.num_layers]),
            ("no attention softcap", |c| c.attn_softcap = None),
            ("no final softcap", |c| c.final_softcap = None),
        ];
        for (what, edit) in edits {
            model.config = c.clone();
            edit(&mut model.config);
            let e = err(&model);
            eprintln!("tiny-gemma2 {how}: {what}: last-position error {e:.2e}");
            assert!(e > 100.0 * LOGIT_TOL, "{how}: {what} changes nothing ({e:e})");
        }
    }
}

/// The golden file `name` made from `tiny`'s folder with config.json fields changed
/// (`fixture.config_edit`), that edited folder (checked to be the one the golden was made
/// from), and the model loaded from it.
fn tiny_edited(name: &str) -> (tempfile::TempDir, Value, Model) {
    let path = format!("{}/tests/golden/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let g: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(tiny_hf()).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let cfg_path = dir.path().join("config.json");
    let mut c: Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
    for (k, v) in g["fixture"]["config_edit"].as_object().expect("config_edit") {
        c[k] = v.clone();
    }
    std::fs::write(&cfg_path, c.to_string()).unwrap();
    let problems = fixture_differences(&g, dir.path());
    assert!(problems.is_empty(), "the tiny fixture no longer matches {path}: {problems:?}; regenerate: {REGENERATE}");
    let model = Model::load(dir.path()).unwrap();
    (dir, g, model)
}

/// `tiny` read as Mistral with a 16-position window over every layer (transformers'
/// MistralForCausalLM applies `sliding_window` to all layers): equal to transformers over
/// the 326-token prompt, and far from it with the window ignored. HF folder only: llama.cpp's
/// converter writes Mistral as `llama` without the window.
#[test]
fn mistral_with_its_sliding_window_matches_transformers() {
    let (_dir, g, mut model) = tiny_edited("tiny-mistral-swa");
    assert_eq!(model.config.arch, Arch::Mistral);
    assert_eq!(model.config.layers, vec![LayerAttention::Sliding { window: 16 }; model.config.num_layers]);
    check_model("tiny as mistral, window 16", &model, &g);
    let ids = u32s(&g["prompt_ids"]);
    model.config.layers = vec![LayerAttention::Global; model.config.num_layers];
    let vocab = model.config.vocab;
    let without = rel_err(&all_logits(&model, &ids)[(ids.len() - 1) * vocab..], &f32s(&g["last_logits"]));
    eprintln!("tiny as mistral: with the window ignored, last-position error {without:.2e}");
    assert!(without > 100.0 * LOGIT_TOL, "the window changes nothing ({without:e})");
}

/// `tiny` read as SmolLM3 with its second layer NoPE (`no_rope_layers: [1, 0]`): equal to
/// transformers' SmolLM3ForCausalLM over the 326-token prompt, and far from it with RoPE
/// applied to every layer. HF folder only: the fixture converter writes no `smollm3` GGUF.
#[test]
fn smollm3_with_a_nope_layer_matches_transformers() {
    let (_dir, g, mut model) = tiny_edited("tiny-smollm3");
    assert_eq!(model.config.arch, Arch::SmolLm3);
    assert_eq!((model.config.uses_rope(0), model.config.uses_rope(1)), (true, false));
    assert!(model.config.layer_rope(1).inv_freq.iter().all(|&f| f == 0.0), "a NoPE layer's keys move unrotated");
    check_model("tiny as smollm3, layer 1 NoPE", &model, &g);
    let ids = u32s(&g["prompt_ids"]);
    model.config.no_rope = None;
    let vocab = model.config.vocab;
    let with_rope = rel_err(&all_logits(&model, &ids)[(ids.len() - 1) * vocab..], &f32s(&g["last_logits"]));
    eprintln!("tiny as smollm3: with RoPE on every layer, last-position error {with_rope:.2e}");
    assert!(with_rope > 100.0 * LOGIT_TOL, "the NoPE layer changes nothing ({with_rope:e})");
}

#[test]
fn qwen3_chat_template_with_thinking_toggle_renders_like_transformers() {
    check_chat(Shape::TinyQwen3);
}

#[test]
fn phi3_chat_template_renders_like_transformers() {
    check_chat(Shape::TinyPhi3);
}

#[test]
fn configs_read_the_same_from_hf_and_gguf() {
    for shape in [Shape::TinyQwen3, Shape::TinyPhi3, Shape::TinyGemma3, Shape::TinyGemma2, Shape::TinyGptOss] {
        let [(_, hf), (_, gguf)] = models(shape);
        let (a, b) = (&hf.config, &gguf.config);
        assert_eq!((a.arch, a.head_dim, a.qk_norm, a.qkv_bias), (b.arch, b.head_dim, b.qk_norm, b.qkv_bias), "{shape:?}");
        assert_eq!((a.max_positions, a.rope.rotary_dim(), a.tied_embeddings), (b.max_positions, b.rope.rotary_dim(), b.tied_embeddings));
        assert_eq!(a.rope.style, b.rope.style, "{shape:?}: GGUF qwen3/phi3 are NEOX, as the HF folder");
        assert!((a.rope_attn_factor - b.rope_attn_factor).abs() < 1e-6, "{shape:?}");
        assert!(a.rope.inv_freq.iter().zip(&b.rope.inv_freq).all(|(x, y)| (x - y).abs() <= 1e-6 * x.abs()), "{shape:?}: RoPE frequencies");
        assert_eq!(
            (&a.layers, &a.rope_local, a.sandwich_norms, a.ffn_act),
            (&b.layers, &b.rope_local, b.sandwich_norms, b.ffn_act),
            "{shape:?}"
        );
        assert_eq!((a.embed_scale, a.attn_scale), (b.embed_scale, b.attn_scale), "{shape:?}");
        assert_eq!((a.attn_softcap, a.final_softcap), (b.attn_softcap, b.final_softcap), "{shape:?}");
        assert_eq!((a.moe, a.rms_eps), (b.moe, b.rms_eps), "{shape:?}");
    }
    let g = &Model::load(&files(Shape::TinyGemma3).hf).unwrap().config;
    assert_eq!((g.arch, g.layer_rope(0).theta, g.layer_rope(5).theta, g.embed_scale), (Arch::Gemma3, 1e4, 1e6, 8.0));
    assert_eq!(g.layer_attention(5), LayerAttention::Global);
    let q = &Model::load(&files(Shape::TinyQwen3).hf).unwrap().config;
    assert_eq!((q.arch, q.head_dim, q.q_width(), q.hidden), (Arch::Qwen3, 32, 128, 64), "Qwen3's head size is not hidden / heads");
    assert!(q.qk_norm && !q.qkv_bias && q.tied_embeddings);
    let p = &Model::load(&files(Shape::TinyPhi3).hf).unwrap().config;
    assert_eq!((p.arch, p.head_dim, p.rope.rotary_dim()), (Arch::Phi3, 16, 12), "partial rotary 0.75 of 16");
    // LongRoPE runs its short factors only, so the context stops at the original 1024.
    assert_eq!(p.max_positions, 1024);
    assert!((p.rope_attn_factor - (1.0f32 + 4f32.ln() / 1024f32.ln()).sqrt()).abs() < 1e-6, "{}", p.rope_attn_factor);
}

/// `shape`'s HF folder copied with `edit` applied to its config.json.
fn edited_hf(shape: Shape, dir: &std::path::Path, name: &str, edit: impl Fn(&mut Value)) -> PathBuf {
    let out = dir.join(name);
    std::fs::create_dir_all(&out).unwrap();
    for f in std::fs::read_dir(&files(shape).hf).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, out.join(f.file_name().unwrap())).unwrap();
    }
    let mut c: Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
    edit(&mut c);
    std::fs::write(out.join("config.json"), c.to_string()).unwrap();
    out
}

#[test]
fn what_these_families_do_not_implement_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            edited_hf(Shape::TinyPhi3, dir.path(), "yarn", |c| c["rope_scaling"] = serde_json::json!({"type": "yarn", "factor": 4.0})),
            "\"yarn\" is not supported",
        ),
        // Below the 1024-token context (LongRoPE caps it at the original one).
        (edited_hf(Shape::TinyPhi3, dir.path(), "swa", |c| c["sliding_window"] = 512.into()), "sliding-window attention (512 tokens"),
        (
            edited_hf(Shape::TinyPhi3, dir.path(), "no-short", |c| {
                c["rope_scaling"].as_object_mut().unwrap().remove("short_factor");
            }),
            "short_factor",
        ),
        (edited_hf(Shape::TinyQwen3, dir.path(), "bias", |c| c["attention_bias"] = true.into()), "attention_bias"),
        (edited_hf(Shape::TinyQwen3, dir.path(), "qswa", |c| c["use_sliding_window"] = true.into()), "use_sliding_window"),
    ];
    for (path, want) in cases {
        let e = match Model::load(&path) {
            Ok(_) => panic!("{} loaded", path.display()),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(want) && e.contains("config.json"), "expected \"{want}\" in: {e}");
    }
    // A window at least as long as the context changes nothing (Phi-4-mini's 262144 over 131072).
    assert!(Model::load(&edited_hf(Shape::TinyPhi3, dir.path(), "long-swa", |c| c["sliding_window"] = 1024.into())).is_ok());
}

/// The fixtures' F16 and Q8_0 files (Phi-3's fused matrices split into row views of quantized
/// blocks) track the f32 folder over the whole prompt, within bounds of each format's
/// rounding like `formats.rs`'s for `tiny`.
#[test]
fn f16_and_q8_0_files_track_the_f32_folder() {
    for shape in [Shape::TinyQwen3, Shape::TinyPhi3, Shape::TinyGemma3, Shape::TinyGemma2] {
        let g = golden(shape);
        let ids = u32s(&g["prompt_ids"]);
        let reference = all_logits(&Model::load(&files(shape).hf).unwrap(), &ids);
        for (format, path) in &files(shape).quantized {
            let m = Model::load(path).unwrap();
            let err = rel_err(&all_logits(&m, &ids), &reference);
            eprintln!("{} {format:?}: max relative logit error over {} positions {err:.2e}", shape.name(), ids.len());
            let tol = if *format == GgufFormat::F16 { 5e-3 } else { 6e-2 };
            assert!(err < tol, "{} {format:?}: {err:.2e} >= {tol:e}", shape.name());
        }
    }
}

/// The same refusal from GGUF metadata: a Phi-3 file whose `phi3.attention.sliding_window`
/// is below its context (convert_hf_to_gguf writes 0 for none, as the fixture does).
#[test]
fn a_phi3_gguf_with_a_sliding_window_inside_its_context_is_refused() {
    use engram_gguf::{Gguf, GgufWriter, Value as Meta};
    let (_, src) = files(Shape::TinyPhi3).quantized.iter().find(|(f, _)| *f == GgufFormat::F16).unwrap();
    let bytes = std::fs::read(src).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert!(g.metadata.iter().any(|(k, v)| k == "phi3.attention.sliding_window" && *v == Meta::U32(0)));
    let mut w = GgufWriter::new();
    for (k, v) in &g.metadata {
        match k.as_str() {
            "general.alignment" => {}
            "phi3.attention.sliding_window" => w.add(k, Meta::U32(512)),
            _ => w.add(k, v.clone()),
        }
    }
    for t in &g.tensors {
        let start = (g.data_offset + t.offset) as usize;
        w.add_tensor(&t.name, &t.dims, t.ggml_type, bytes[start..start + t.n_bytes as usize].to_vec()).unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("swa.gguf");
    w.write_file(&path).unwrap();
    let e = Model::load(&path).err().expect("loaded a sliding-window Phi-3").to_string();
    assert!(e.contains("phi3.attention.sliding_window") && e.contains("512 tokens") && e.contains("swa.gguf"), "{e}");
}
