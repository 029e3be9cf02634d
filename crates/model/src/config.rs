//! `ModelConfig`: the shape and positional settings of a Llama-family model
//! (Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen3-MoE, Phi-3, Gemma 2, Gemma 3, GPT-OSS), read from a Hugging Face
//! `config.json` or from GGUF metadata, with each layer's attention geometry
//! (global, or a sliding window of W positions).
//!
//! Invariant: a validated config has `n_heads * head_dim` query width,
//! `n_heads % n_kv_heads == 0`, an even `head_dim`, an even rotary width of
//! at most `head_dim` (for every layer's RoPE), one [`LayerAttention`] per
//! layer with non-zero windows, and non-zero sizes, so the forward pass never
//! has to re-check shapes.

use crate::error::{config_err, Result};

/// Which family member this is; it decides tensor names and small details.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Llama 2 / 3 / 3.1 / 3.2 (and Mistral, which shares the layout).
    Llama,
    /// Mistral 7B-style: a Llama layout whose `sliding_window`, when below the context,
    /// limits every layer's attention to that many positions.
    Mistral,
    /// Qwen2 / Qwen2.5: bias on the q, k and v projections.
    Qwen2,
    /// Qwen3 (dense): no q/k/v bias, a per-head RMSNorm on queries and keys
    /// before RoPE, a head size that need not be `hidden / heads`.
    Qwen3,
    /// Phi-3 / Phi-3.5 / Phi-4-mini: fused q/k/v and gate/up projections in
    /// the files (split into views at load), partial rotary embeddings.
    Phi3,
    /// Gemma 3 (text): local (sliding) and global layers with their own RoPE bases, q/k
    /// RMSNorm, four norms per block with `(1 + w)` weights, a √hidden embedding scale, a
    /// GELU-tanh gated MLP and `query_pre_attn_scalar` as the attention scale.
    Gemma3,
    /// Gemma 2: Gemma 3's block without q/k norms, alternating sliding and global layers
    /// under one RoPE, and softcapping of the attention scores and the final logits.
    Gemma2,
    /// SmolLM3: a Llama layout whose every fourth layer (or those `no_rope_layers` marks)
    /// attends without rotary embeddings (NoPE).
    SmolLm3,
    /// Qwen3-MoE (Qwen3-30B-A3B and kin): Qwen3's attention, and in every layer a mixture of
    /// experts in place of the MLP ([`MoeConfig`]).
    Qwen3Moe,
    /// Mixtral: Mistral's block with a mixture of experts (`block_sparse_moe`, experts `w1`
    /// gate, `w3` up, `w2` down, the chosen weights always renormalized) in every layer.
    /// GGUF files carry it as `llama` with experts.
    Mixtral,
    /// GPT-OSS (gpt-oss-20b / -120b): alternating sliding (even layers) and global layers,
    /// a learned sink logit per head in every softmax, biases on q/k/v/o, YaRN RoPE, and in
    /// every layer a mixture of experts routed top-k on the router's logits (with bias), then
    /// a softmax over the chosen ([`MoeGating::TopKThenSoftmax`]), each expert a clamped
    /// SwiGLU ([`FfnActivation::SwigluOai`]) with biases. GGUF `gpt-oss`.
    GptOss,
}

impl Arch {
    /// Gemma 2 or 3: `(1 + w)` norms, four per block, √hidden embedding scale, GELU-tanh.
    pub fn is_gemma(self) -> bool {
        matches!(self, Arch::Gemma2 | Arch::Gemma3)
    }

    /// The feed-forward activation the architecture uses, whichever file format it came in.
    pub fn ffn_activation(self) -> FfnActivation {
        match self {
            _ if self.is_gemma() => FfnActivation::GeluTanh,
            Arch::GptOss => FfnActivation::SwigluOai,
            _ => FfnActivation::Silu,
        }
    }

