//! GGUF files (v2/v3) as llama.cpp writes them: architecture `llama`,
//! `mistral`, `qwen2`, `qwen3`, `qwen3moe`, `phi3`, `gemma2`, `gemma3`, `smollm3` or `gpt-oss`; tensors of every format `engram_kernels::DType`
//! computes (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K,
//! Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) used in place from the file mapping (any
//! other ggml type is an error naming it, its id and the tensor); the tokenizer and chat template from
//! `tokenizer.ggml.*` metadata.
//!
//! NOTE: llama.cpp's converter permutes the rows of `attn_q` / `attn_k` for
//! `llama`-family models so that RoPE rotates adjacent pairs; we keep the
//! file as it is and rotate adjacent pairs (`RopeStyle::Interleaved`) rather
//! than copying the weights back. `qwen2`, `qwen3` and `phi3` files are not
//! permuted (NEOX). `phi3` files keep q/k/v fused in `attn_qkv` and gate/up in
//! `ffn_up` (gate first); both are split into views of the mapping at load.
//! `gemma2` / `gemma3` files store the norm weights as `1 + w` already (the
//! converter adds the one), so they are used as stored; the layer pattern, the
//! sliding layers' RoPE base and the attention scale follow llama.cpp's
//! defaults where the file is silent (Gemma 3: every 6th layer global, base
//! 10000; Gemma 2: alternating, window 4096, one base; `1/√key_length`). `gpt-oss`
//! files alternate sliding (even) and global layers as llama.cpp's `load_swa_pattern(ml, 2)`,
//! carry YaRN as `rope.scaling.*` (its ramp always truncated, as `ggml_rope_yarn_corr_dims`
//! computes it), a sink per head (`attn_sinks.weight`), biases on every projection and the
//! experts' biases as `[ffn, experts]` tensors beside their 3-D weights (MXFP4 in
//! llama.cpp's own conversions).

use std::path::Path;
use std::sync::Arc;

use engram_gguf::{Gguf, GgufFile, TensorInfo};
use engram_kernels::DType;
use engram_tokenizer::{GgufVocab, Tokenizer};

use super::Loaded;
use crate::config::{Arch, LayerAttention, ModelConfig, MoeConfig, MoeGating, NoRope, RopeConfig, RopeStyle};
use crate::error::{config_err, tensor_err, ModelError, Result};
use crate::rope::YarnScaling;
use crate::weights::{FeedForward, GatedMlp, LayerWeights, MlpBias, ModelWeights, MoeWeights, Storage, Weight, WeightCtor};

/// Loads a GGUF model file.
pub fn load_gguf(path: &Path) -> Result<Loaded> {
    let file = GgufFile::open(path)?;
    let label = path.display().to_string();
    let arch_name = file.get_str("general.architecture")?;
    let arch = Arch::parse(&arch_name).ok_or_else(|| ModelError::UnsupportedArch { file: label.clone(), arch: arch_name.clone() })?;
    let config = parse_config(&file, arch, &arch_name, &label)?;
    let tokenizer = Tokenizer::from_gguf_vocab(&read_vocab(file.header(), &label).map_err(|e| in_file(e, path))?)
        .map_err(|e| config_err(&label, "tokenizer.ggml", e.to_string()))?;
    // The weights share the file's mapping, so they outlive `file`.
    let map = file.mmap().clone();
    let weights = build_weights(&config, &file, &map, &label)?;
    let mut identity = Vec::new();
    for (k, v) in &file.header().metadata {
        identity.extend_from_slice(k.as_bytes());
        identity.extend_from_slice(format!("{v:?}").as_bytes());
    }
    for t in &file.header().tensors {
        identity.extend_from_slice(format!("{}:{:?}:{};", t.name, t.dims, t.ggml_type).as_bytes());
        let d = file.tensor_data(t);
        identity.extend_from_slice(&d[..d.len().min(64)]);
    }
    Ok(Loaded { config, weights, tokenizer, source: format!("gguf:{label}"), identity })
}

