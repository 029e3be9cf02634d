//! Hugging Face folders: `config.json`, `tokenizer.json` (+ config and chat
//! template files, read by `engram-tokenizer`), and `model.safetensors` or a
//! sharded `model.safetensors.index.json`. Tensors are memory-mapped and
//! used in their stored dtype (f32, f16, bf16).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use engram_kernels::DType;
use memmap2::Mmap;
use safetensors::SafeTensors;
use serde_json::Value as Json;

use super::Loaded;
use crate::config::{Arch, FfnActivation, LayerAttention, Llama3Scaling, ModelConfig, MoeConfig, MoeGating, NoRope, RopeConfig, RopeStyle};
use crate::error::{config_err, tensor_err, ModelError, Result};
use crate::rope::YarnScaling;
use crate::weights::{FeedForward, GatedMlp, LayerWeights, MlpBias, ModelWeights, MoeWeights, Storage, Weight, WeightCtor};

/// Loads a Hugging Face model folder.
pub fn load_hf(dir: &Path) -> Result<Loaded> {
    let config_path = dir.join("config.json");
    let config_text = read(&config_path)?;
    let file = config_path.display().to_string();
    let json: Json = serde_json::from_str(&config_text).map_err(|e| config_err(&file, "(json)", e.to_string()))?;
    let mut config = parse_config(&json, &file)?;
    let tokenizer = engram_tokenizer::Tokenizer::from_hf_dir(dir)?;
    let tensors = TensorSet::open(dir)?;
    let weights = build_weights(&config, &tensors)?;
    // transformers multiplies the embeddings by the scale cast to their dtype.
    config.embed_scale = match weights.embed.dtype {
        DType::BF16 => half::bf16::from_f32(config.embed_scale).to_f32(),
        DType::F16 => half::f16::from_f32(config.embed_scale).to_f32(),
        _ => config.embed_scale,
    };
    let mut identity = config_text.into_bytes();
    identity.extend_from_slice(&tensors.identity);
    Ok(Loaded { config, weights, tokenizer, source: format!("hf:{}", dir.display()), identity })
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })
}

fn get_usize(j: &Json, file: &str, key: &str) -> Result<Option<usize>> {
    match j.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => {
            v.as_u64().map(|x| Some(x as usize)).ok_or_else(|| config_err(file, key, format!("expected a non-negative integer, found {v}")))
        }
    }
}

fn req_usize(j: &Json, file: &str, key: &str) -> Result<usize> {
    get_usize(j, file, key)?.ok_or_else(|| config_err(file, key, "missing"))
}

fn get_f32(j: &Json, file: &str, key: &str) -> Result<Option<f32>> {
    match j.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => v.as_f64().map(|x| Some(x as f32)).ok_or_else(|| config_err(file, key, format!("expected a number, found {v}"))),
    }
}