    /// Parses a GGUF `general.architecture` or HF `model_type` value.
    pub fn parse(s: &str) -> Option<Arch> {
        match s {
            "llama" => Some(Arch::Llama),
            "mistral" => Some(Arch::Mistral),
            "qwen2" => Some(Arch::Qwen2),
            "qwen3" => Some(Arch::Qwen3),
            "phi3" => Some(Arch::Phi3),
            // HF `model_type` of Gemma3ForCausalLM; GGUF `general.architecture`.
            "gemma3_text" | "gemma3" => Some(Arch::Gemma3),
            "gemma2" => Some(Arch::Gemma2),
            "smollm3" => Some(Arch::SmolLm3),
            // HF `model_type`; GGUF `general.architecture`.
            "qwen3_moe" | "qwen3moe" => Some(Arch::Qwen3Moe),
            "mixtral" => Some(Arch::Mixtral),
            // HF `model_type`; GGUF `general.architecture`.
            "gpt_oss" | "gpt-oss" => Some(Arch::GptOss),
            _ => None,
        }
    }
    /// The canonical lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Phi3 => "phi3",
            Arch::Gemma3 => "gemma3",
            Arch::Gemma2 => "gemma2",
            Arch::SmolLm3 => "smollm3",
            Arch::Qwen3Moe => "qwen3_moe",
            Arch::Mixtral => "mixtral",
            Arch::GptOss => "gpt_oss",
        }
    }
    /// Every architecture, in the order error messages list them.
    pub const ALL: [Arch; 11] = [
        Arch::Llama,
        Arch::Mistral,
        Arch::Mixtral,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Phi3,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::SmolLm3,
        Arch::GptOss,
    ];

    /// The supported names, comma-separated, for error messages.
    pub fn supported_list() -> String {
        Arch::ALL.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
    }
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Hugging Face `rotate_half`: dimension i pairs with i + head_dim/2.
    /// Used for HF folders and for GGUF `qwen2`, `qwen3` and `phi3` (llama.cpp's NEOX mode).
    Neox,
    /// Adjacent pairs (2i, 2i+1). GGUF `llama` files store q/k rows permuted
    /// so that this is equivalent to `Neox` on the original weights.
    Interleaved,
}

/// Rotary embedding settings. `inv_freq` is fully resolved (scaling applied)
/// so the forward pass only multiplies positions by it.
#[derive(Clone, Debug, PartialEq)]
pub struct RopeConfig {
    /// Base frequency (`rope_theta`).
    pub theta: f32,
    /// Pairing of dimensions.
    pub style: RopeStyle,
    /// Inverse frequency per rotated dimension pair: `rotary_dim / 2` entries, where
    /// `rotary_dim <= head_dim` (Phi-3's partial rotary leaves the rest of each head as is).
    pub inv_freq: Vec<f32>,
    /// Human-readable description of any scaling, for fingerprints and logs.
    pub scaling: String,
}

/// Llama 3.1-style frequency scaling (HF `rope_scaling.rope_type == "llama3"`).
#[derive(Clone, Copy, Debug)]
pub struct Llama3Scaling {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_max_position: f32,
}

impl RopeConfig {
    /// Dimensions of each head that are rotated (`2 * inv_freq.len()`); the rest pass through.
    pub fn rotary_dim(&self) -> usize {
        2 * self.inv_freq.len()
    }

    /// Plain RoPE frequencies `theta^(-2i/d)` over `d = rotary_dim` rotated dimensions,
    /// computed in f64 as transformers does.
    pub fn base_inv_freq(theta: f32, rotary_dim: usize) -> Vec<f32> {
        (0..rotary_dim / 2).map(|i| (1.0 / (theta as f64).powf((2 * i) as f64 / rotary_dim as f64)) as f32).collect()
    }

    /// Phi-3's LongRoPE with its short factors, as transformers' `_compute_longrope_parameters`
    /// computes `inv_freq` for sequences within the original context: frequency `i` divided by
    /// `factors[i]` (`rotary_dim / 2` of them, checked by the caller).
    pub fn apply_longrope(inv_freq: &mut [f32], theta: f32, rotary_dim: usize, factors: &[f32]) {
        for (i, (f, &fac)) in inv_freq.iter_mut().zip(factors).enumerate() {
            // transformers: 1 / (ext_factors * base ** (arange(0, dim, 2).float() / dim)), in f32.
            let base = theta.powf((2 * i) as f32 / rotary_dim as f32);
            *f = 1.0 / (fac * base);
        }
    }