fn parse_config(f: &GgufFile, arch: Arch, a: &str, label: &str) -> Result<ModelConfig> {
    let key = |k: &str| format!("{a}.{k}");
    let hidden = f.get_u64(&key("embedding_length"))? as usize;
    let num_heads = f.get_u64(&key("attention.head_count"))? as usize;
    let num_kv_heads = f.get_u64_opt(&key("attention.head_count_kv"))?.map(|v| v as usize).unwrap_or(num_heads);
    let head_dim = match f.get_u64_opt(&key("attention.key_length"))? {
        Some(h) => h as usize,
        None if num_heads > 0 => hidden / num_heads,
        None => 0,
    };
    // Phi-3's partial rotary: fewer rotated dimensions than the head has.
    let rotary_dim = f.get_u64_opt(&key("rope.dimension_count"))?.map(|v| v as usize).unwrap_or(head_dim);
    let mut max_positions = f.get_u64_opt(&key("context_length"))?.map(|v| v as usize).unwrap_or(4096);
    let theta = f.get_f32_opt(&key("rope.freq_base"))?.unwrap_or(10000.0);
    let mut inv_freq = RopeConfig::base_inv_freq(theta, rotary_dim);
    let mut scaling = "none".to_string();
    let mut rope_attn_factor = 1.0;
    // Llama 3.1-style scaling arrives as per-pair divisors in the `rope_freqs.weight` tensor.
    if let Some(t) = f.header().tensor("rope_freqs.weight") {
        let factors = small_vector(f, t, label)?;
        if factors.len() != inv_freq.len() {
            return Err(tensor_err(label, "rope_freqs.weight", format!("{} factors, expected {}", factors.len(), inv_freq.len())));
        }
        for (fr, fac) in inv_freq.iter_mut().zip(&factors) {
            *fr /= fac;
        }
        scaling = "rope_freqs".into();
    } else if let Some(t) = f.header().tensor("rope_factors_short.weight") {
        // Phi-3 LongRoPE: the short factors, with the context capped at the original one
        // (the long factors are for contexts beyond it; see the HF loader's note).
        let factors = small_vector(f, t, label)?;
        if factors.len() != inv_freq.len() {
            return Err(tensor_err(label, "rope_factors_short.weight", format!("{} factors, expected {}", factors.len(), inv_freq.len())));
        }
        for (fr, fac) in inv_freq.iter_mut().zip(&factors) {
            *fr /= fac;
        }
        let original = f
            .get_u64_opt(&key("rope.scaling.original_context_length"))?
            .map(|v| v as usize)
            .ok_or_else(|| config_err(label, &key("rope.scaling.original_context_length"), "missing (LongRoPE needs it)"))?;
        rope_attn_factor = match f.get_f32_opt(&key("rope.scaling.attn_factor"))? {
            Some(a) => a,
            None => RopeConfig::longrope_attn_factor(max_positions, original),
        };
        max_positions = max_positions.min(original);
        scaling = format!("longrope:short,attn_factor={rope_attn_factor},context={original}");
    } else if let Some(kind) = f.get_str_opt(&key("rope.scaling.type"))? {
        match kind.as_str() {
            "linear" => {
                let factor = f.get_f32_opt(&key("rope.scaling.factor"))?.unwrap_or(1.0);
                inv_freq.iter_mut().for_each(|x| *x /= factor);
                scaling = format!("linear:{factor}");
            }
            "yarn" if arch == Arch::GptOss => {
                let y = YarnScaling {
                    factor: f.get_f32_opt(&key("rope.scaling.factor"))?.unwrap_or(1.0),
                    original_max_positions: f
                        .get_u64_opt(&key("rope.scaling.original_context_length"))?
                        .ok_or_else(|| config_err(label, &key("rope.scaling.original_context_length"), "missing (YaRN needs it)"))?
                        as f32,
                    beta_fast: f.get_f32_opt(&key("rope.scaling.yarn_beta_fast"))?.unwrap_or(32.0),
                    beta_slow: f.get_f32_opt(&key("rope.scaling.yarn_beta_slow"))?.unwrap_or(1.0),
                    truncate: true,
                };
                if !(y.factor > 0.0 && y.original_max_positions > 0.0 && y.beta_fast > 0.0 && y.beta_slow > 0.0) {
                    return Err(config_err(label, &key("rope.scaling"), format!("YaRN parameters must be positive: {y:?}")));
                }
                inv_freq = y.inv_freq(theta, rotary_dim);
                // llama.cpp: `1 + 0.1 ln(factor)` on cos/sin (its `yarn_attn_factor` cancels out).
                rope_attn_factor = y.attention_factor();
                scaling = format!("yarn:{y:?},attn_factor={rope_attn_factor}");
            }
            "none" => {}
            other => {
                return Err(config_err(
                    label,
                    &key("rope.scaling.type"),
                    format!("\"{other}\" is not supported (linear, none; yarn for gpt-oss)"),
                ))
            }
        }
    }
    if arch == Arch::Phi3 {
        // convert_hf_to_gguf writes 0 for "none"; llama.cpp then runs without it.
        let window = f.get_u64_opt(&key("attention.sliding_window"))?.unwrap_or(0) as usize;
        if window > 0 && window < max_positions {
            return Err(config_err(
                label,
                &key("attention.sliding_window"),
                format!("sliding-window attention ({window} tokens, below the {max_positions}-token context) is not supported"),
            ));
        }
    }
    let num_layers = f.get_u64(&key("block_count"))? as usize;
    let window = f.get_u64_opt(&key("attention.sliding_window"))?.unwrap_or(0) as usize;
    let mut layers = vec![LayerAttention::Global; num_layers];
    let mut rope_local = None;
    let gemma = arch.is_gemma();
    let (mut attn_softcap, mut final_softcap) = (None, None);
    // llama.cpp reads `mistral` files' window as a window over every layer.
    if arch == Arch::Mistral && window > 0 && window < max_positions {
        layers = vec![LayerAttention::Sliding { window }; num_layers];
    }
    if arch == Arch::GptOss {
        // llama.cpp's `load_swa_pattern(ml, 2)`: layer `il` slides when `il % n < n - 1`.
        if window == 0 {
            return Err(config_err(label, &key("attention.sliding_window"), "missing (gpt-oss needs it)"));
        }
        let n = f.get_u64_opt(&key("attention.sliding_window_pattern"))?.unwrap_or(2) as usize;
        layers = (0..num_layers)
            .map(|il| if n == 0 || il % n < n - 1 { LayerAttention::Sliding { window } } else { LayerAttention::Global })
            .collect();
    }
    if arch == Arch::Gemma2 {
        // llama.cpp: a window of 4096 unless the file says, every other layer, softcapping.
        let window = if window > 0 { window } else { 4096 };
        let n = f.get_u64_opt(&key("attention.sliding_window_pattern"))?.unwrap_or(2) as usize;
        layers = (0..num_layers)
            .map(|il| if n == 0 || il % n < n - 1 { LayerAttention::Sliding { window } } else { LayerAttention::Global })
            .collect();
        attn_softcap = f.get_f32_opt(&key("attn_logit_softcapping"))?.filter(|&c| c > 0.0);
        final_softcap = f.get_f32_opt(&key("final_logit_softcapping"))?.filter(|&c| c > 0.0);
        if let Some(t) = f.get_f32_opt(&key("rope.freq_base_swa"))?.filter(|&t| t != theta) {
            rope_local = Some(RopeConfig {
                theta: t,
                style: RopeStyle::Neox,
                inv_freq: RopeConfig::base_inv_freq(t, rotary_dim),
                scaling: "none".into(),
            });
        }
    }
    if arch == Arch::Gemma3 {
        if window > 0 {
            // llama.cpp's `load_swa_pattern(ml, 6)`: layer `il` slides when `il % n < n - 1`.
            let n = f.get_u64_opt(&key("attention.sliding_window_pattern"))?.unwrap_or(6) as usize;
            layers = (0..num_layers)
                .map(|il| if n == 0 || il % n < n - 1 { LayerAttention::Sliding { window } } else { LayerAttention::Global })
                .collect();
        }
        if let Some(cap) = f.get_f32_opt(&key("final_logit_softcapping"))?.filter(|&c| c > 0.0) {
            return Err(config_err(label, &key("final_logit_softcapping"), format!("softcapping ({cap}) is not supported for gemma3")));
        }
        let local_theta = f.get_f32_opt(&key("rope.freq_base_swa"))?.unwrap_or(10000.0);
        rope_local = Some(RopeConfig {
            theta: local_theta,
            style: RopeStyle::Neox,
            inv_freq: RopeConfig::base_inv_freq(local_theta, rotary_dim),
            scaling: "none".into(),
        });
    }
    let vocab = match f.get_u64_opt(&key("vocab_size"))? {
        Some(v) => v as usize,
        None => f
            .header()
            .tensor("token_embd.weight")
            .and_then(|t| t.dims.get(1).copied())
            .ok_or_else(|| tensor_err(label, "token_embd.weight", "missing"))? as usize,
    };
    // llama.cpp's LLAMA_ROPE_TYPE_NEOX architectures among ours.
    let style = if matches!(arch, Arch::Qwen2 | Arch::Qwen3 | Arch::Qwen3Moe | Arch::Phi3 | Arch::Gemma2 | Arch::Gemma3 | Arch::GptOss) {
        RopeStyle::Neox
    } else {
        RopeStyle::Interleaved
    };
    // llama.cpp's Gemma attention scale: `1/√key_length`, but `1/√(hidden / heads)` for the
    // 27B models (62 layers for Gemma 3, 46 for Gemma 2: their `query_pre_attn_scalar`),
    // which GGUF does not carry.
    let big = (arch == Arch::Gemma3 && num_layers == 62) || (arch == Arch::Gemma2 && num_layers == 46);
    let attn_scale = if big && num_heads > 0 { 1.0 / ((hidden / num_heads) as f32).sqrt() } else { 1.0 / (head_dim as f32).sqrt() };
    let rope = RopeConfig { theta, style, inv_freq, scaling };
    // llama.cpp runs every fourth SmolLM3 layer without RoPE (`n_no_rope_layer_step = 4`; the
    // file carries no list).
    let no_rope = (arch == Arch::SmolLm3).then(|| NoRope::new((0..num_layers).map(|i| (i + 1) % 4 == 0).collect(), &rope));
    let config = ModelConfig {
        arch,
        hidden,
        num_layers,
        num_heads,
        num_kv_heads,
        head_dim,
        ffn: f.get_u64(&key("feed_forward_length"))? as usize,
        vocab,
        rms_eps: f.get_f32_opt(&key("attention.layer_norm_rms_epsilon"))?.unwrap_or(1e-5),
        rope,
        max_positions,
        qkv_bias: f.header().tensor("blk.0.attn_q.bias").is_some(),
        qk_norm: f.header().tensor("blk.0.attn_q_norm.weight").is_some(),
        rope_attn_factor,
        tied_embeddings: f.header().tensor("output.weight").is_none(),
        layers,
        rope_local,
        sandwich_norms: gemma,
        // llama.cpp: `ggml_scale(inpL, sqrtf(n_embd))`.
        embed_scale: if gemma { (hidden as f32).sqrt() } else { 1.0 },
        ffn_act: arch.ffn_activation(),
        attn_scale,
        attn_softcap,
        final_softcap,
        no_rope,
        // llama.cpp's qwen3moe: softmax gating, the chosen weights always renormalized.
        moe: match arch {
            Arch::Qwen3Moe => Some(MoeConfig {
                experts: f.get_u64(&key("expert_count"))? as usize,
                top_k: f.get_u64(&key("expert_used_count"))? as usize,
                expert_ffn: f.get_u64(&key("expert_feed_forward_length"))? as usize,
                norm_top_k: true,
                gating: MoeGating::SoftmaxThenTopK,
            }),
            // llama.cpp's gpt-oss: `SOFTMAX_WEIGHT` gating, a softmax over the chosen logits.
            Arch::GptOss => Some(MoeConfig {
                experts: f.get_u64(&key("expert_count"))? as usize,
                top_k: f.get_u64(&key("expert_used_count"))? as usize,
                expert_ffn: f.get_u64(&key("expert_feed_forward_length"))? as usize,
                norm_top_k: false,
                gating: MoeGating::TopKThenSoftmax,
            }),
            // Mixtral: a `llama` file with experts (`llama.expert_count`), each
            // `feed_forward_length` wide, renormalized as llama.cpp's llama graph does.
            Arch::Llama if f.get_u64_opt(&key("expert_count"))?.is_some_and(|n| n > 0) => Some(MoeConfig {
                experts: f.get_u64(&key("expert_count"))? as usize,
                top_k: f.get_u64(&key("expert_used_count"))? as usize,
                expert_ffn: match f.get_u64_opt(&key("expert_feed_forward_length"))? {
                    Some(n) => n as usize,
                    None => f.get_u64(&key("feed_forward_length"))? as usize,
                },
                norm_top_k: true,
                gating: MoeGating::SoftmaxThenTopK,
            }),
            _ => None,
        },
    };
    config.validate(label)?;
    Ok(config)
}