/// Parses `config.json` (`file` names it in errors).
pub fn parse_config(j: &Json, file: &str) -> Result<ModelConfig> {
    let model_type = j.get("model_type").and_then(|v| v.as_str()).unwrap_or("llama");
    let arch =
        Arch::parse(model_type).ok_or_else(|| ModelError::UnsupportedArch { file: file.to_string(), arch: model_type.to_string() })?;
    if model_type == "gemma3" {
        // Gemma3ForConditionalGeneration: the text model sits under `text_config` beside a vision tower.
        return Err(config_err(
            file,
            "model_type",
            "\"gemma3\" is the multimodal Gemma 3 (Gemma3ForConditionalGeneration), which is not supported; the text-only checkpoints (\"gemma3_text\", Gemma3ForCausalLM) are",
        ));
    }
    let hidden = req_usize(j, file, "hidden_size")?;
    let num_heads = req_usize(j, file, "num_attention_heads")?;
    let num_kv_heads = get_usize(j, file, "num_key_value_heads")?.unwrap_or(num_heads);
    let head_dim = match get_usize(j, file, "head_dim")? {
        Some(h) => h,
        None if num_heads > 0 => hidden / num_heads,
        None => 0,
    };
    let mut max_positions = get_usize(j, file, "max_position_embeddings")?.unwrap_or(4096);
    // transformers 5 writes `rope_theta`, `partial_rotary_factor` and the scaling into
    // `rope_parameters`; older files keep them at the top level and in `rope_scaling`.
    // Gemma 3 keeps one set per layer kind: `full_attention` (global layers) and
    // `sliding_attention`; older Gemma 3 files say `rope_local_base_freq` for the latter.
    let rope_by_kind = j.get("rope_parameters").filter(|v| v.get("full_attention").is_some_and(|f| f.is_object()));
    let rope_params = match rope_by_kind {
        Some(r) => r.get("full_attention"),
        None => j.get("rope_parameters").filter(|v| v.is_object()),
    };
    let theta = match (get_f32(j, file, "rope_theta")?, rope_params) {
        (Some(t), _) => t,
        (None, Some(r)) => get_f32(r, file, "rope_theta")?.unwrap_or(10000.0),
        (None, None) => 10000.0,
    };
    let partial = match (get_f32(j, file, "partial_rotary_factor")?, rope_params) {
        (Some(p), _) => p,
        (None, Some(r)) => get_f32(r, file, "partial_rotary_factor")?.unwrap_or(1.0),
        (None, None) => 1.0,
    };
    if !(partial > 0.0 && partial <= 1.0) {
        return Err(config_err(file, "partial_rotary_factor", format!("{partial} is not in (0, 1]")));
    }
    // transformers: `int(head_dim * partial_rotary_factor)`.
    let rotary_dim = (head_dim as f64 * partial as f64) as usize;
    let mut inv_freq = RopeConfig::base_inv_freq(theta, rotary_dim);
    let mut scaling = "none".to_string();
    let mut rope_attn_factor = 1.0;
    if let Some(rs) = j.get("rope_scaling").filter(|v| v.is_object()).or(rope_params) {
        let kind = rs.get("rope_type").or_else(|| rs.get("type")).and_then(|v| v.as_str()).unwrap_or("");
        let factor = get_f32(rs, file, "factor")?.unwrap_or(1.0);
        match kind {
            "llama3" => {
                let s = Llama3Scaling {
                    factor,
                    low_freq_factor: get_f32(rs, file, "low_freq_factor")?.unwrap_or(1.0),
                    high_freq_factor: get_f32(rs, file, "high_freq_factor")?.unwrap_or(4.0),
                    original_max_position: get_f32(rs, file, "original_max_position_embeddings")?.unwrap_or(8192.0),
                };
                RopeConfig::apply_llama3(&mut inv_freq, s);
                scaling = format!("llama3:{s:?}");
            }
            "linear" => {
                inv_freq.iter_mut().for_each(|f| *f /= factor);
                scaling = format!("linear:{factor}");
            }
            // NOTE: LongRoPE runs with its short factors only, which is what transformers
            // computes for sequences within the original context; the context is capped there,
            // so no position ever needs the long factors (transformers switches every position
            // to them past it, which a cache of rotated keys cannot follow).
            "longrope" | "su" => {
                let original = match get_usize(rs, file, "original_max_position_embeddings")? {
                    Some(o) => o,
                    None => req_usize(j, file, "original_max_position_embeddings")?,
                };
                let short = rs
                    .get("short_factor")
                    .and_then(|v| v.as_array())
                    .ok_or_else(|| config_err(file, "rope_scaling.short_factor", "missing (LongRoPE needs it)"))?;
                let short: Vec<f32> = short
                    .iter()
                    .map(|x| {
                        x.as_f64()
                            .map(|x| x as f32)
                            .ok_or_else(|| config_err(file, "rope_scaling.short_factor", format!("{x} is not a number")))
                    })
                    .collect::<Result<_>>()?;
                if short.len() != inv_freq.len() {
                    return Err(config_err(
                        file,
                        "rope_scaling.short_factor",
                        format!("{} factors, the {rotary_dim} rotated dimensions need {}", short.len(), inv_freq.len()),
                    ));
                }
                if original == 0 {
                    return Err(config_err(file, "original_max_position_embeddings", "must be greater than zero"));
                }
                RopeConfig::apply_longrope(&mut inv_freq, theta, rotary_dim, &short);
                // transformers: an explicit `attention_factor`, else one from `factor`, else
                // from max / original positions.
                rope_attn_factor = match get_f32(rs, file, "attention_factor")? {
                    Some(a) => a,
                    None => match get_f32(rs, file, "factor")? {
                        Some(f) if f <= 1.0 => 1.0,
                        Some(f) => (1.0 + (f as f64).ln() / (original as f64).ln()).sqrt() as f32,
                        None => RopeConfig::longrope_attn_factor(max_positions, original),
                    },
                };
                max_positions = max_positions.min(original);
                scaling = format!("longrope:short,attn_factor={rope_attn_factor},context={original}");
            }
            // GPT-OSS's YaRN (transformers' `_compute_yarn_parameters`): an explicit
            // `attention_factor`, else `0.1 ln(factor) + 1`; `mscale` variants are refused.
            "yarn" if arch == Arch::GptOss => {
                for key in ["mscale", "mscale_all_dim"] {
                    if rs.get(key).is_some_and(|v| !v.is_null()) {
                        return Err(config_err(file, &format!("rope_scaling.{key}"), "YaRN with mscale is not supported"));
                    }
                }
                let original = match get_f32(rs, file, "original_max_position_embeddings")? {
                    Some(o) => o,
                    None => req_usize(j, file, "original_max_position_embeddings")? as f32,
                };
                let y = YarnScaling {
                    factor: get_f32(rs, file, "factor")?
                        .ok_or_else(|| config_err(file, "rope_scaling.factor", "missing (YaRN needs it)"))?,
                    original_max_positions: original,
                    beta_fast: get_f32(rs, file, "beta_fast")?.unwrap_or(32.0),
                    beta_slow: get_f32(rs, file, "beta_slow")?.unwrap_or(1.0),
                    truncate: rs.get("truncate").and_then(|v| v.as_bool()).unwrap_or(true),
                };
                if !(y.factor > 0.0 && y.original_max_positions > 0.0 && y.beta_fast > 0.0 && y.beta_slow > 0.0) {
                    return Err(config_err(file, "rope_scaling", format!("YaRN parameters must be positive: {y:?}")));
                }
                inv_freq = y.inv_freq(theta, rotary_dim);
                rope_attn_factor = get_f32(rs, file, "attention_factor")?.unwrap_or(y.attention_factor());
                scaling = format!("yarn:{y:?},attn_factor={rope_attn_factor}");
            }
            "default" | "" => {}
            other => {
                return Err(config_err(
                    file,
                    "rope_scaling.rope_type",
                    format!("\"{other}\" is not supported (llama3, linear, longrope; yarn for gpt_oss)"),
                ))
            }
        }
    }
    let attention_bias = j.get("attention_bias").and_then(|v| v.as_bool()).unwrap_or(false);
    if attention_bias && matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Phi3) {
        // Both put a bias on o_proj too, which the forward pass does not have.
        return Err(config_err(file, "attention_bias", format!("attention biases are not supported for {}", arch.name())));
    }
    let sliding = get_usize(j, file, "sliding_window")?;
    let num_layers = req_usize(j, file, "num_hidden_layers")?;
    let mut layers = vec![LayerAttention::Global; num_layers];
    match arch {
        Arch::Qwen3 | Arch::Qwen3Moe | Arch::SmolLm3 if j.get("use_sliding_window").and_then(|v| v.as_bool()).unwrap_or(false) => {
            return Err(config_err(file, "use_sliding_window", format!("sliding-window attention is not supported for {}", arch.name())));
        }
        // transformers' Phi-3 applies `sliding_window` whenever it is set.
        Arch::Phi3 if sliding.is_some_and(|w| w < max_positions) => {
            return Err(config_err(
                file,
                "sliding_window",
                format!(
                    "sliding-window attention ({} tokens, below the {max_positions}-token context) is not supported",
                    sliding.unwrap_or(0)
                ),
            ));
        }
        // transformers' Mistral applies `sliding_window` to every layer whenever it is set; a
        // window as long as the context changes nothing, so it stays global.
        Arch::Mistral | Arch::Mixtral => {
            if let Some(w) = sliding.filter(|&w| w < max_positions) {
                layers = vec![LayerAttention::Sliding { window: w }; num_layers];
            }
        }
        // Gemma 3: five local layers to one global; Gemma 2: alternating, local first.
        Arch::Gemma3 => layers = gemma_layers(j, file, num_layers, sliding, 6)?,
        Arch::Gemma2 => layers = gemma_layers(j, file, num_layers, sliding.or(Some(4096)), 2)?,
        // GPT-OSS: `layer_types`, by default alternating with layer 0 sliding (GptOssConfig).
        Arch::GptOss => layers = gemma_layers(j, file, num_layers, sliding.or(Some(128)), 2)?,
        _ => {}
    }
    let gemma = arch.is_gemma();
    let mut rope_local = None;
    let (mut attn_softcap, mut final_softcap) = (None, None);
    if arch == Arch::Gemma3 {
        for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
            if let Some(v) = get_f32(j, file, key)? {
                return Err(config_err(file, key, format!("softcapping ({v}) is not supported for gemma3")));
            }
        }
    }
    if arch == Arch::Gemma2 {
        // Gemma2Config's defaults (50, 30) where the file is silent; `null` turns one off.
        let cap = |key: &str, default: f32| -> Result<Option<f32>> {
            match j.get(key) {
                None => Ok(Some(default)),
                Some(_) => get_f32(j, file, key),
            }
        };
        attn_softcap = cap("attn_logit_softcapping", 50.0)?;
        final_softcap = cap("final_logit_softcapping", 30.0)?;
    }
    if gemma {
        let act = j.get("hidden_activation").or_else(|| j.get("hidden_act")).and_then(|v| v.as_str()).unwrap_or("gelu_pytorch_tanh");
        if !matches!(act, "gelu_pytorch_tanh" | "gelu_tanh") {
            return Err(config_err(file, "hidden_activation", format!("\"{act}\" is not supported (gelu_pytorch_tanh)")));
        }
        if attention_bias {
            return Err(config_err(file, "attention_bias", format!("attention biases are not supported for {}", arch.name())));
        }
        // The sliding layers' RoPE: plain, at their own base.
        let local = rope_by_kind.and_then(|r| r.get("sliding_attention")).filter(|v| v.is_object());
        let local_base = get_f32(j, file, "rope_local_base_freq")?;
        if let Some(kind) = local.and_then(|l| l.get("rope_type")).and_then(|v| v.as_str()) {
            if kind != "default" {
                return Err(config_err(
                    file,
                    "rope_parameters.sliding_attention.rope_type",
                    format!("\"{kind}\" is not supported (default)"),
                ));
            }
        }
        let local_theta = match local {
            Some(l) => get_f32(l, file, "rope_theta")?,
            None => local_base,
        };
        // Gemma 3 defaults its local base to 10000; Gemma 2 has one RoPE for every layer.
        let local_theta = if arch == Arch::Gemma3 { Some(local_theta.unwrap_or(10000.0)) } else { local_theta };
        rope_local = local_theta.map(|t| RopeConfig {
            theta: t,
            style: RopeStyle::Neox,
            inv_freq: RopeConfig::base_inv_freq(t, rotary_dim),
            scaling: "none".into(),
        });
    }
    let attn_scale = match get_f32(j, file, "query_pre_attn_scalar")? {
        // transformers: `query_pre_attn_scalar ** -0.5` in Python floats (Gemma 2's default 256).
        Some(s) if gemma => (s as f64).powf(-0.5) as f32,
        None if arch == Arch::Gemma2 => 1.0 / 16.0,
        _ => 1.0 / (head_dim as f32).sqrt(),
    };
    let rope = RopeConfig { theta, style: RopeStyle::Neox, inv_freq, scaling };
    let no_rope = match arch {
        Arch::SmolLm3 => Some(NoRope::new(smollm3_no_rope(j, file, num_layers)?, &rope)),
        _ => None,
    };
    if arch == Arch::GptOss {
        // llama.cpp's `swiglu_oai` fixes both constants; another value is another model.
        for (key, want) in [("swiglu_limit", 7.0f32), ("swiglu_alpha", 1.702)] {
            if let Some(v) = get_f32(j, file, key)?.filter(|&v| v != want) {
                return Err(config_err(file, key, format!("{v} is not supported (only {want})")));
            }
        }
        let act = j.get("hidden_act").and_then(|v| v.as_str()).unwrap_or("silu");
        if act != "silu" {
            return Err(config_err(file, "hidden_act", format!("\"{act}\" is not supported for gpt_oss (silu)")));
        }
    }
    let config = ModelConfig {
        arch,
        hidden,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        ffn: req_usize(j, file, "intermediate_size")?,
        vocab: req_usize(j, file, "vocab_size")?,
        rms_eps: get_f32(j, file, "rms_norm_eps")?.unwrap_or(if arch == Arch::GptOss { 1e-5 } else { 1e-6 }),
        rope,
        max_positions,
        qkv_bias: arch == Arch::Qwen2 || attention_bias,
        qk_norm: matches!(arch, Arch::Qwen3 | Arch::Qwen3Moe | Arch::Gemma3),
        rope_attn_factor,
        // Gemma ties its embeddings unless told otherwise (Gemma3TextConfig's default).
        tied_embeddings: j.get("tie_word_embeddings").and_then(|v| v.as_bool()).unwrap_or(gemma),
        layers,
        rope_local,
        sandwich_norms: gemma,
        // transformers: `hidden_size ** 0.5` as an f32 tensor (rounded to the embedding's
        // dtype at load, `load_hf`).
        embed_scale: if gemma { (hidden as f64).sqrt() as f32 } else { 1.0 },
        ffn_act: match arch {
            _ if gemma => FfnActivation::GeluTanh,
            Arch::GptOss => FfnActivation::SwigluOai,
            _ => FfnActivation::Silu,
        },
        attn_scale,
        attn_softcap,
        final_softcap,
        no_rope,
        moe: match arch {
            Arch::Qwen3Moe => Some(qwen3_moe(j, file, num_layers)?),
            // Mixtral's experts are `intermediate_size` wide and always renormalized.
            Arch::Mixtral => Some(MoeConfig {
                experts: req_usize(j, file, "num_local_experts")?,
                top_k: req_usize(j, file, "num_experts_per_tok")?,
                expert_ffn: req_usize(j, file, "intermediate_size")?,
                norm_top_k: true,
                gating: MoeGating::SoftmaxThenTopK,
            }),
            // GPT-OSS: `num_local_experts` of `intermediate_size`, top-k on the logits first.
            Arch::GptOss => Some(MoeConfig {
                experts: req_usize(j, file, "num_local_experts")?,
                top_k: match get_usize(j, file, "num_experts_per_tok")? {
                    Some(k) => k,
                    None => req_usize(j, file, "experts_per_token")?,
                },
                expert_ffn: req_usize(j, file, "intermediate_size")?,
                norm_top_k: false,
                gating: MoeGating::TopKThenSoftmax,
            }),
            _ => None,
        },
    };
    config.validate(file)?;
    Ok(config)
}

