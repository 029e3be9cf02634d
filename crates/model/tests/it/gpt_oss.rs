//! GPT-OSS beyond the parity check in `arch_golden.rs`: each of its departures from the
//! Llama block (the window, the sinks, the clamped SwiGLU, top-k-then-softmax routing, YaRN)
//! changes the answer far beyond the parity tolerance, so the parity check would catch any
//! one dropped; prefill in chunks and batching agree with one shot (the sinks join after the
//! last chunk); the fixture's F16, Q8_0 and MXFP4-expert files track the f32 folder; and what
//! GGUF or the forward pass cannot carry is refused by name.

use crate::arch_golden::{files, golden, models};
use crate::chunking::assert_chunking_and_batching_agree;
use crate::common::*;
use crate::golden::{f32s, u32s, LOGIT_TOL};
use engram_fixture::{GgufFormat, Shape};
use engram_kernels::DType;
use engram_model::{Arch, FeedForward, FfnActivation, LayerAttention, Model, ModelConfig};
use engram_tokenizer::ChatMessage;
use serde_json::Value;

#[test]
fn gpt_oss_reads_its_shape_from_both_files() {
    for (how, m) in models(Shape::TinyGptOss) {
        let c = &m.config;
        let moe = c.moe.expect("a mixture");
        assert_eq!((c.arch, c.num_layers, moe.experts, moe.top_k, moe.expert_ffn), (Arch::GptOss, 4, 8, 4, 64), "{how}");
        assert_eq!(c.layers, [LayerAttention::Sliding { window: 16 }, LayerAttention::Global].repeat(2), "{how}: alternating");
        assert_eq!((c.ffn_act, c.qkv_bias, c.tied_embeddings), (FfnActivation::SwigluOai, true, false), "{how}");
        assert!((c.rope_attn_factor - (1.0 + 0.1 * 32f32.ln())).abs() < 1e-6, "{how}: YaRN's attention factor");
        let l = &m.weights.layers[0];
        assert!(l.sinks.as_ref().is_some_and(|s| s.len() == 4) && l.o_bias.is_some(), "{how}: sinks and o bias");
        let FeedForward::Moe(mix) = &l.ffn else { panic!("{how}: layer 0 is not a mixture") };
        assert!(mix.router_bias.is_some() && mix.experts.iter().all(|e| e.bias.is_some()), "{how}: router and expert biases");
    }
}

/// Without any one of its departures the last-position logits are far from transformers'.
#[test]
fn gpt_oss_without_its_window_sinks_clamp_routing_or_yarn_is_another_model() {
    let g = golden(Shape::TinyGptOss);
    let ids = u32s(&g["prompt_ids"]);
    let want = f32s(&g["last_logits"]);
    let [(_, mut model), _] = models(Shape::TinyGptOss);
    let vocab = model.config.vocab;
    let err = |m: &Model| rel_err(&all_logits(m, &ids)[(ids.len() - 1) * vocab..], &want);
    assert!(err(&model) < LOGIT_TOL);
    let c = model.config.clone();
    type Edit = fn(&mut ModelConfig);
    let edits: [(&str, Edit); 4] = [
        ("every layer global", |c| c.layers = vec![LayerAttention::Global; c.num_layers]),
        ("plain SwiGLU", |c| c.ffn_act = FfnActivation::Silu),
        ("softmax before top-k", |c| c.moe.as_mut().unwrap().gating = engram_model::MoeGating::SoftmaxThenTopK),
        ("plain RoPE", |c| {
            c.rope.inv_freq = engram_model::RopeConfig::base_inv_freq(c.rope.theta, c.rope.rotary_dim());
            c.rope_attn_factor = 1.0;
        }),
    ];
    for (what, edit) in edits {
        model.config = c.clone();
        edit(&mut model.config);
        let e = err(&model);
        eprintln!("tiny-gpt-oss: {what}: last-position error {e:.2e}");
        assert!(e > 100.0 * LOGIT_TOL, "{what} changes nothing ({e:e})");
    }
    model.config = c;
    let sinks: Vec<_> = model.weights.layers.iter_mut().map(|l| l.sinks.take()).collect();
    let e = err(&model);
    eprintln!("tiny-gpt-oss: no sinks: last-position error {e:.2e}");
    assert!(e > 100.0 * LOGIT_TOL, "the sinks change nothing ({e:e})");
    for (l, s) in model.weights.layers.iter_mut().zip(sinks) {
        l.sinks = s;
    }
}

