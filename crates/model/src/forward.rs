//! The Llama-family forward pass over a batch of sequences.
//!
//! One call runs any mix of sequences — prompt chunks and single decode
//! tokens — through every layer together, so each weight matrix is read once
//! per step however many sequences are in it. Each sequence brings its own
//! [`KvCache`]; attention for different sequences never mixes.
//!
//! Data flow per layer (rows = all tokens of the step):
//! `x -> rms_norm -> q,k,v (+bias) -> (per-head q/k rms_norm) -> rope ->
//! kv.write -> attention over kv -> o_proj -> +x -> rms_norm -> gate,up ->
//! swiglu -> down -> +x` (or, in a mixture-of-experts layer, the router's top experts'
//! MLPs summed by weight, `moe.rs`). The q/k norm is Qwen3's and Gemma's; Phi-3's fused
//! projections arrive here already split (`Weight::split_rows`), and its
//! partial rotary is the RoPE table's width. Gemma scales the embeddings,
//! rotates sliding layers with their own RoPE table, norms the attention and
//! MLP outputs before each residual add (`sandwich_norms`) and gates with
//! GELU-tanh; a sliding layer's attention sees only its window (`attention.rs`);
//! Gemma 2 softcaps the attention scores and the final logits (`cap·tanh(x/cap)`).
//! GPT-OSS adds a bias after the output projection, a sink logit per head to each softmax
//! (`attention.rs`) and routes its experts top-k first (`moe.rs`).

use std::sync::OnceLock;

use crate::attention::{attend_layer, AttnTask, LayerScoring};
use crate::error::{ModelError, Result};
use crate::kv::KvCache;
use crate::model::Model;
use crate::ops::{add_bias, add_in_place, gated_activation, rms_norm, rms_norm_in_place};
use crate::rope::{self, RopeTable};
use crate::view::KeyMask;
use crate::weights::FeedForward;
use engram_kernels::{matmul, matmul_multi};

/// Which logits a sequence wants back from a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (a prompt chunk that is not the last).
    None,
    /// Only for the last token of the chunk (generation).
    Last,
    /// For every token of the chunk (scoring, tests).
    All,
    /// No logits: every token's final-normed hidden state instead (the rows the LM head
    /// would multiply; `tokens * hidden` floats), for pooling into a text vector.
    Hidden,
}

/// One sequence's part of a step.
pub struct SeqStep<'a> {
    /// Tokens to run, stored in the cache from slot `first_pos` on.
    pub tokens: &'a [u32],
    /// The slot the first token is written to, and, unless `positions` is given, the
    /// position of the first token (token `i` at `first_pos + i`: a linear sequence).
    pub first_pos: usize,
    /// The logical position of each token (RoPE and causality), when they are not
    /// `first_pos ..`: a tree of drafts, a sequence whose cache holds moved spans.
    pub positions: Option<&'a [u32]>,
    /// Which keys of the cache's view each token may see (`view.rs`); `None`: all of them
    /// (causality still applies).
    pub key_mask: Option<&'a KeyMask>,
    /// The sequence's cache; must already hold what the tokens attend to and have room for the tokens.
    pub kv: &'a mut dyn KvCache,
    pub logits: Logits,
}

impl<'a> SeqStep<'a> {
    /// A linear step: `tokens` at positions (and slots) `first_pos ..`, no mask.
    pub fn new(tokens: &'a [u32], first_pos: usize, kv: &'a mut dyn KvCache, logits: Logits) -> SeqStep<'a> {
        SeqStep { tokens, first_pos, positions: None, key_mask: None, kv, logits }
    }

    /// Logical positions of the step's tokens.
    pub fn token_positions(&self) -> Vec<u32> {
        match self.positions {
            Some(p) => p.to_vec(),
            None => (self.first_pos..self.first_pos + self.tokens.len()).map(|p| p as u32).collect(),
        }
    }
}