/// Qwen3-MoE's experts (`num_experts`, written `num_local_experts` by transformers 5), with
/// every layer sparse: `decoder_sparse_step` other than 1 or a non-empty `mlp_only_layers`
/// (dense layers between the sparse ones) is refused by name.
fn qwen3_moe(j: &Json, file: &str, num_layers: usize) -> Result<MoeConfig> {
    let experts = match get_usize(j, file, "num_experts")? {
        Some(n) => n,
        None => req_usize(j, file, "num_local_experts")?,
    };
    if get_usize(j, file, "decoder_sparse_step")?.is_some_and(|s| s != 1 && s <= num_layers) {
        return Err(config_err(file, "decoder_sparse_step", "dense layers between sparse ones are not supported (only 1)"));
    }
    if j.get("mlp_only_layers").and_then(|v| v.as_array()).is_some_and(|a| !a.is_empty()) {
        return Err(config_err(file, "mlp_only_layers", "dense layers between sparse ones are not supported (only [])"));
    }
    Ok(MoeConfig {
        experts,
        top_k: req_usize(j, file, "num_experts_per_tok")?,
        expert_ffn: req_usize(j, file, "moe_intermediate_size")?,
        norm_top_k: j.get("norm_topk_prob").and_then(|v| v.as_bool()).unwrap_or(false),
        gating: MoeGating::SoftmaxThenTopK,
    })
}