/// The tokenizer facts of a parsed GGUF header: what [`Tokenizer::from_gguf_vocab`] takes.
/// `label` names the file in the missing-tokenizer error; a header read error carries no path
/// (the loader adds it, as `GgufFile`'s accessors do). The model loader and the tokenizer fuzz
/// target both read vocabularies through this one function.
pub fn read_vocab(f: &Gguf, label: &str) -> Result<GgufVocab> {
    // A token id past 32 bits is an error naming the key, never truncated into another token.
    let id = |k: &str| -> Result<Option<u32>> {
        f.get_u64_opt(k)?
            .map(|v| u32::try_from(v).map_err(|_| config_err(label, k, format!("token id {v} does not fit 32 bits"))))
            .transpose()
    };
    Ok(GgufVocab {
        model: f.get_str("tokenizer.ggml.model")?,
        pre: f.get_str_opt("tokenizer.ggml.pre")?,
        tokens: f
            .get_str_array_opt("tokenizer.ggml.tokens")?
            .ok_or_else(|| config_err(label, "tokenizer.ggml.tokens", "missing (the file carries no tokenizer)"))?,
        scores: f.get_f32_array_opt("tokenizer.ggml.scores")?,
        token_types: f.get_i32_array_opt("tokenizer.ggml.token_type")?,
        merges: f.get_str_array_opt("tokenizer.ggml.merges")?,
        bos_id: id("tokenizer.ggml.bos_token_id")?,
        eos_id: id("tokenizer.ggml.eos_token_id")?,
        eot_id: id("tokenizer.ggml.eot_token_id")?,
        unk_id: id("tokenizer.ggml.unknown_token_id")?,
        pad_id: id("tokenizer.ggml.padding_token_id")?,
        add_bos: f.get_bool_opt("tokenizer.ggml.add_bos_token")?,
        add_eos: f.get_bool_opt("tokenizer.ggml.add_eos_token")?,
        add_space_prefix: f.get_bool_opt("tokenizer.ggml.add_space_prefix")?,
        chat_template: f.get_str_opt("tokenizer.chat_template")?,
    })
}

