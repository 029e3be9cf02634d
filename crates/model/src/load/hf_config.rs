//! `config.json` of a Hugging Face folder, parsed into the architecture's `ModelConfig`. The
//! typed getters' errors name the file and the key (a wrong type, a missing required key).

use serde_json::Value as Json;

use crate::config::{Arch, LayerAttention, Llama3Scaling, ModelConfig, MoeConfig, MoeGating, NoRope, RopeConfig, RopeStyle};
use crate::error::{config_err, ModelError, Result};
use crate::rope::YarnScaling;

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
        ffn_act: arch.ffn_activation(),
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

/// The per-layer list `key` where given (`None` when absent or null): an error unless it is a
/// list of exactly `num_layers` entries.
fn layer_list<'j>(j: &'j Json, file: &str, key: &str, num_layers: usize) -> Result<Option<&'j Vec<Json>>> {
    let Some(list) = j.get(key).filter(|v| !v.is_null()) else { return Ok(None) };
    let list = list.as_array().ok_or_else(|| config_err(file, key, "expected a list"))?;
    if list.len() != num_layers {
        return Err(config_err(file, key, format!("{} entries for {num_layers} layers", list.len())));
    }
    Ok(Some(list))
}

/// SmolLM3's NoPE layers (true: no RoPE): `no_rope_layers` where given (transformers: 1 uses
/// RoPE, 0 does not), else every `no_rope_layer_interval`-th layer (default 4: layer `i` skips
/// RoPE when `(i + 1) % 4 == 0`, as llama.cpp does for every SmolLM3 GGUF).
fn smollm3_no_rope(j: &Json, file: &str, num_layers: usize) -> Result<Vec<bool>> {
    if let Some(list) = layer_list(j, file, "no_rope_layers", num_layers)? {
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
    if let Some(kinds) = layer_list(j, file, "layer_types", num_layers)? {
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
        assert!(c.qk_norm && c.sandwich_norms && c.tied_embeddings && c.ffn_act == crate::config::FfnActivation::GeluTanh);
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