/// SmolLM3's NoPE layers (true: no RoPE): `no_rope_layers` where given (transformers: 1 uses
/// RoPE, 0 does not), else every `no_rope_layer_interval`-th layer (default 4: layer `i` skips
/// RoPE when `(i + 1) % 4 == 0`, as llama.cpp does for every SmolLM3 GGUF).
fn smollm3_no_rope(j: &Json, file: &str, num_layers: usize) -> Result<Vec<bool>> {
    if let Some(list) = j.get("no_rope_layers").filter(|v| !v.is_null()) {
        let list = list.as_array().ok_or_else(|| config_err(file, "no_rope_layers", "expected a list"))?;
        if list.len() != num_layers {
            return Err(config_err(file, "no_rope_layers", format!("{} entries for {num_layers} layers", list.len())));
        }
        return list
            .iter()
            .map(|v| match v.as_u64() {
                Some(1) => Ok(false),
                Some(0) => Ok(true),
                _ => Err(config_err(file, "no_rope_layers", format!("{v} is not 0 or 1"))),
            })
            .collect();
    }
    let every = get_usize(j, file, "no_rope_layer_interval")?.unwrap_or(4);
    if every == 0 {
        return Err(config_err(file, "no_rope_layer_interval", "must be greater than zero"));
    }
    Ok((0..num_layers).map(|i| (i + 1) % every == 0).collect())
}

/// Gemma's and GPT-OSS's layer kinds: `layer_types` where given, else every
/// `sliding_window_pattern`-th layer global (transformers: layer `i` slides unless
/// `(i + 1) % pattern == 0`; Gemma 3's default 6, Gemma 2's and GPT-OSS's fixed 2).
fn gemma_layers(j: &Json, file: &str, num_layers: usize, sliding: Option<usize>, default_pattern: usize) -> Result<Vec<LayerAttention>> {
    let window = sliding.ok_or_else(|| config_err(file, "sliding_window", "missing (layers of this model slide)"))?;
    let slide = LayerAttention::Sliding { window };
    if let Some(kinds) = j.get("layer_types").filter(|v| !v.is_null()) {
        let kinds = kinds.as_array().ok_or_else(|| config_err(file, "layer_types", "expected a list"))?;
        if kinds.len() != num_layers {
            return Err(config_err(file, "layer_types", format!("{} entries for {num_layers} layers", kinds.len())));
        }
        return kinds
            .iter()
            .map(|k| match k.as_str() {
                Some("sliding_attention") => Ok(slide),
                Some("full_attention") => Ok(LayerAttention::Global),
                _ => Err(config_err(file, "layer_types", format!("{k} is not supported (sliding_attention, full_attention)"))),
            })
            .collect();
    }
    let pattern = match get_usize(j, file, "sliding_window_pattern")? {
        Some(p) => p,
        None => get_usize(j, file, "_sliding_window_pattern")?.unwrap_or(default_pattern),
    };
    if pattern == 0 {
        return Err(config_err(file, "sliding_window_pattern", "must be greater than zero"));
    }
    Ok((0..num_layers).map(|i| if (i + 1) % pattern == 0 { LayerAttention::Global } else { slide }).collect())
}

/// A tensor of a safetensors file: file label, mapping, shape, byte range.
type Mapped = (String, Arc<Mmap>, Vec<usize>, std::ops::Range<usize>);

/// The union of the safetensors files of a folder, by tensor name.
struct TensorSet {
    /// name -> (file label, mapping, dtype, shape, byte range)
    tensors: HashMap<String, (String, Arc<Mmap>, DType, Vec<usize>, std::ops::Range<usize>)>,
    /// GPT-OSS's MXFP4 experts as its checkpoints ship them: the u8 `*_blocks` and `*_scales`.
    packed: HashMap<String, Mapped>,
    identity: Vec<u8>,
}

impl TensorSet {
    fn open(dir: &Path) -> Result<TensorSet> {
        let single = dir.join("model.safetensors");
        let index = dir.join("model.safetensors.index.json");
        let files: Vec<PathBuf> = if single.exists() {
            vec![single]
        } else if index.exists() {
            let text = read(&index)?;
            let file = index.display().to_string();
            let j: Json = serde_json::from_str(&text).map_err(|e| config_err(&file, "(json)", e.to_string()))?;
            let map = j.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| config_err(&file, "weight_map", "missing"))?;
            let mut names: Vec<String> = map.values().filter_map(|v| v.as_str().map(str::to_string)).collect();
            names.sort();
            names.dedup();
            for n in &names {
                if n.contains('/') || n.contains("..") {
                    return Err(config_err(&file, "weight_map", format!("shard name \"{n}\" leaves the folder")));
                }
            }
            names.into_iter().map(|n| dir.join(n)).collect()
        } else {
            return Err(ModelError::Io {
                path: single,
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "missing (nor is there model.safetensors.index.json)"),
            });
        };
        let mut set = TensorSet { tensors: HashMap::new(), packed: HashMap::new(), identity: Vec::new() };
        for path in files {
            let f = std::fs::File::open(&path).map_err(|source| ModelError::Io { path: path.clone(), source })?;
            // SAFETY: the mapping is read-only; a model file modified while mapped is the
            // user's error, exactly as for llama.cpp and candle.
            let map = Arc::new(unsafe { Mmap::map(&f) }.map_err(|source| ModelError::Io { path: path.clone(), source })?);
            let label = path.display().to_string();
            let st = SafeTensors::deserialize(&map).map_err(|e| tensor_err(&label, "(header)", e.to_string()))?;
            let base = map.as_ptr() as usize;
            let mut names: Vec<(String, safetensors::tensor::TensorView)> = st.tensors();
            names.sort_by(|a, b| a.0.cmp(&b.0));
            for (name, view) in names {
                let start = view.data().as_ptr() as usize - base;
                let range = start..start + view.data().len();
                if view.dtype() == safetensors::Dtype::U8 && (name.ends_with("_blocks") || name.ends_with("_scales")) {
                    set.identity.extend_from_slice(format!("{name}:U8:{:?};", view.shape()).as_bytes());
                    set.identity.extend_from_slice(&view.data()[..view.data().len().min(64)]);
                    set.packed.insert(name, (label.clone(), map.clone(), view.shape().to_vec(), range));
                    continue;
                }
                let dtype = match view.dtype() {
                    safetensors::Dtype::F32 => DType::F32,
                    safetensors::Dtype::F16 => DType::F16,
                    safetensors::Dtype::BF16 => DType::BF16,
                    other => return Err(tensor_err(&label, &name, format!("dtype {other:?} is not supported (f32, f16, bf16)"))),
                };
                set.identity.extend_from_slice(format!("{name}:{dtype:?}:{:?};", view.shape()).as_bytes());
                // A content sample makes two fixtures of the same shape but different seeds differ.
                let d = view.data();
                set.identity.extend_from_slice(&d[..d.len().min(64)]);
                set.tensors.insert(name, (label.clone(), map.clone(), dtype, view.shape().to_vec(), range));
            }
        }
        Ok(set)
    }

    fn get(&self, name: &str, shape: &[usize]) -> Result<Weight> {
        self.get_with(name, shape, Weight::new)
    }

    /// [`Self::get`] through constructor `make` (`Weight::new`, or `Weight::for_rows` for a
    /// matrix only read row by row).
    fn get_with(&self, name: &str, shape: &[usize], make: WeightCtor) -> Result<Weight> {
        let (file, map, dtype, have, range) = self.tensors.get(name).ok_or_else(|| tensor_err("model.safetensors", name, "missing"))?;
        if have.as_slice() != shape {
            return Err(tensor_err(file, name, format!("shape {have:?}, expected {shape:?}")));
        }
        let (rows, cols) = match shape {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            _ => return Err(tensor_err(file, name, "expected a 1-D or 2-D tensor")),
        };
        make(file, name, *dtype, rows, cols, Storage::Mapped(map.clone(), range.clone()))
    }

    /// A fused `[sum(parts), cols]` matrix split into one matrix per part (`Weight::split_rows`).
    fn get_split(&self, name: &str, parts: &[usize], cols: usize) -> Result<Vec<Weight>> {
        let (file, map, dtype, have, range) = self.tensors.get(name).ok_or_else(|| tensor_err("model.safetensors", name, "missing"))?;
        let rows: usize = parts.iter().sum();
        if have.as_slice() != [rows, cols] {
            return Err(tensor_err(file, name, format!("shape {have:?}, expected {:?}", [rows, cols])));
        }
        Weight::split_rows(file, name, *dtype, parts, cols, Storage::Mapped(map.clone(), range.clone()))
    }

    /// Tensor `name`'s file label, dtype and bytes, checked to have `shape` (any rank).
    fn raw(&self, name: &str, shape: &[usize]) -> Result<(&str, DType, &[u8])> {
        let (file, map, dtype, have, range) = self.tensors.get(name).ok_or_else(|| tensor_err("model.safetensors", name, "missing"))?;
        if have.as_slice() != shape {
            return Err(tensor_err(file, name, format!("shape {have:?}, expected {shape:?}")));
        }
        Ok((file, *dtype, &map[range.clone()]))
    }

    /// Packed (u8) tensor `name`'s file label and bytes, checked to have `shape`; `None` when absent.
    fn packed(&self, name: &str, shape: &[usize]) -> Result<Option<(&str, &[u8])>> {
        let Some((file, map, have, range)) = self.packed.get(name) else { return Ok(None) };
        if have.as_slice() != shape {
            return Err(tensor_err(file, name, format!("shape {have:?}, expected {shape:?}")));
        }
        Ok(Some((file, &map[range.clone()])))
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        Ok(self.get(name, &[len])?.to_f32())
    }

    fn has(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }
}