/// The sink joins each row's softmax once, after every chunk: one chunk, several, token by
/// token and batched with another sequence give the same logits (the window crossed many times).
#[test]
fn gpt_oss_prefill_in_chunks_and_batched_agrees_with_one_shot() {
    let [(_, model), _] = models(Shape::TinyGptOss);
    let ids = model.tokenizer.encode(&PROMPT.repeat(2), true).unwrap().ids;
    assert!(ids.len() > 4 * 16);
    assert_chunking_and_batching_agree(&model, &ids, &[1, 7, 16], "Another prompt, routed to other experts.");
}

/// Per-position relative errors of `got` against `want` (`vocab` logits per position), sorted.
fn position_errors(got: &[f32], want: &[f32], vocab: usize) -> Vec<f32> {
    let mut e: Vec<f32> = got.chunks_exact(vocab).zip(want.chunks_exact(vocab)).map(|(a, b)| rel_err(a, b)).collect();
    e.sort_by(f32::total_cmp);
    e
}

/// The fixture's own files. F16 tracks the f32 folder to f16's rounding at the median
/// position; the largest errors are the few positions where rounding flips an expert near a
/// router tie (routing is discrete), so the argmax may differ there. Q8_0 against its own
/// weights expanded to f32 (8-bit activations are all that separate them). MXFP4 experts
/// (ggml type 39, as llama.cpp's gpt-oss files) beside F16 attention: every expert matrix is
/// bit for bit the folder's rounded through MXFP4 (so the 3-D tensors are split as written),
/// and the logits track that rounding's f32 expansion.
#[test]
fn gpt_oss_f16_q8_0_and_mxfp4_expert_files_track_the_f32_folder() {
    let g = golden(Shape::TinyGptOss);
    let ids = u32s(&g["prompt_ids"]);
    let folder = Model::load(&files(Shape::TinyGptOss).hf).unwrap();
    let vocab = folder.config.vocab;
    let reference = all_logits(&folder, &ids);
    let quantized = &files(Shape::TinyGptOss).quantized;
    assert_eq!(quantized.iter().map(|(f, _)| *f).collect::<Vec<_>>(), [GgufFormat::F16, GgufFormat::Q8_0, GgufFormat::Mxfp4Moe]);
    for (format, path) in quantized {
        let m = Model::load(path).unwrap();
        let got = all_logits(&m, &ids);
        if *format == GgufFormat::F16 {
            let e = position_errors(&got, &reference, vocab);
            let agree = (0..ids.len()).filter(|&p| argmax(&got[p * vocab..][..vocab]) == argmax(&reference[p * vocab..][..vocab])).count();
            eprintln!(
                "tiny-gpt-oss F16 vs the f32 folder: median {:.2e}, max {:.2e}, argmax {agree} / {}",
                e[e.len() / 2],
                e[e.len() - 1],
                ids.len()
            );
            assert!(e[e.len() / 2] < 5e-3 && agree + 6 >= ids.len(), "F16: median {:.2e}, argmax {agree}", e[e.len() / 2]);
            continue;
        }
        if *format == GgufFormat::Mxfp4Moe {
            assert_eq!(m.weights.layers[0].q.dtype, DType::F16);
            for (lq, lf) in m.weights.layers.iter().zip(&folder.weights.layers) {
                let (FeedForward::Moe(q), FeedForward::Moe(f)) = (&lq.ffn, &lf.ffn) else { panic!("not a mixture") };
                for (eq, ef) in q.experts.iter().zip(&f.experts) {
                    for (wq, wf) in [(&eq.gate, &ef.gate), (&eq.up, &ef.up), (&eq.down, &ef.down)] {
                        assert_eq!(wq.dtype, DType::MXFP4);
                        let bytes = engram_kernels::quantize(DType::MXFP4, &wf.to_f32(), wf.cols).unwrap();
                        let mut rounded = vec![0.0f32; wf.rows * wf.cols];
                        for (row, out) in bytes.chunks_exact(bytes.len() / wf.rows).zip(rounded.chunks_exact_mut(wf.cols)) {
                            engram_kernels::dequantize_row(DType::MXFP4, row, out);
                        }
                        assert_eq!(wq.to_f32(), rounded, "an MXFP4 expert matrix is not the folder's, rounded");
                    }
                }
            }
        }
        let expanded = all_logits(&expanded_to_f32(Model::load(path).unwrap()), &ids);
        let e = position_errors(&got, &expanded, vocab);
        eprintln!("tiny-gpt-oss {format:?} vs its f32 expansion: median {:.2e}, max {:.2e}", e[e.len() / 2], e[e.len() - 1]);
        assert!(e[e.len() / 2] < 6e-2, "{format:?}: median {:.2e}", e[e.len() / 2]);
    }
}