    /// LongRoPE's attention factor for a model extended from `original` to `max` positions:
    /// `sqrt(1 + ln(max / original) / ln(original))`, 1 when not extended.
    pub fn longrope_attn_factor(max: usize, original: usize) -> f32 {
        let scale = max as f64 / original as f64;
        if scale <= 1.0 {
            1.0
        } else {
            (1.0 + scale.ln() / (original as f64).ln()).sqrt() as f32
        }
    }

    /// Applies Llama 3.1 scaling exactly as transformers' `_compute_llama3_parameters`.
    pub fn apply_llama3(inv_freq: &mut [f32], s: Llama3Scaling) {
        let low_wavelen = s.original_max_position / s.low_freq_factor;
        let high_wavelen = s.original_max_position / s.high_freq_factor;
        for f in inv_freq.iter_mut() {
            let wavelen = 2.0 * std::f32::consts::PI / *f;
            if wavelen > low_wavelen {
                *f /= s.factor;
            } else if wavelen >= high_wavelen {
                let smooth = (s.original_max_position / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
                *f = (1.0 - smooth) * *f / s.factor + smooth * *f;
            }
        }
    }
}

/// How one layer's queries see the keys before them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayerAttention {
    /// Every earlier position (causal).
    Global,
    /// A query at position `p` sees keys at positions `k` with `p - window < k <= p`: the
    /// `window` most recent positions, its own included (transformers'
    /// `sliding_window_overlay`, `kv_idx > q_idx - sliding_window`; llama.cpp's
    /// `LLAMA_SWA_TYPE_STANDARD` hides `p - k >= window`). The KV store still keeps every
    /// token; the window is a mask.
    Sliding { window: usize },
}

impl LayerAttention {
    /// The window, for a sliding layer.
    pub fn window(self) -> Option<usize> {
        match self {
            LayerAttention::Global => None,
            LayerAttention::Sliding { window } => Some(window),
        }
    }

    /// Whether a query at `q_pos` may see a key at `k_pos` under this geometry (causality included).
    #[inline]
    pub fn sees(self, q_pos: usize, k_pos: usize) -> bool {
        k_pos <= q_pos && self.window().is_none_or(|w| q_pos - k_pos < w)
    }
}