/// GPT-OSS's experts under `p` (`{p}.gate_up_proj` `[experts, hidden, 2·ffn]` with gate and up
/// interleaved by column, `{p}.down_proj` `[experts, ffn, hidden]`, both applied as `x @ W`,
/// and their biases): each expert's gate, up and down as `[out, in]` matrices in the stored
/// dtype, copied out transposed (`super::experts`).
fn gpt_oss_experts(t: &TensorSet, p: &str, experts: usize, ffn: usize, hidden: usize) -> Result<Vec<GatedMlp>> {
    use super::experts::columns_as_rows;
    if t.packed.contains_key(&format!("{p}.gate_up_proj_blocks")) {
        return gpt_oss_mxfp4_experts(t, p, experts, ffn, hidden);
    }
    let gate_up_name = format!("{p}.gate_up_proj");
    let (file, dtype, gate_up) = t.raw(&gate_up_name, &[experts, hidden, 2 * ffn])?;
    let down_name = format!("{p}.down_proj");
    let (_, down_dtype, down) = t.raw(&down_name, &[experts, ffn, hidden])?;
    let gate_up_bias = t.get(&format!("{p}.gate_up_proj_bias"), &[experts, 2 * ffn])?.to_f32();
    let down_bias = t.get(&format!("{p}.down_proj_bias"), &[experts, hidden])?.to_f32();
    let owned = |name: &str, dtype: DType, rows: usize, cols: usize, bytes: Vec<u8>| {
        Weight::new(file, name, dtype, rows, cols, Storage::Owned(Arc::new(bytes)))
    };
    (0..experts)
        .map(|e| {
            let gu = &gate_up[e * gate_up.len() / experts..(e + 1) * gate_up.len() / experts];
            let dn = &down[e * down.len() / experts..(e + 1) * down.len() / experts];
            let bias = &gate_up_bias[e * 2 * ffn..(e + 1) * 2 * ffn];
            Ok(GatedMlp {
                gate: owned(&gate_up_name, dtype, ffn, hidden, columns_as_rows(gu, dtype, hidden, 2 * ffn, 0, 2))?,
                up: owned(&gate_up_name, dtype, ffn, hidden, columns_as_rows(gu, dtype, hidden, 2 * ffn, 1, 2))?,
                down: owned(&down_name, down_dtype, hidden, ffn, columns_as_rows(dn, down_dtype, ffn, hidden, 0, 1))?,
                bias: Some(MlpBias {
                    gate: bias.iter().step_by(2).copied().collect(),
                    up: bias.iter().skip(1).step_by(2).copied().collect(),
                    down: down_bias[e * hidden..(e + 1) * hidden].to_vec(),
                }),
            })
        })
        .collect()
}