/// The harmony template renders as `apply_chat_template` did when the golden was made, from
/// both loaders, with and without the generation prompt and with `reasoning_effort`: all but
/// the date, which the template takes from the clock (`strftime_now`), so each side's own
/// "Current date:" is compared as a date and then set to the golden's.
#[test]
fn gpt_oss_harmony_template_renders_like_transformers() {
    let g = golden(Shape::TinyGptOss);
    let msgs: Vec<ChatMessage> = g["chat_messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect();
    let date_of = |s: &str| -> String {
        let at = s.find("Current date: ").expect("a date line") + "Current date: ".len();
        s[at..at + 10].to_string()
    };
    for (how, model) in models(Shape::TinyGptOss) {
        let tk = &model.tokenizer;
        let template = tk.chat_template().expect("a chat template");
        for case in g["chat"].as_array().unwrap() {
            let add = case["add_generation_prompt"].as_bool().unwrap();
            let extra = case["kwargs"].as_object().unwrap();
            let want = case["rendered"].as_str().unwrap();
            let ours = template.render_with(&msgs, add, tk.bos_token().unwrap_or(""), tk.eos_token().unwrap_or(""), extra).unwrap();
            let today = date_of(&ours);
            assert!(today.len() == 10 && today.as_bytes()[4] == b'-' && today.as_bytes()[7] == b'-', "{how}: date {today:?}");
            let ours = ours.replacen(&format!("Current date: {today}"), &format!("Current date: {}", date_of(want)), 1);
            assert_eq!(ours, want, "{how}: harmony (add_generation_prompt={add}, {extra:?}) renders differently from transformers");
        }
    }
}

/// What neither GGUF nor the forward pass carries is refused by name.
#[test]
fn what_gpt_oss_does_not_implement_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    type Edit = fn(&mut Value);
    let edits: [(&str, Edit, &str); 3] = [
        ("limit", |c| c["swiglu_limit"] = 5.0.into(), "swiglu_limit"),
        ("mscale", |c| c["rope_parameters"]["mscale"] = 1.0.into(), "mscale"),
        ("act", |c| c["hidden_act"] = "gelu".into(), "hidden_act"),
    ];
    for (name, edit, want) in edits {
        let out = dir.path().join(name);
        std::fs::create_dir_all(&out).unwrap();
        for f in std::fs::read_dir(&files(Shape::TinyGptOss).hf).unwrap() {
            let f = f.unwrap().path();
            std::fs::copy(&f, out.join(f.file_name().unwrap())).unwrap();
        }
        let mut c: Value = serde_json::from_slice(&std::fs::read(out.join("config.json")).unwrap()).unwrap();
        edit(&mut c);
        std::fs::write(out.join("config.json"), c.to_string()).unwrap();
        let e = Model::load(&out).err().expect("refused").to_string();
        assert!(e.contains(want), "{name}: {e}");
    }
}

/// ggml MXFP4 rows (`rows` of `cols`) in transformers' checkpoint layout: per block the
/// exponent into `scales`, the 16 code bytes re-paired (element `2k` low, `2k + 1` high).
fn mxfp4_to_hf(ggml: &[u8], blocks: &mut Vec<u8>, scales: &mut Vec<u8>) {
    for b in ggml.chunks_exact(17) {
        scales.push(b[0]);
        let code = |i: usize| if i < 16 { b[1 + i] & 15 } else { b[1 + i - 16] >> 4 };
        blocks.extend((0..16).map(|k| code(2 * k) | (code(2 * k + 1) << 4)));
    }
}