/// `e` with `path` added to a GGUF read error, as `GgufFile`'s own accessors add it.
fn in_file(e: ModelError, path: &Path) -> ModelError {
    match e {
        ModelError::Gguf(g) => ModelError::Gguf(g.in_file(path)),
        other => other,
    }
}

fn dtype_of(t: &TensorInfo, label: &str) -> Result<DType> {
    DType::from_ggml_type_id(t.ggml_type).ok_or_else(|| {
        let name = engram_gguf::ggml_type(t.ggml_type).map(|g| g.name).unwrap_or("unknown");
        let supported = DType::ALL.iter().map(|d| d.name()).collect::<Vec<_>>().join(", ");
        tensor_err(label, &t.name, format!("ggml type {name} (id {}) is not supported (supported: {supported})", t.ggml_type))
    })
}

fn small_vector(f: &GgufFile, t: &TensorInfo, label: &str) -> Result<Vec<f32>> {
    let dtype = dtype_of(t, label)?;
    let n: u64 = t.dims.iter().product();
    let mut out = vec![0.0; n as usize];
    let bytes = f.tensor_data(t);
    if dtype.row_bytes(n as usize) != Some(bytes.len()) {
        return Err(tensor_err(label, &t.name, "data size does not match its shape"));
    }
    engram_kernels::dequantize_row(dtype, bytes, &mut out);
    Ok(out)
}