/// GPT-OSS's experts as its checkpoints ship them (`quant_method: mxfp4`): `gate_up_proj_blocks`
/// `[experts, 2·ffn, hidden/32, 16]` with `_scales` `[experts, 2·ffn, hidden/32]` (rows
/// `[out, in]`, gate and up interleaved by row), `down_proj_blocks` / `_scales` likewise with
/// `hidden` rows of `ffn`, and float biases: each expert's matrices repacked into ggml's MXFP4
/// blocks (as llama.cpp's converter repacks them), kept 4-bit.
fn gpt_oss_mxfp4_experts(t: &TensorSet, p: &str, experts: usize, ffn: usize, hidden: usize) -> Result<Vec<GatedMlp>> {
    use engram_kernels::mxfp4_rows_from_hf;
    if !hidden.is_multiple_of(32) || !ffn.is_multiple_of(32) {
        return Err(tensor_err("model.safetensors", &format!("{p}.gate_up_proj_blocks"), "MXFP4 rows need multiples of 32"));
    }
    let packed = |name: &str, rows: usize, cols: usize| -> Result<(&str, &[u8], &[u8])> {
        let missing = || tensor_err("model.safetensors", name, "missing");
        let (file, blocks) = t.packed(&format!("{name}_blocks"), &[experts, rows, cols / 32, 16])?.ok_or_else(missing)?;
        let (_, scales) = t.packed(&format!("{name}_scales"), &[experts, rows, cols / 32])?.ok_or_else(missing)?;
        Ok((file, blocks, scales))
    };
    let (gate_up_name, down_name) = (format!("{p}.gate_up_proj"), format!("{p}.down_proj"));
    let (file, gu_blocks, gu_scales) = packed(&gate_up_name, 2 * ffn, hidden)?;
    let (_, dn_blocks, dn_scales) = packed(&down_name, hidden, ffn)?;
    let gate_up_bias = t.get(&format!("{p}.gate_up_proj_bias"), &[experts, 2 * ffn])?.to_f32();
    let down_bias = t.get(&format!("{p}.down_proj_bias"), &[experts, hidden])?.to_f32();
    let owned = |name: &str, rows: usize, cols: usize, bytes: Vec<u8>| {
        Weight::new(file, name, DType::MXFP4, rows, cols, Storage::Owned(Arc::new(bytes)))
    };
    let part = |x: &'_ [u8], e: usize| -> Vec<u8> { x[e * x.len() / experts..(e + 1) * x.len() / experts].to_vec() };
    (0..experts)
        .map(|e| {
            let (gb, gs, db, ds) = (part(gu_blocks, e), part(gu_scales, e), part(dn_blocks, e), part(dn_scales, e));
            let bias = &gate_up_bias[e * 2 * ffn..(e + 1) * 2 * ffn];
            Ok(GatedMlp {
                gate: owned(&gate_up_name, ffn, hidden, mxfp4_rows_from_hf(&gb, &gs, 2 * ffn, hidden, 0, 2))?,
                up: owned(&gate_up_name, ffn, hidden, mxfp4_rows_from_hf(&gb, &gs, 2 * ffn, hidden, 1, 2))?,
                down: owned(&down_name, hidden, ffn, mxfp4_rows_from_hf(&db, &ds, hidden, ffn, 0, 1))?,
                bias: Some(MlpBias {
                    gate: bias.iter().step_by(2).copied().collect(),
                    up: bias.iter().skip(1).step_by(2).copied().collect(),
                    down: down_bias[e * hidden..(e + 1) * hidden].to_vec(),
                }),
            })
        })
        .collect()
}

