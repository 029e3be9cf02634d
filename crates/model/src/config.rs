//! `ModelConfig`: the shape and positional settings of a Llama-family model,
//! read from a Hugging Face `config.json` or from GGUF metadata.
//!
//! Invariant: a validated config has `n_heads * head_dim` query width,
//! `n_heads % n_kv_heads == 0`, an even `head_dim`, and non-zero sizes, so
//! the forward pass never has to re-check shapes.

use crate::error::{config_err, Result};

/// Which family member this is; it decides tensor names and small details.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Llama 2 / 3 / 3.1 / 3.2 (and Mistral, which shares the layout).
    Llama,
    /// Mistral 7B-style (a Llama layout; sliding window is not applied).
    Mistral,
    /// Qwen2 / Qwen2.5: bias on the q, k and v projections.
    Qwen2,
}

impl Arch {
    /// Parses a GGUF `general.architecture` or HF `model_type` value.
    pub fn parse(s: &str) -> Option<Arch> {
        match s {
            "llama" => Some(Arch::Llama),
            "mistral" => Some(Arch::Mistral),
            "qwen2" => Some(Arch::Qwen2),
            _ => None,
        }
    }
    /// The canonical lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
            Arch::Qwen2 => "qwen2",
        }
    }
}

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// Hugging Face `rotate_half`: dimension i pairs with i + head_dim/2.
    /// Used for HF folders and for GGUF `qwen2` (llama.cpp's NEOX mode).
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
    /// Inverse frequency per dimension pair, `head_dim / 2` entries.
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
    /// Plain RoPE frequencies `theta^(-2i/d)`, computed in f64 as transformers does.
    pub fn base_inv_freq(theta: f32, head_dim: usize) -> Vec<f32> {
        (0..head_dim / 2).map(|i| (1.0 / (theta as f64).powf((2 * i) as f64 / head_dim as f64)) as f32).collect()
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
    pub tied_embeddings: bool,
}

impl ModelConfig {
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
        if self.rope.inv_freq.len() != self.head_dim / 2 {
            return Err(config_err(file, "rope", "frequency table does not match head_dim / 2"));
        }
        if !(self.rms_eps > 0.0) {
            return Err(config_err(file, "rms_norm_eps", "must be positive"));
        }
        Ok(())
    }
}