impl Model {
    /// Runs one step. Returns, per sequence, its logits: empty for
    /// [`Logits::None`], `vocab` floats for `Last`, `tokens * vocab` for `All`;
    /// for `Hidden`, `tokens * hidden` final-normed states (no LM head).
    pub fn forward(&self, seqs: &mut [SeqStep<'_>]) -> Result<Vec<Vec<f32>>> {
        self.run_layers(seqs, None)
    }

    /// Runs layers `0..last_layer` of one step whole and layer `last_layer` only as far as
    /// writing its keys and values to the caches, then stops (no logits; `Logits` is
    /// ignored). Invariant: every cache write it makes is the one [`Model::forward`] makes for
    /// the same step (same code path, cut short). CacheBlend-style selective recomputation
    /// uses it to read a deep layer's fresh K/V of every reused token at a fraction of a
    /// forward pass.
    pub fn write_kv_through(&self, seqs: &mut [SeqStep<'_>], last_layer: usize) -> Result<()> {
        if last_layer >= self.config.num_layers {
            return Err(ModelError::BadInput(format!("layer {last_layer} of {}", self.config.num_layers)));
        }
        self.run_layers(seqs, Some(last_layer)).map(|_| ())
    }

    fn run_layers(&self, seqs: &mut [SeqStep<'_>], stop_after_write: Option<usize>) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        let total: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if total == 0 {
            return Err(ModelError::BadInput("a step needs at least one token".into()));
        }
        for s in seqs.iter() {
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(ModelError::BadInput(format!("token id {bad} is outside the vocabulary of {}", c.vocab)));
            }
            let limit = c.max_positions.max(1 << 20);
            let last = s.positions.map_or(s.first_pos + s.tokens.len(), |p| p.iter().map(|&x| x as usize + 1).max().unwrap_or(0));
            if last > limit || s.first_pos + s.tokens.len() > limit {
                return Err(ModelError::BadInput(format!("position {last} is beyond any supported context")));
            }
            if s.positions.is_some_and(|p| p.len() != s.tokens.len()) {
                return Err(ModelError::BadInput("a step's positions must name one position per token".into()));
            }
            if s.key_mask.is_some_and(|m| m.rows() != s.tokens.len()) {
                return Err(ModelError::BadInput("a step's key mask must have one row per token".into()));
            }
        }
        // A cache that failed before (`KvCache::read_failure`) takes no more steps.
        if let Some(e) = seqs.iter().find_map(|s| s.kv.read_failure()) {
            return Err(ModelError::Kv(e));
        }
        let (h, qw, kvw) = (c.hidden, c.q_width(), c.kv_width());
        let w = &self.weights;

        let mut x = vec![0.0f32; total * h];
        let mut row = 0;
        for s in seqs.iter() {
            for &t in s.tokens {
                let xr = &mut x[row * h..(row + 1) * h];
                w.embed.row_f32(t as usize, xr);
                if c.embed_scale != 1.0 {
                    xr.iter_mut().for_each(|v| *v *= c.embed_scale);
                }
                row += 1;
            }
        }
        for s in seqs.iter_mut() {
            if let Some(p) = s.positions {
                s.kv.place(s.first_pos, p).map_err(ModelError::BadInput)?;
            }
        }
        let positions: Vec<Vec<u32>> = seqs.iter().map(|s| s.token_positions()).collect();
        let table = RopeTable::new(&c.rope, positions.iter().flatten().map(|&p| p as usize)).scaled(c.rope_attn_factor);
        let table_local =
            c.rope_local.as_ref().map(|r| RopeTable::new(r, positions.iter().flatten().map(|&p| p as usize)).scaled(c.rope_attn_factor));

        let mut xn = vec![0.0f32; total * h];
        let mut q = vec![0.0f32; total * qw];
        let mut k = vec![0.0f32; total * kvw];
        let mut v = vec![0.0f32; total * kvw];
        let mut attn = vec![0.0f32; total * qw];
        let mut proj = vec![0.0f32; total * h];
        let mut gate = vec![0.0f32; total * c.ffn];
        let mut up = vec![0.0f32; total * c.ffn];
        let group = c.num_heads / c.num_kv_heads;

        for (li, lw) in w.layers.iter().enumerate() {
            rms_norm(&x, &lw.attn_norm, c.rms_eps, &mut xn);
            // q, k, v in one parallel region (bitwise equal to three matmul calls).
            matmul_multi(&[&lw.q.matrix(), &lw.k.matrix(), &lw.v.matrix()], &xn, total, &mut [&mut q, &mut k, &mut v]);
            if let Some(b) = &lw.q_bias {
                add_bias(&mut q, b);
            }
            if let Some(b) = &lw.k_bias {
                add_bias(&mut k, b);
            }
            if let Some(b) = &lw.v_bias {
                add_bias(&mut v, b);
            }
            if let Some(w) = &lw.q_norm {
                rms_norm_in_place(&mut q, w, c.rms_eps);
            }
            if let Some(w) = &lw.k_norm {
                rms_norm_in_place(&mut k, w, c.rms_eps);
            }
            let geometry = c.layer_attention(li);
            let table = match (&table_local, geometry.window()) {
                (Some(local), Some(_)) => local,
                _ => &table,
            };
            if c.uses_rope(li) {
                rope::apply(c.rope.style, table, &mut q, c.head_dim);
                rope::apply(c.rope.style, table, &mut k, c.head_dim);
            }

            let mut row0 = 0;
            for s in seqs.iter_mut() {
                let n = s.tokens.len();
                s.kv.write(li, s.first_pos, &k[row0 * kvw..(row0 + n) * kvw], &v[row0 * kvw..(row0 + n) * kvw], n);
                row0 += n;
            }
            if stop_after_write == Some(li) {
                return Ok(Vec::new());
            }

            let scoring = LayerScoring { scale: c.attn_scale, geometry, softcap: c.attn_softcap, sinks: lw.sinks.as_deref() };
            // One task per (sequence, kv head): disjoint outputs, shared read-only caches.
            let mut tasks = Vec::new();
            let mut row0 = 0;
            for (s, pos) in seqs.iter().zip(&positions) {
                let n = s.tokens.len();
                for g in 0..c.num_kv_heads {
                    tasks.push((
                        row0,
                        AttnTask {
                            kv: &*s.kv,
                            layer: li,
                            q: &q[row0 * qw..(row0 + n) * qw],
                            num_queries: n,
                            positions: pos,
                            key_mask: s.key_mask,
                            kv_head: g,
                            group,
                            head_dim: c.head_dim,
                            num_heads: c.num_heads,
                            precision: self.attention(),
                        },
                    ));
                }
                row0 += n;
            }
            let outs: Vec<OnceLock<Vec<f32>>> = tasks.iter().map(|_| OnceLock::new()).collect();
            engram_kernels::parallel_for(tasks.len(), &|i| {
                let _ = outs[i].set(attend_layer(&tasks[i].1, scoring));
            });
            for ((row0, t), out) in tasks.iter().zip(outs.into_iter().map(|o| o.into_inner().expect("every attention task ran"))) {
                let span = t.group * t.head_dim;
                for qi in 0..t.num_queries {
                    let dst = (row0 + qi) * qw + t.kv_head * span;
                    attn[dst..dst + span].copy_from_slice(&out[qi * span..(qi + 1) * span]);
                }
            }

            // A cache that could not produce what it was asked (its disk store failed) ends
            // the step: its attention output is not an answer.
            for s in seqs.iter() {
                if let Some(e) = s.kv.read_failure() {
                    return Err(ModelError::Kv(format!("layer {li}: {e}")));
                }
            }

            matmul(&lw.o.matrix(), &attn, total, &mut proj);
            if let Some(b) = &lw.o_bias {
                add_bias(&mut proj, b);
            }
            if let Some(w) = &lw.post_attn_norm {
                rms_norm_in_place(&mut proj, w, c.rms_eps);
            }
            add_in_place(&mut x, &proj);
            rms_norm(&x, &lw.ffn_norm, c.rms_eps, &mut xn);
            match (&lw.ffn, c.moe) {
                (FeedForward::Moe(moe), Some(cfg)) => crate::moe::moe_ffn(moe, cfg, c.ffn_act, &xn, total, h, &mut proj),
                (FeedForward::Dense(mlp), _) => {
                    matmul_multi(&[&mlp.gate.matrix(), &mlp.up.matrix()], &xn, total, &mut [&mut gate, &mut up]);
                    if let Some(b) = &mlp.bias {
                        add_bias(&mut gate, &b.gate);
                        add_bias(&mut up, &b.up);
                    }
                    gated_activation(c.ffn_act, &mut gate, &up);
                    matmul(&mlp.down.matrix(), &gate, total, &mut proj);
                    if let Some(b) = &mlp.bias {
                        add_bias(&mut proj, &b.down);
                    }
                }
                (FeedForward::Moe(_), None) => {
                    return Err(ModelError::BadInput(format!("layer {li} holds experts the config does not describe")))
                }
            }
            if let Some(w) = &lw.post_ffn_norm {
                rms_norm_in_place(&mut proj, w, c.rms_eps);
            }
            add_in_place(&mut x, &proj);
        }

        // Final norm and output projection only for the rows someone asked for.
        let mut want = Vec::new();
        let mut row0 = 0;
        for s in seqs.iter() {
            let n = s.tokens.len();
            match s.logits {
                Logits::None | Logits::Hidden => {}
                Logits::Last => want.push(row0 + n - 1),
                Logits::All => want.extend(row0..row0 + n),
            }
            row0 += n;
        }
        let mut logits_all = Vec::new();
        if !want.is_empty() {
            let mut sel = vec![0.0f32; want.len() * h];
            for (i, &r) in want.iter().enumerate() {
                rms_norm(&x[r * h..(r + 1) * h], &w.final_norm, c.rms_eps, &mut sel[i * h..(i + 1) * h]);
            }
            logits_all = vec![0.0f32; want.len() * c.vocab];
            matmul(&w.output.matrix(), &sel, want.len(), &mut logits_all);
            if let Some(cap) = c.final_softcap {
                logits_all.iter_mut().for_each(|l| *l = cap * (*l / cap).tanh());
            }
        }
        let mut out = Vec::with_capacity(seqs.len());
        let (mut cursor, mut row0) = (0, 0);
        for s in seqs.iter() {
            let n = s.tokens.len();
            let rows = match s.logits {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All => n,
                Logits::Hidden => {
                    // The same normed rows the LM head would be fed, so `hidden × output = All`.
                    let mut hid = vec![0.0f32; n * h];
                    rms_norm(&x[row0 * h..(row0 + n) * h], &w.final_norm, c.rms_eps, &mut hid);
                    out.push(hid);
                    row0 += n;
                    continue;
                }
            };
            out.push(logits_all[cursor * c.vocab..(cursor + rows) * c.vocab].to_vec());
            cursor += rows;
            row0 += n;
        }
        Ok(out)
    }
}