/// gpt-oss's own checkpoints ship their experts as MXFP4 (`*_blocks`, `*_scales`, u8): the
/// folder's experts rewritten that way load 4-bit, each matrix bit for bit the one the
/// fixture's MXFP4 GGUF holds (llama.cpp's repacking), and the model runs; `engram convert`
/// writes them into GGUF as MXFP4 too, the same model.
#[test]
fn a_gpt_oss_folder_with_mxfp4_experts_loads_them_as_its_gguf_does() {
    use safetensors::{tensor::TensorView, Dtype, SafeTensors};
    let src = &files(Shape::TinyGptOss).hf;
    let dir = tempfile::tempdir().unwrap();
    for f in std::fs::read_dir(src).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, dir.path().join(f.file_name().unwrap())).unwrap();
    }
    let mut c: Value = serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
    c["quantization_config"] = serde_json::json!({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]});
    std::fs::write(dir.path().join("config.json"), c.to_string()).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut out: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        let (e, rows, cols) = match (name.rsplit('.').next(), view.shape()) {
            (Some("gate_up_proj"), &[e, h, two_f]) => (e, two_f, h),
            (Some("down_proj"), &[e, f, h]) => (e, h, f),
            _ => {
                out.push((name.clone(), view.dtype(), view.shape().to_vec(), view.data().to_vec()));
                continue;
            }
        };
        let v: Vec<f32> = view.data().chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let (mut blocks, mut scales) = (Vec::new(), Vec::new());
        for x in 0..e {
            // Stored for `x @ W` (`[in, out]`): the `[out, in]` rows, quantized as llama.cpp's MXFP4.
            let w = &v[x * rows * cols..(x + 1) * rows * cols];
            let t: Vec<f32> = (0..rows).flat_map(|r| (0..cols).map(move |c| w[c * rows + r])).collect();
            mxfp4_to_hf(&engram_kernels::quantize(DType::MXFP4, &t, cols).unwrap(), &mut blocks, &mut scales);
        }
        out.push((format!("{name}_blocks"), Dtype::U8, vec![e, rows, cols / 32, 16], blocks));
        out.push((format!("{name}_scales"), Dtype::U8, vec![e, rows, cols / 32], scales));
    }
    let views: Vec<(String, TensorView<'_>)> =
        out.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
    std::fs::write(dir.path().join("model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();

    let packed = Model::load(dir.path()).unwrap();
    let (_, gguf) = files(Shape::TinyGptOss).quantized.iter().find(|(f, _)| *f == GgufFormat::Mxfp4Moe).unwrap();
    let gguf = Model::load(gguf).unwrap();
    for (lp, lg) in packed.weights.layers.iter().zip(&gguf.weights.layers) {
        let (FeedForward::Moe(p), FeedForward::Moe(g)) = (&lp.ffn, &lg.ffn) else { panic!("not a mixture") };
        for (ep, eg) in p.experts.iter().zip(&g.experts) {
            for (wp, wg) in [(&ep.gate, &eg.gate), (&ep.up, &eg.up), (&ep.down, &eg.down)] {
                assert_eq!((wp.dtype, wp.rows, wp.cols), (DType::MXFP4, wg.rows, wg.cols));
                assert_eq!(wp.matrix().data, wg.matrix().data, "an expert's MXFP4 bytes differ from the GGUF's");
            }
            assert_eq!(ep.bias.as_ref().unwrap().gate, eg.bias.as_ref().unwrap().gate);
        }
    }
    let ids = packed.tokenizer.encode(PROMPT, true).unwrap().ids;
    let logits = all_logits(&packed, &ids);
    let expanded = all_logits(&expanded_to_f32(Model::load(dir.path()).unwrap()), &ids);
    let e = position_errors(&logits, &expanded, packed.config.vocab);
    assert!(e[e.len() / 2] < 6e-2, "MXFP4 experts against their f32 expansion: median {:.2e}", e[e.len() / 2]);

    let out = dir.path().join("converted.gguf");
    engram_fixture::convert_hf(dir.path(), &out, GgufFormat::F32, &mut |_| {}).unwrap();
    let converted = Model::load(&out).unwrap();
    let FeedForward::Moe(mix) = &converted.weights.layers[3].ffn else { panic!("not a mixture") };
    let FeedForward::Moe(want) = &gguf.weights.layers[3].ffn else { panic!("not a mixture") };
    assert!(mix
        .experts
        .iter()
        .zip(&want.experts)
        .all(|(a, b)| a.down.dtype == DType::MXFP4 && a.down.matrix().data == b.down.matrix().data));
    let err = rel_err(&all_logits(&converted, &ids), &logits);
    assert!(err < 1e-6, "the converted file against the folder it came from: {err:.2e}");
}
