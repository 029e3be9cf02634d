//! The Llama-family forward pass over a batch of sequences.
//!
//! One call runs any mix of sequences — prompt chunks and single decode
//! tokens — through every layer together, so each weight matrix is read once
//! per step however many sequences are in it. Each sequence brings its own
//! [`KvCache`]; attention for different sequences never mixes.
//!
//! Data flow per layer (rows = all tokens of the step):
//! `x -> rms_norm -> q,k,v (+bias) -> rope -> kv.write -> attention over kv ->
//! o_proj -> +x -> rms_norm -> gate,up -> swiglu -> down -> +x`.

use rayon::prelude::*;

use crate::attention::{attend, AttnTask};
use crate::error::{ModelError, Result};
use crate::kv::KvCache;
use crate::model::Model;
use crate::ops::{add_bias, add_in_place, rms_norm, swiglu};
use crate::rope::{self, RopeTable};
use engram_kernels::matmul;

/// Which logits a sequence wants back from a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Logits {
    /// None (a prompt chunk that is not the last).
    None,
    /// Only for the last token of the chunk (generation).
    Last,
    /// For every token of the chunk (scoring, tests).
    All,
}

/// One sequence's part of a step.
pub struct SeqStep<'a> {
    /// Tokens to run, at positions `first_pos ..`.
    pub tokens: &'a [u32],
    pub first_pos: usize,
    /// The sequence's cache; must already hold positions `< first_pos` and have room for the tokens.
    pub kv: &'a mut dyn KvCache,
    pub logits: Logits,
}

impl Model {
    /// Runs one step. Returns, per sequence, its logits: empty for
    /// [`Logits::None`], `vocab` floats for `Last`, `tokens * vocab` for `All`.
    pub fn forward(&self, seqs: &mut [SeqStep<'_>]) -> Result<Vec<Vec<f32>>> {
        let c = &self.config;
        let total: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        if total == 0 {
            return Err(ModelError::BadInput("a step needs at least one token".into()));
        }
        for s in seqs.iter() {
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= c.vocab) {
                return Err(ModelError::BadInput(format!("token id {bad} is outside the vocabulary of {}", c.vocab)));
            }
            if s.first_pos + s.tokens.len() > c.max_positions.max(1 << 20) {
                return Err(ModelError::BadInput(format!("position {} is beyond any supported context", s.first_pos + s.tokens.len())));
            }
        }
        let (h, qw, kvw) = (c.hidden, c.q_width(), c.kv_width());
        let w = &self.weights;

        let mut x = vec![0.0f32; total * h];
        let mut row = 0;
        for s in seqs.iter() {
            for &t in s.tokens {
                w.embed.row_f32(t as usize, &mut x[row * h..(row + 1) * h]);
                row += 1;
            }
        }
        let positions = seqs.iter().flat_map(|s| s.first_pos..s.first_pos + s.tokens.len());
        let table = RopeTable::new(&c.rope, positions.collect::<Vec<_>>().into_iter());

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
            matmul(&lw.q.matrix(), &xn, total, &mut q);
            matmul(&lw.k.matrix(), &xn, total, &mut k);
            matmul(&lw.v.matrix(), &xn, total, &mut v);
            if let Some(b) = &lw.q_bias {
                add_bias(&mut q, b);
            }
            if let Some(b) = &lw.k_bias {
                add_bias(&mut k, b);
            }
            if let Some(b) = &lw.v_bias {
                add_bias(&mut v, b);
            }
            rope::apply(c.rope.style, &table, &mut q, c.head_dim);
            rope::apply(c.rope.style, &table, &mut k, c.head_dim);

            let mut row0 = 0;
            for s in seqs.iter_mut() {
                let n = s.tokens.len();
                s.kv.write(li, s.first_pos, &k[row0 * kvw..(row0 + n) * kvw], &v[row0 * kvw..(row0 + n) * kvw], n);
                row0 += n;
            }

            // One task per (sequence, kv head): disjoint outputs, shared read-only caches.
            let mut tasks = Vec::new();
            let mut row0 = 0;
            for s in seqs.iter() {
                let n = s.tokens.len();
                for g in 0..c.num_kv_heads {
                    tasks.push((
                        row0,
                        AttnTask {
                            kv: &*s.kv,
                            layer: li,
                            q: &q[row0 * qw..(row0 + n) * qw],
                            num_queries: n,
                            first_pos: s.first_pos,
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
            let outs: Vec<Vec<f32>> = engram_kernels::pool().install(|| tasks.par_iter().map(|(_, t)| attend(t)).collect());
            for ((row0, t), out) in tasks.iter().zip(outs) {
                let span = t.group * t.head_dim;
                for qi in 0..t.num_queries {
                    let dst = (row0 + qi) * qw + t.kv_head * span;
                    attn[dst..dst + span].copy_from_slice(&out[qi * span..(qi + 1) * span]);
                }
            }

            matmul(&lw.o.matrix(), &attn, total, &mut proj);
            add_in_place(&mut x, &proj);
            rms_norm(&x, &lw.ffn_norm, c.rms_eps, &mut xn);
            matmul(&lw.gate.matrix(), &xn, total, &mut gate);
            matmul(&lw.up.matrix(), &xn, total, &mut up);
            swiglu(&mut gate, &up);
            matmul(&lw.down.matrix(), &gate, total, &mut proj);
            add_in_place(&mut x, &proj);
        }

        // Final norm and output projection only for the rows someone asked for.
        let mut want = Vec::new();
        let mut row0 = 0;
        for s in seqs.iter() {
            let n = s.tokens.len();
            match s.logits {
                Logits::None => {}
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
        }
        let mut out = Vec::with_capacity(seqs.len());
        let mut cursor = 0;
        for s in seqs.iter() {
            let rows = match s.logits {
                Logits::None => 0,
                Logits::Last => 1,
                Logits::All => s.tokens.len(),
            };
            out.push(logits_all[cursor * c.vocab..(cursor + rows) * c.vocab].to_vec());
            cursor += rows;
        }
        Ok(out)
    }
}