/// The feed-forward activation of the gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FfnActivation {
    /// SiLU (SwiGLU): Llama, Mistral, Qwen, Phi-3.
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`): Gemma.
    GeluTanh,
    /// GPT-OSS's clamped SwiGLU (transformers' `GptOssExperts._apply_gate`, llama.cpp's
    /// `swiglu_oai`): the gate clamped above at 7, the up projection to ±7, then
    /// `gate · σ(1.702 · gate) · (up + 1)`. Both constants are fixed, as in llama.cpp.
    SwigluOai,
}

/// How a mixture's router turns logits into the chosen experts' weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoeGating {
    /// Softmax over every expert, then the `top_k` most probable (renormalized when
    /// `norm_top_k`): Qwen3-MoE, Mixtral.
    SoftmaxThenTopK,
    /// The `top_k` largest logits, then a softmax over those alone: GPT-OSS.
    TopKThenSoftmax,
}

/// A mixture-of-experts feed-forward block: per token the router picks `top_k` of `experts`
/// (by [`MoeGating`]), each runs its own gated MLP of width `expert_ffn`, and their outputs
/// are summed weighted by the router's weights (renormalized to sum to 1 when `norm_top_k`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MoeConfig {
    /// Experts per layer (`num_experts`).
    pub experts: usize,
    /// Experts each token runs (`num_experts_per_tok`).
    pub top_k: usize,
    /// Each expert's MLP width (`moe_intermediate_size`).
    pub expert_ffn: usize,
    /// Whether the chosen experts' probabilities are renormalized (`norm_topk_prob`).
    pub norm_top_k: bool,
    /// Softmax before or after choosing the experts.
    pub gating: MoeGating,
}

/// The shape of a Llama-family decoder.
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub arch: Arch,
    pub hidden: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    /// Rows of the embedding / output matrix (may exceed the tokenizer's vocabulary).
    pub vocab: usize,
    pub rms_eps: f32,
    pub rope: RopeConfig,
    /// Context length the model was trained for.
    pub max_positions: usize,
    pub qkv_bias: bool,
    /// Per-head RMSNorm on queries and keys after their projection, before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Factor on the rotated dimensions of queries and keys (LongRoPE's attention scaling,
    /// transformers' `attention_scaling` on cos/sin); 1 for every other RoPE.
    pub rope_attn_factor: f32,
    pub tied_embeddings: bool,
    /// Each layer's attention geometry (`num_layers` entries).
    pub layers: Vec<LayerAttention>,
    /// RoPE of the sliding layers where it differs from [`ModelConfig::rope`] (Gemma 3's
    /// `rope_local_base_freq`); `None`: every layer rotates with `rope`.
    pub rope_local: Option<RopeConfig>,
    /// Gemma's block: a norm after attention and one after the MLP (`post_attention_layernorm`,
    /// `post_feedforward_layernorm`) besides the two before them.
    pub sandwich_norms: bool,
    /// Factor on the token embeddings (Gemma: √hidden, rounded to the embedding's dtype as
    /// transformers computes it); 1 for the others.
    pub embed_scale: f32,
    /// The gated MLP's activation.
    pub ffn_act: FfnActivation,
    /// Factor on `q·k` (`1/√head_dim`, or Gemma's `query_pre_attn_scalar^-1/2`).
    pub attn_scale: f32,
    /// Gemma 2's attention softcapping: each scaled score `s` becomes `cap · tanh(s / cap)`.
    pub attn_softcap: Option<f32>,
    /// Gemma 2's final-logit softcapping: each logit `l` becomes `cap · tanh(l / cap)`.
    pub final_softcap: Option<f32>,
    /// Layers that attend without rotary embeddings (SmolLM3's NoPE layers); `None`: every
    /// layer rotates.
    pub no_rope: Option<NoRope>,
    /// Every layer's feed-forward block is a mixture of experts (Qwen3-MoE); `None`: one
    /// gated MLP of width `ffn`.
    pub moe: Option<MoeConfig>,
}

/// Which layers skip RoPE, and the identity rotation [`ModelConfig::layer_rope`] answers for
/// them (zero frequencies: cos 1, sin 0), so moving their cached keys leaves them as they are.
#[derive(Clone, Debug, PartialEq)]
pub struct NoRope {
    /// `true` for a layer without RoPE (`num_layers` entries).
    pub layers: Vec<bool>,
    /// `rope` with every frequency zero.
    pub identity: RopeConfig,
}

impl NoRope {
    /// `layers` (true: no RoPE) beside `rope`, the rotation of the others.
    pub fn new(layers: Vec<bool>, rope: &RopeConfig) -> NoRope {
        let identity = RopeConfig { inv_freq: vec![0.0; rope.inv_freq.len()], scaling: "none (NoPE layer)".into(), ..rope.clone() };
        NoRope { layers, identity }
    }
}

impl ModelConfig {
    /// The attention geometry of layer `li`.
    pub fn layer_attention(&self, li: usize) -> LayerAttention {
        self.layers.get(li).copied().unwrap_or(LayerAttention::Global)
    }

    /// The RoPE layer `li` rotates its queries and keys with (and that moving its cached keys uses).
    pub fn layer_rope(&self, li: usize) -> &RopeConfig {
        if let Some(n) = self.no_rope.as_ref().filter(|n| n.layers.get(li).copied().unwrap_or(false)) {
            return &n.identity;
        }
        match (&self.rope_local, self.layer_attention(li)) {
            (Some(local), LayerAttention::Sliding { .. }) => local,
            _ => &self.rope,
        }
    }

    /// Whether layer `li` rotates its queries and keys (false for a NoPE layer).
    pub fn uses_rope(&self, li: usize) -> bool {
        !self.no_rope.as_ref().is_some_and(|n| n.layers.get(li).copied().unwrap_or(false))
    }

    /// Whether any layer is sliding.
    pub fn has_sliding_layers(&self) -> bool {
        self.layers.iter().any(|l| l.window().is_some())
    }

    /// Width of one token's keys (or values) in one layer: `num_kv_heads * head_dim`.
    pub fn kv_width(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }
    /// Width of one token's queries: `num_heads * head_dim`.
    pub fn q_width(&self) -> usize {
        self.num_heads * self.head_dim
    }

    /// Checks the invariants in the module doc; `file` names the source in errors.
    pub fn validate(&self, file: &str) -> Result<()> {
        let nz = |field: &str, v: usize| {
            if v == 0 {
                Err(config_err(file, field, "must be greater than zero"))
            } else {
                Ok(())
            }
        };
        nz("hidden_size", self.hidden)?;
        nz("num_hidden_layers", self.num_layers)?;
        nz("num_attention_heads", self.num_heads)?;
        nz("num_key_value_heads", self.num_kv_heads)?;
        nz("head_dim", self.head_dim)?;
        nz("intermediate_size", self.ffn)?;
        nz("vocab_size", self.vocab)?;
        if self.num_heads % self.num_kv_heads != 0 {
            return Err(config_err(
                file,
                "num_key_value_heads",
                format!("{} query heads are not a multiple of {} kv heads", self.num_heads, self.num_kv_heads),
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(config_err(file, "head_dim", format!("{} is odd; RoPE needs pairs", self.head_dim)));
        }
        if self.rope.inv_freq.is_empty() || self.rope.rotary_dim() > self.head_dim {
            return Err(config_err(
                file,
                "rope",
                format!("{} rotated dimensions for head_dim {} (expected 2..=head_dim)", self.rope.rotary_dim(), self.head_dim),
            ));
        }
        if let Some(local) = &self.rope_local {
            if local.inv_freq.is_empty() || local.rotary_dim() > self.head_dim {
                return Err(config_err(
                    file,
                    "rope (sliding layers)",
                    format!("{} rotated dimensions for head_dim {}", local.rotary_dim(), self.head_dim),
                ));
            }
        }
        if self.layers.len() != self.num_layers {
            return Err(config_err(file, "layer_types", format!("{} layer kinds for {} layers", self.layers.len(), self.num_layers)));
        }
        if self.no_rope.as_ref().is_some_and(|n| n.layers.len() != self.num_layers) {
            return Err(config_err(file, "no_rope_layers", format!("not one entry per layer ({} layers)", self.num_layers)));
        }
        if self.layers.iter().any(|l| l.window() == Some(0)) {
            return Err(config_err(file, "sliding_window", "must be greater than zero"));
        }
        let positive = |x: f32| x > 0.0 && x.is_finite();
        if !positive(self.attn_scale) || !positive(self.embed_scale) {
            return Err(config_err(file, "attention / embedding scale", "must be positive"));
        }
        if [self.attn_softcap, self.final_softcap].iter().flatten().any(|&c| !positive(c)) {
            return Err(config_err(file, "softcapping", "must be positive"));
        }
        if self.rope_attn_factor.is_nan() || self.rope_attn_factor <= 0.0 {
            return Err(config_err(file, "rope attention factor", "must be positive"));
        }
        if let Some(m) = self.moe {
            nz("num_experts", m.experts)?;
            nz("moe_intermediate_size", m.expert_ffn)?;
            if m.top_k == 0 || m.top_k > m.experts {
                return Err(config_err(file, "num_experts_per_tok", format!("{} of {} experts", m.top_k, m.experts)));
            }
        }
        if !(self.rms_eps > 0.0) {
            return Err(config_err(file, "rms_norm_eps", "must be positive"));
        }
        Ok(())
    }
}