fn build_weights(c: &ModelConfig, f: &GgufFile, map: &Arc<memmap2::Mmap>, label: &str) -> Result<ModelWeights> {
    let base = f.header().data_offset as usize;
    // Through `make`: `Weight::new`, or `Weight::for_rows` for a matrix only read row by row.
    let matrix_with = |name: &str, rows: usize, cols: usize, make: WeightCtor| -> Result<Weight> {
        let t = f.header().tensor(name).ok_or_else(|| tensor_err(label, name, "missing"))?;
        // GGUF lists dims innermost first: [cols, rows].
        if t.dims.as_slice() != [cols as u64, rows as u64] {
            return Err(tensor_err(label, name, format!("shape {:?}, expected [{cols}, {rows}]", t.dims)));
        }
        let start = base + t.offset as usize;
        make(label, name, dtype_of(t, label)?, rows, cols, Storage::Mapped(map.clone(), start..start + t.n_bytes as usize))
    };
    let matrix = |name: &str, rows: usize, cols: usize| matrix_with(name, rows, cols, Weight::new);
    let vector = |name: &str, len: usize| -> Result<Vec<f32>> {
        let t = f.header().tensor(name).ok_or_else(|| tensor_err(label, name, "missing"))?;
        if t.dims.as_slice() != [len as u64] {
            return Err(tensor_err(label, name, format!("shape {:?}, expected [{len}]", t.dims)));
        }
        small_vector(f, t, label)
    };
    let opt_vector = |name: &str, len: usize| -> Result<Option<Vec<f32>>> {
        if f.header().tensor(name).is_some() {
            Ok(Some(vector(name, len)?))
        } else {
            Ok(None)
        }
    };
    // A fused matrix split into its parts (`Weight::split_rows`), without repacking the whole.
    let split = |name: &str, parts: &[usize], cols: usize| -> Result<Vec<Weight>> {
        let t = f.header().tensor(name).ok_or_else(|| tensor_err(label, name, "missing"))?;
        let rows: usize = parts.iter().sum();
        if t.dims.as_slice() != [cols as u64, rows as u64] {
            return Err(tensor_err(label, name, format!("shape {:?}, expected [{cols}, {rows}]", t.dims)));
        }
        let start = base + t.offset as usize;
        Weight::split_rows(label, name, dtype_of(t, label)?, parts, cols, Storage::Mapped(map.clone(), start..start + t.n_bytes as usize))
    };
    // An embedding not tied to the output is only read row by row: no copy for the kernels.
    let untied = f.header().tensor("output.weight").is_some();
    let embed = matrix_with("token_embd.weight", c.vocab, c.hidden, if untied { Weight::for_rows } else { Weight::new })?;
    let mut layers = Vec::with_capacity(c.num_layers);
    for i in 0..c.num_layers {
        let n = |s: &str| format!("blk.{i}.{s}");
        let norm = |s: &str| -> Result<Option<Vec<f32>>> {
            if c.qk_norm {
                Ok(Some(vector(&n(s), c.head_dim)?))
            } else {
                Ok(None)
            }
        };
        // Phi-3 files hold q/k/v in one `attn_qkv` and gate/up in one `ffn_up` (gate first).
        let (q, k, v, ffn) = if c.arch == Arch::Phi3 {
            let [q, k, v]: [Weight; 3] = split(&n("attn_qkv.weight"), &[c.q_width(), c.kv_width(), c.kv_width()], c.hidden)?
                .try_into()
                .map_err(|_| tensor_err(label, &n("attn_qkv.weight"), "split into three"))?;
            let [gate, up]: [Weight; 2] = split(&n("ffn_up.weight"), &[c.ffn, c.ffn], c.hidden)?
                .try_into()
                .map_err(|_| tensor_err(label, &n("ffn_up.weight"), "split into two"))?;
            let down = matrix(&n("ffn_down.weight"), c.hidden, c.ffn)?;
            (q, k, v, FeedForward::Dense(GatedMlp { gate, up, down, bias: None }))
        } else {
            let ffn = match c.moe {
                // One 3-D tensor per projection, `[cols, rows, experts]`: expert e's rows are
                // the e-th run of `rows`, split into views without copying.
                Some(m) => {
                    let experts = |s: &str, rows: usize, cols: usize| -> Result<Vec<Weight>> {
                        let name = n(s);
                        let t = f.header().tensor(&name).ok_or_else(|| tensor_err(label, &name, "missing"))?;
                        if t.dims.as_slice() != [cols as u64, rows as u64, m.experts as u64] {
                            return Err(tensor_err(label, &name, format!("shape {:?}, expected [{cols}, {rows}, {}]", t.dims, m.experts)));
                        }
                        let start = base + t.offset as usize;
                        let storage = Storage::Mapped(map.clone(), start..start + t.n_bytes as usize);
                        Weight::split_rows(label, &name, dtype_of(t, label)?, &vec![rows; m.experts], cols, storage)
                    };
                    // GPT-OSS's per-expert biases: `[len, experts]`, expert e's the e-th run of `len`.
                    let biases = |s: &str, len: usize| -> Result<Option<Vec<Vec<f32>>>> {
                        let name = n(s);
                        let Some(t) = f.header().tensor(&name) else { return Ok(None) };
                        if t.dims.as_slice() != [len as u64, m.experts as u64] {
                            return Err(tensor_err(label, &name, format!("shape {:?}, expected [{len}, {}]", t.dims, m.experts)));
                        }
                        Ok(Some(small_vector(f, t, label)?.chunks_exact(len).map(<[f32]>::to_vec).collect()))
                    };
                    let gates = experts("ffn_gate_exps.weight", m.expert_ffn, c.hidden)?;
                    let ups = experts("ffn_up_exps.weight", m.expert_ffn, c.hidden)?;
                    let downs = experts("ffn_down_exps.weight", c.hidden, m.expert_ffn)?;
                    let mut bias = match (
                        biases("ffn_gate_exps.bias", m.expert_ffn)?,
                        biases("ffn_up_exps.bias", m.expert_ffn)?,
                        biases("ffn_down_exps.bias", c.hidden)?,
                    ) {
                        (Some(g), Some(u), Some(d)) => {
                            g.into_iter().zip(u).zip(d).map(|((gate, up), down)| Some(MlpBias { gate, up, down })).collect()
                        }
                        (None, None, None) => (0..m.experts).map(|_| None).collect::<Vec<_>>(),
                        _ => {
                            return Err(tensor_err(label, &n("ffn_gate_exps.bias"), "the experts' gate, up and down biases come together"))
                        }
                    }
                    .into_iter();
                    FeedForward::Moe(MoeWeights {
                        router: matrix(&n("ffn_gate_inp.weight"), m.experts, c.hidden)?,
                        router_bias: opt_vector(&n("ffn_gate_inp.bias"), m.experts)?,
                        experts: gates
                            .into_iter()
                            .zip(ups)
                            .zip(downs)
                            .map(|((gate, up), down)| GatedMlp { gate, up, down, bias: bias.next().flatten() })
                            .collect(),
                    })
                }
                None => FeedForward::Dense(GatedMlp {
                    gate: matrix(&n("ffn_gate.weight"), c.ffn, c.hidden)?,
                    up: matrix(&n("ffn_up.weight"), c.ffn, c.hidden)?,
                    down: matrix(&n("ffn_down.weight"), c.hidden, c.ffn)?,
                    bias: None,
                }),
            };
            (
                matrix(&n("attn_q.weight"), c.q_width(), c.hidden)?,
                matrix(&n("attn_k.weight"), c.kv_width(), c.hidden)?,
                matrix(&n("attn_v.weight"), c.kv_width(), c.hidden)?,
                ffn,
            )
        };
        layers.push(LayerWeights {
            attn_norm: vector(&n("attn_norm.weight"), c.hidden)?,
            q,
            k,
            v,
            q_bias: opt_vector(&n("attn_q.bias"), c.q_width())?,
            k_bias: opt_vector(&n("attn_k.bias"), c.kv_width())?,
            v_bias: opt_vector(&n("attn_v.bias"), c.kv_width())?,
            q_norm: norm("attn_q_norm.weight")?,
            k_norm: norm("attn_k_norm.weight")?,
            o: matrix(&n("attn_output.weight"), c.hidden, c.q_width())?,
            o_bias: opt_vector(&n("attn_output.bias"), c.hidden)?,
            sinks: if c.arch == Arch::GptOss { Some(vector(&n("attn_sinks.weight"), c.num_heads)?) } else { None },
            post_attn_norm: if c.sandwich_norms { Some(vector(&n("post_attention_norm.weight"), c.hidden)?) } else { None },
            // GPT-OSS's norm before the mixture is `post_attention_norm` (llama.cpp's `attn_post_norm`).
            ffn_norm: vector(&n(if c.arch == Arch::GptOss { "post_attention_norm.weight" } else { "ffn_norm.weight" }), c.hidden)?,
            post_ffn_norm: if c.sandwich_norms { Some(vector(&n("post_ffw_norm.weight"), c.hidden)?) } else { None },
            ffn,
        });
    }
    let final_norm = vector("output_norm.weight", c.hidden)?;
    let (output, embed) = if untied { (matrix("output.weight", c.vocab, c.hidden)?, embed) } else { (embed.clone(), embed) };
    Ok(ModelWeights { embed, layers, final_norm, output })
}