fn build_weights(c: &ModelConfig, t: &TensorSet) -> Result<ModelWeights> {
    // Gemma's RMSNorm multiplies by `1 + w` (in f32, as transformers' Gemma3RMSNorm); the
    // stored `w` becomes `1 + w` here, as llama.cpp's converter writes it into GGUF files.
    let gemma_norm = |mut w: Vec<f32>| -> Vec<f32> {
        if c.sandwich_norms {
            w.iter_mut().for_each(|x| *x += 1.0);
        }
        w
    };
    // An embedding not tied to the output is only read row by row: no copy for the kernels.
    let untied = t.has("lm_head.weight");
    let embed = t.get_with("model.embed_tokens.weight", &[c.vocab, c.hidden], if untied { Weight::for_rows } else { Weight::new })?;
    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        let p = format!("model.layers.{i}");
        let bias = |n: &str, len: usize| -> Result<Option<Vec<f32>>> {
            let name = format!("{p}.self_attn.{n}.bias");
            if c.qkv_bias || t.has(&name) {
                Ok(Some(t.vector(&name, len)?))
            } else {
                Ok(None)
            }
        };
        let norm = |n: &str| -> Result<Option<Vec<f32>>> {
            if c.qk_norm {
                Ok(Some(gemma_norm(t.vector(&format!("{p}.self_attn.{n}.weight"), c.head_dim)?)))
            } else {
                Ok(None)
            }
        };
        let block_norm = |n: &str| -> Result<Vec<f32>> { Ok(gemma_norm(t.vector(&format!("{p}.{n}.weight"), c.hidden)?)) };
        // Phi-3 stores q/k/v as one `qkv_proj` and gate/up as one `gate_up_proj` (gate first).
        let (q, k, v, ffn) = if c.arch == Arch::Phi3 {
            let [q, k, v]: [Weight; 3] = t
                .get_split(&format!("{p}.self_attn.qkv_proj.weight"), &[c.q_width(), c.kv_width(), c.kv_width()], c.hidden)?
                .try_into()
                .map_err(|_| tensor_err("model.safetensors", "qkv_proj", "split into three"))?;
            let [gate, up]: [Weight; 2] = t
                .get_split(&format!("{p}.mlp.gate_up_proj.weight"), &[c.ffn, c.ffn], c.hidden)?
                .try_into()
                .map_err(|_| tensor_err("model.safetensors", "gate_up_proj", "split into two"))?;
            let down = t.get(&format!("{p}.mlp.down_proj.weight"), &[c.hidden, c.ffn])?;
            (q, k, v, FeedForward::Dense(GatedMlp { gate, up, down, bias: None }))
        } else {
            let mlp = |p: &str, ffn: usize| -> Result<GatedMlp> {
                Ok(GatedMlp {
                    gate: t.get(&format!("{p}.gate_proj.weight"), &[ffn, c.hidden])?,
                    up: t.get(&format!("{p}.up_proj.weight"), &[ffn, c.hidden])?,
                    down: t.get(&format!("{p}.down_proj.weight"), &[c.hidden, ffn])?,
                    bias: None,
                })
            };
            // Mixtral's expert e: `w1` gate, `w3` up, `w2` down.
            let mixtral_expert = |p: &str, ffn: usize| -> Result<GatedMlp> {
                Ok(GatedMlp {
                    gate: t.get(&format!("{p}.w1.weight"), &[ffn, c.hidden])?,
                    up: t.get(&format!("{p}.w3.weight"), &[ffn, c.hidden])?,
                    down: t.get(&format!("{p}.w2.weight"), &[c.hidden, ffn])?,
                    bias: None,
                })
            };
            let ffn = match c.moe {
                Some(m) if c.arch == Arch::GptOss => FeedForward::Moe(MoeWeights {
                    router: t.get(&format!("{p}.mlp.router.weight"), &[m.experts, c.hidden])?,
                    router_bias: Some(t.vector(&format!("{p}.mlp.router.bias"), m.experts)?),
                    experts: gpt_oss_experts(t, &format!("{p}.mlp.experts"), m.experts, m.expert_ffn, c.hidden)?,
                }),
                Some(m) if c.arch == Arch::Mixtral => FeedForward::Moe(MoeWeights {
                    router: t.get(&format!("{p}.block_sparse_moe.gate.weight"), &[m.experts, c.hidden])?,
                    router_bias: None,
                    experts: (0..m.experts)
                        .map(|e| mixtral_expert(&format!("{p}.block_sparse_moe.experts.{e}"), m.expert_ffn))
                        .collect::<Result<_>>()?,
                }),
                // Qwen3-MoE: the router is `mlp.gate`, expert e's MLP `mlp.experts.{e}.*_proj`.
                Some(m) => FeedForward::Moe(MoeWeights {
                    router: t.get(&format!("{p}.mlp.gate.weight"), &[m.experts, c.hidden])?,
                    router_bias: None,
                    experts: (0..m.experts).map(|e| mlp(&format!("{p}.mlp.experts.{e}"), m.expert_ffn)).collect::<Result<_>>()?,
                }),
                None => FeedForward::Dense(mlp(&format!("{p}.mlp"), c.ffn)?),
            };
            (
                t.get(&format!("{p}.self_attn.q_proj.weight"), &[c.q_width(), c.hidden])?,
                t.get(&format!("{p}.self_attn.k_proj.weight"), &[c.kv_width(), c.hidden])?,
                t.get(&format!("{p}.self_attn.v_proj.weight"), &[c.kv_width(), c.hidden])?,
                ffn,
            )
        };
        // Gemma's `post_attention_layernorm` norms the attention output; its MLP's input norm
        // is `pre_feedforward_layernorm` (Llama's is `post_attention_layernorm`).
        let (post_attn_norm, ffn_norm, post_ffn_norm) = if c.sandwich_norms {
            (
                Some(block_norm("post_attention_layernorm")?),
                block_norm("pre_feedforward_layernorm")?,
                Some(block_norm("post_feedforward_layernorm")?),
            )
        } else {
            (None, block_norm("post_attention_layernorm")?, None)
        };
        layers.push(LayerWeights {
            attn_norm: block_norm("input_layernorm")?,
            q,
            k,
            v,
            q_bias: bias("q_proj", c.q_width())?,
            k_bias: bias("k_proj", c.kv_width())?,
            v_bias: bias("v_proj", c.kv_width())?,
            q_norm: norm("q_norm")?,
            k_norm: norm("k_norm")?,
            o: t.get(&format!("{p}.self_attn.o_proj.weight"), &[c.hidden, c.q_width()])?,
            o_bias: if t.has(&format!("{p}.self_attn.o_proj.bias")) {
                Some(t.vector(&format!("{p}.self_attn.o_proj.bias"), c.hidden)?)
            } else {
                None
            },
            sinks: if c.arch == Arch::GptOss { Some(t.vector(&format!("{p}.self_attn.sinks"), c.num_heads)?) } else { None },
            post_attn_norm,
            ffn_norm,
            post_ffn_norm,
            ffn,
        });
    }
    let final_norm = gemma_norm(t.vector("model.norm.weight", c.hidden)?);
    let (output, embed) = if untied { (t.get("lm_head.weight", &[c.vocab, c.hidden])?, embed) } else { (embed.clone(), embed) };
    Ok(ModelWeights { embed, layers, final_norm, output })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields of Qwen3-0.6B's `config.json` that the loader reads.
    #[test]
    fn a_qwen3_0_6b_config_has_head_dim_128_over_hidden_1024() {
        let j: Json = serde_json::from_str(
            r#"{"architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "head_dim": 128, "hidden_act": "silu",
                "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960, "max_window_layers": 28,
                "model_type": "qwen3", "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
                "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
                "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936}"#,
        )
        .unwrap();
        let c = parse_config(&j, "config.json").unwrap();
        assert_eq!((c.arch, c.head_dim, c.q_width(), c.kv_width(), c.rope.rotary_dim()), (Arch::Qwen3, 128, 2048, 1024, 128));
        assert!(c.qk_norm && !c.qkv_bias && c.tied_embeddings && c.rope_attn_factor == 1.0);
    }

    /// SmolLM3-3B's shape: every fourth of 36 layers without RoPE, from its `no_rope_layers`
    /// list or, without one, from `no_rope_layer_interval` (default 4); a bad list is refused.
    #[test]
    fn a_smollm3_3b_config_skips_rope_on_every_fourth_layer() {
        let list: Vec<u8> = (0..36).map(|i| u8::from((i + 1) % 4 != 0)).collect();
        let text = format!(
            r#"{{"architectures": ["SmolLM3ForCausalLM"], "hidden_size": 2048, "intermediate_size": 11008,
                "max_position_embeddings": 65536, "model_type": "smollm3", "num_attention_heads": 16, "num_hidden_layers": 36,
                "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 5000000.0,
                "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 128256,
                "no_rope_layers": {}, "no_rope_layer_interval": 4}}"#,
            serde_json::to_string(&list).unwrap()
        );
        let c = parse_config(&serde_json::from_str(&text).unwrap(), "config.json").unwrap();
        let nope: Vec<usize> = (0..36).filter(|&l| !c.uses_rope(l)).collect();
        assert_eq!((c.arch, nope.len(), nope[0], nope[8]), (Arch::SmolLm3, 9, 3, 35));
        let mut j: Json = serde_json::from_str(&text).unwrap();
        j.as_object_mut().unwrap().remove("no_rope_layers");
        let by_interval = parse_config(&j, "config.json").unwrap();
        assert_eq!(by_interval.no_rope, c.no_rope, "the interval gives the same layers as the list");
        j["no_rope_layers"] = serde_json::json!([1, 0, 2]);
        let e = parse_config(&j, "config.json").unwrap_err().to_string();
        assert!(e.contains("no_rope_layers"), "{e}");
    }

    /// Phi-4-mini's shape: partial rotary 0.75 of 128, LongRoPE from 4096 to 131072 (48
    /// factors per set; the values here are placeholders), a sliding window longer than any context.
    #[test]
    fn a_phi4_mini_config_rotates_96_dimensions_and_caps_the_context_at_4096() {
        let factors = serde_json::to_string(&vec![1.0f32; 48]).unwrap();
        let text = format!(
            r#"{{"architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "intermediate_size": 8192,
                "max_position_embeddings": 131072, "model_type": "phi3", "num_attention_heads": 24, "num_hidden_layers": 32,
                "num_key_value_heads": 8, "original_max_position_embeddings": 4096, "partial_rotary_factor": 0.75,
                "rms_norm_eps": 1e-05, "rope_scaling": {{"long_factor": {factors}, "short_factor": {factors}, "type": "longrope"}},
                "rope_theta": 10000.0, "sliding_window": 262144, "tie_word_embeddings": true, "vocab_size": 200064}}"#
        );
        let c = parse_config(&serde_json::from_str(&text).unwrap(), "config.json").unwrap();
        assert_eq!((c.arch, c.head_dim, c.rope.rotary_dim(), c.max_positions), (Arch::Phi3, 128, 96, 4096));
        let want = (1.0 + (32f64).ln() / (4096f64).ln()).sqrt() as f32;
        assert!((c.rope_attn_factor - want).abs() < 1e-6, "{}", c.rope_attn_factor);
        // Unit factors leave plain RoPE over the 96 rotated dimensions.
        let plain = RopeConfig::base_inv_freq(10000.0, 96);
        assert!(c.rope.inv_freq.iter().zip(&plain).all(|(a, b)| (a - b).abs() <= 1e-6 * b));
        // transformers 5 writes the same as `rope_parameters`.
        let v5 = text.replace("\"rope_scaling\"", "\"rope_parameters\"").replace("\"type\": \"longrope\"", "\"rope_type\": \"longrope\"");
        let c5 = parse_config(&serde_json::from_str(&v5).unwrap(), "config.json").unwrap();
        assert_eq!((c5.rope.rotary_dim(), c5.max_positions, c5.rope_attn_factor), (96, 4096, c.rope_attn_factor));
    }

    /// Gemma-2-2b's `config.json`: alternating sliding (4096) and global layers under one
    /// RoPE, softcapping 50 / 30, `query_pre_attn_scalar` 256, no q/k norms.
    #[test]
    fn a_gemma2_2b_config_alternates_and_softcaps() {
        let text = r#"{"architectures": ["Gemma2ForCausalLM"], "attention_bias": false, "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0, "head_dim": 256, "hidden_act": "gelu_pytorch_tanh", "hidden_activation": "gelu_pytorch_tanh",
            "hidden_size": 2304, "intermediate_size": 9216, "max_position_embeddings": 8192, "model_type": "gemma2",
            "num_attention_heads": 8, "num_hidden_layers": 26, "num_key_value_heads": 4, "query_pre_attn_scalar": 256,
            "rms_norm_eps": 1e-06, "rope_theta": 10000.0, "sliding_window": 4096, "vocab_size": 256000}"#;
        let c = parse_config(&serde_json::from_str(text).unwrap(), "config.json").unwrap();
        assert_eq!((c.arch, c.attn_softcap, c.final_softcap, c.attn_scale), (Arch::Gemma2, Some(50.0), Some(30.0), 1.0 / 16.0));
        assert_eq!((c.layer_attention(0), c.layer_attention(1)), (LayerAttention::Sliding { window: 4096 }, LayerAttention::Global));
        assert!(c.rope_local.is_none() && !c.qk_norm && c.sandwich_norms && c.tied_embeddings);
        // A window as long as the context still slides (the file says so); `null` caps are off.
        let off = text.replace("\"attn_logit_softcapping\": 50.0", "\"attn_logit_softcapping\": null");
        assert_eq!(parse_config(&serde_json::from_str(&off).unwrap(), "config.json").unwrap().attn_softcap, None);
    }

    /// Mistral-7B-v0.1's window (4096 of a 32768-token context) slides over every layer;
    /// v0.3's `null` window leaves them global.
    #[test]
    fn a_mistral_7b_v0_1_config_slides_every_layer_over_4096_positions() {
        let text = r#"{"architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
            "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
            "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
            "sliding_window": 4096, "tie_word_embeddings": false, "vocab_size": 32000}"#;
        let c = parse_config(&serde_json::from_str(text).unwrap(), "config.json").unwrap();
        assert_eq!(c.layers, vec![LayerAttention::Sliding { window: 4096 }; 32]);
        assert!(c.has_sliding_layers() && c.rope_local.is_none());
        let v03 = text.replace("\"sliding_window\": 4096", "\"sliding_window\": null");
        let c = parse_config(&serde_json::from_str(&v03).unwrap(), "config.json").unwrap();
        assert!(!c.has_sliding_layers());
    }

    /// Gemma-3-1b-it's `config.json` (transformers 4.x spelling): five sliding layers (512) to
    /// one global, local RoPE base 10000 and global 1e6, `query_pre_attn_scalar` 256, √1152
    /// on the embeddings, GELU-tanh, tied embeddings; and transformers 5's spelling of the same.
    #[test]
    fn a_gemma3_1b_config_has_five_local_layers_to_one_global() {
        let text = r#"{"architectures": ["Gemma3ForCausalLM"], "attention_bias": false, "attn_logit_softcapping": null,
            "final_logit_softcapping": null, "head_dim": 256, "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 1152,
            "intermediate_size": 6912, "max_position_embeddings": 32768, "model_type": "gemma3_text", "num_attention_heads": 4,
            "num_hidden_layers": 26, "num_key_value_heads": 1, "query_pre_attn_scalar": 256, "rms_norm_eps": 1e-06,
            "rope_local_base_freq": 10000, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": 512,
            "sliding_window_pattern": 6, "vocab_size": 262144}"#;
        let c = parse_config(&serde_json::from_str(text).unwrap(), "config.json").unwrap();
        assert_eq!(c.arch, Arch::Gemma3);
        let globals: Vec<usize> = (0..26).filter(|&i| c.layer_attention(i) == LayerAttention::Global).collect();
        assert_eq!(globals, vec![5, 11, 17, 23]);
        assert_eq!(c.layer_attention(0), LayerAttention::Sliding { window: 512 });
        assert_eq!((c.rope.theta, c.layer_rope(0).theta, c.layer_rope(5).theta), (1e6, 1e4, 1e6));
        assert_eq!((c.attn_scale, c.embed_scale), (1.0 / 16.0, (1152f64).sqrt() as f32));
        assert!(c.qk_norm && c.sandwich_norms && c.tied_embeddings && c.ffn_act == FfnActivation::GeluTanh);
        // transformers 5: `rope_parameters` per layer kind and `layer_types`.
        let mut j: Json = serde_json::from_str(text).unwrap();
        let o = j.as_object_mut().unwrap();
        for k in ["rope_local_base_freq", "rope_theta", "rope_scaling", "sliding_window_pattern"] {
            o.remove(k);
        }
        o.insert(
            "rope_parameters".into(),
            serde_json::json!({"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                               "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}),
        );
        let kinds: Vec<&str> = (0..26).map(|i| if (i + 1) % 6 == 0 { "full_attention" } else { "sliding_attention" }).collect();
        o.insert("layer_types".into(), serde_json::json!(kinds));
        let c5 = parse_config(&j, "config.json").unwrap();
        assert_eq!((&c5.layers, &c5.rope.inv_freq, &c5.layer_rope(0).inv_freq), (&c.layers, &c.rope.inv_freq, &c.layer_rope(0).inv_freq));
        // Gemma-3-4B's linear scaling (factor 8) applies to the global layers only; an
        // unsupported type on them is refused by name.
        let scaled = text.replace("\"rope_scaling\": null", "\"rope_scaling\": {\"factor\": 8.0, \"rope_type\": \"linear\"}");
        let c4 = parse_config(&serde_json::from_str(&scaled).unwrap(), "config.json").unwrap();
        assert!(c4.rope.inv_freq.iter().zip(&c.rope.inv_freq).all(|(a, b)| *a == b / 8.0));
        assert_eq!(c4.layer_rope(0).inv_freq, c.layer_rope(0).inv_freq);
        let yarn = text.replace("\"rope_scaling\": null", "\"rope_scaling\": {\"factor\": 8.0, \"rope_type\": \"yarn\"}");
        let e = parse_config(&serde_json::from_str(&yarn).unwrap(), "config.json").unwrap_err().to_string();
        assert!(e.contains("\"yarn\" is not supported"), "{e}");
        // What is not implemented is refused by name.
        for (field, value) in [("final_logit_softcapping", "30.0"), ("hidden_activation", "\"gelu\""), ("model_type", "\"gemma3\"")] {
            let bad = text.replacen(&format!("\"{field}\": "), &format!("\"{field}\": {value}, \"x_{field}\": "), 1);
            let e = parse_config(&serde_json::from_str(&bad).unwrap(), "config.json").unwrap_err().to_string();
            assert!(e.contains(if field == "model_type" { "multimodal" } else { field }), "{field}: {e}");
        }
    }
}
