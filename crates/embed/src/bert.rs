//! BERT (Devlin et al.), post-LayerNorm encoder, as Hugging Face's
//! `BertModel` runs it: word + absolute position + token-type embeddings,
//! LayerNorm, then per layer self-attention → dense → LayerNorm(+residual) →
//! GELU MLP → LayerNorm(+residual). Field names follow the checkpoint's
//! tensor names (`attention.self.query`, `intermediate.dense`, ...).
//!
//! Sequences are packed, not padded: a batch is the concatenation of its
//! sequences' rows, and attention runs per sequence over its own rows, which
//! is what a padding mask achieves without computing the padded rows.
//!
//! Invariant: the weights are immutable (`&self`); a sequence's output rows
//! are bitwise the same alone or in any batch (`tests/it/batch.rs`).

use std::ops::Range;

use crate::config::BertConfig;
use crate::error::{EmbedError, Result};
use crate::ops::{attention, gelu, LayerNorm, Linear};
use crate::weights::{Tensor, Weights};

struct Embeddings {
    word_embeddings: Tensor,
    /// `[max_position_embeddings, hidden]`, decoded.
    position_embeddings: Vec<f32>,
    /// Row 0 of `token_type_embeddings` (single-segment inputs only).
    token_type_0: Vec<f32>,
    layer_norm: LayerNorm,
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    /// `attention.output.dense` and its `LayerNorm`.
    attention_output: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    /// `output.dense` and its `LayerNorm`.
    output: Linear,
    output_norm: LayerNorm,
}

/// The encoder's weights and shape.
pub(crate) struct Bert {
    pub config: BertConfig,
    embeddings: Embeddings,
    layers: Vec<Layer>,
}

fn linear(w: &Weights, name: &str, rows: usize, cols: usize) -> Result<Linear> {
    Ok(Linear { weight: w.get(&format!("{name}.weight"), &[rows, cols])?, bias: w.vector(&format!("{name}.bias"), rows)? })
}

fn layer_norm(w: &Weights, name: &str, h: usize, eps: f64) -> Result<LayerNorm> {
    Ok(LayerNorm { weight: w.vector(&format!("{name}.weight"), h)?, bias: w.vector(&format!("{name}.bias"), h)?, eps })
}

impl Bert {
    /// Looks up and checks every tensor `config` implies.
    pub fn load(w: &Weights, config: BertConfig) -> Result<Bert> {
        let (h, i, eps) = (config.hidden_size, config.intermediate_size, config.layer_norm_eps);
        let token_types = w.get("embeddings.token_type_embeddings.weight", &[config.type_vocab_size, h])?;
        let mut token_type_0 = vec![0.0; h];
        token_types.row_into(0, &mut token_type_0);
        let embeddings = Embeddings {
            word_embeddings: w.get("embeddings.word_embeddings.weight", &[config.vocab_size, h])?,
            position_embeddings: w.get("embeddings.position_embeddings.weight", &[config.max_position_embeddings, h])?.to_f32(),
            token_type_0,
            layer_norm: layer_norm(w, "embeddings.LayerNorm", h, eps)?,
        };
        let layers = (0..config.num_hidden_layers)
            .map(|l| {
                let p = format!("encoder.layer.{l}");
                Ok(Layer {
                    query: linear(w, &format!("{p}.attention.self.query"), h, h)?,
                    key: linear(w, &format!("{p}.attention.self.key"), h, h)?,
                    value: linear(w, &format!("{p}.attention.self.value"), h, h)?,
                    attention_output: linear(w, &format!("{p}.attention.output.dense"), h, h)?,
                    attention_norm: layer_norm(w, &format!("{p}.attention.output.LayerNorm"), h, eps)?,
                    intermediate: linear(w, &format!("{p}.intermediate.dense"), i, h)?,
                    output: linear(w, &format!("{p}.output.dense"), h, i)?,
                    output_norm: layer_norm(w, &format!("{p}.output.LayerNorm"), h, eps)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Bert { config, embeddings, layers })
    }

    /// The last layer's hidden states of every sequence, packed: returns
    /// `[Σ len, hidden]` and the row range of each sequence. Each sequence is
    /// a whole tokenized text (`[CLS] … [SEP]`), at most
    /// `max_position_embeddings` ids below `vocab_size`, never empty.
    pub fn forward(&self, seqs: &[&[u32]]) -> Result<(Vec<f32>, Vec<Range<usize>>)> {
        let c = &self.config;
        let h = c.hidden_size;
        let mut ranges = Vec::with_capacity(seqs.len());
        let mut start = 0;
        for (s, ids) in seqs.iter().enumerate() {
            if ids.is_empty() || ids.len() > c.max_position_embeddings {
                return Err(EmbedError::BadInput(format!(
                    "sequence {s} has {} tokens; 1 to {} are allowed",
                    ids.len(),
                    c.max_position_embeddings
                )));
            }
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= c.vocab_size) {
                return Err(EmbedError::BadInput(format!("sequence {s}: token id {bad} is outside the vocabulary of {}", c.vocab_size)));
            }
            ranges.push(start..start + ids.len());
            start += ids.len();
        }
        let n = start;
        let mut x = vec![0.0f32; n * h];
        let e = &self.embeddings;
        for (ids, r) in seqs.iter().zip(&ranges) {
            for (pos, (&id, t)) in ids.iter().zip(r.clone()).enumerate() {
                let row = &mut x[t * h..][..h];
                e.word_embeddings.row_into(id as usize, row);
                let p = &e.position_embeddings[pos * h..][..h];
                for ((v, p), tt) in row.iter_mut().zip(p).zip(&e.token_type_0) {
                    // HF adds word + token type first, then position.
                    *v = *v + tt + p;
                }
            }
        }
        e.layer_norm.forward(&mut x);

        let (mut q, mut k, mut v) = (vec![0.0; n * h], vec![0.0; n * h], vec![0.0; n * h]);
        let mut ctx = vec![0.0; n * h];
        let mut a = vec![0.0; n * h];
        let mut mid = vec![0.0; n * c.intermediate_size];
        for layer in &self.layers {
            layer.query.forward(&x, n, &mut q);
            layer.key.forward(&x, n, &mut k);
            layer.value.forward(&x, n, &mut v);
            attention(&q, &k, &v, &ranges, c.num_attention_heads, c.head_dim(), &mut ctx);
            layer.attention_output.forward(&ctx, n, &mut a);
            layer.attention_norm.forward_residual(&mut a, &x);
            std::mem::swap(&mut x, &mut a);
            layer.intermediate.forward(&x, n, &mut mid);
            gelu(&mut mid, layer.intermediate.rows());
            layer.output.forward(&mid, n, &mut a);
            layer.output_norm.forward_residual(&mut a, &x);
            std::mem::swap(&mut x, &mut a);
        }
        Ok((x, ranges))
    }
}
