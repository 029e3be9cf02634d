//! [`PooledEncoder`]: the loaded LLM as a text encoder — the fallback for
//! `/v1/embeddings` and relevance ranking where no sentence encoder is
//! installed. A text's vector is the mean of its tokens' final-normed hidden
//! states (`Logits::Hidden`: the rows the LM head reads), L2-normalized.
//!
//! NOTE (choices): a text is tokenized as a prompt is (the model's special
//! tokens, so BOS where the model wants one, since models misbehave without
//! it), but the BOS state is left out of the mean: it is the same for every
//! text and would pull all vectors together. Texts are cut at
//! [`MAX_TEXT_TOKENS`] (sentence encoders truncate too). An empty text is its
//! BOS (or EOS) state alone. Keys and values live in a scratch f32 pool made
//! per batch and dropped with it, not in the server's KV budget.
//!
//! Invariant: a text's vector depends on that text only — every text is its
//! own sequence with its own cache, and matmul rows and attention do not see
//! the step's other rows — bitwise, whatever else is in the call
//! (`tests/it/pooled.rs`).

use std::fmt;
use std::sync::Arc;

use engram_embed::{normalize, EmbedError, Embeddings, TextEncoder};
use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv, BLOCK_TOKENS};
use engram_model::{Logits, Model, SeqStep};

/// Tokens a text is cut to, BOS included.
pub const MAX_TEXT_TOKENS: usize = 512;

/// Tokens per forward pass (whole texts; a longer text runs alone).
const MAX_BATCH_TOKENS: usize = 1024;

/// What the id of a pooled encoder ends with: `<llm id>:pooled-hidden`.
pub const POOLED_SUFFIX: &str = "pooled-hidden";

/// The LLM's mean-pooled, normalized final hidden states as a [`TextEncoder`].
pub struct PooledEncoder {
    model: Arc<Model>,
    id: String,
    /// Bytes of one f32 KV block of this model (a scratch pool is sized in blocks).
    block_bytes: usize,
}

impl fmt::Debug for PooledEncoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledEncoder").field("id", &self.id).field("dim", &self.model.config.hidden).finish()
    }
}

impl PooledEncoder {
    /// The encoder over `model`, served as `<model_id>:pooled-hidden`.
    pub fn new(model: Arc<Model>, model_id: &str) -> PooledEncoder {
        let block_bytes = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, 0).block_bytes();
        PooledEncoder { id: format!("{model_id}:{POOLED_SUFFIX}"), model, block_bytes }
    }

    /// The ids the model runs for `text`: its prompt encoding, cut at [`MAX_TEXT_TOKENS`];
    /// never empty.
    pub fn tokenize(&self, text: &str) -> engram_embed::Result<Vec<u32>> {
        let tok = &self.model.tokenizer;
        let mut ids = tok.encode(text, true).map_err(|e| self.err(e))?.ids;
        ids.truncate(MAX_TEXT_TOKENS);
        if ids.is_empty() {
            ids.push(tok.bos_id().or(tok.eos_id()).unwrap_or(0));
        }
        Ok(ids)
    }

    /// Vectors of already tokenized texts (each non-empty), in order.
    pub fn embed_ids(&self, seqs: &[Vec<u32>]) -> engram_embed::Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(seqs.len());
        for range in engram_embed::token_batches(seqs, MAX_BATCH_TOKENS) {
            out.extend(self.embed_batch(&seqs[range])?);
        }
        Ok(out)
    }

    /// One forward pass over `seqs`, one sequence each.
    fn embed_batch(&self, seqs: &[Vec<u32>]) -> engram_embed::Result<Vec<Vec<f32>>> {
        if let Some(i) = seqs.iter().position(|s| s.is_empty()) {
            return Err(EmbedError::BadInput(format!("text {i} has no tokens")));
        }
        let blocks: usize = seqs.iter().map(|s| s.len().div_ceil(BLOCK_TOKENS)).sum();
        let pool = KvPool::new(KvLayout::of(&self.model.config), KvFormat::F32, blocks * self.block_bytes);
        let mut caches = Vec::with_capacity(seqs.len());
        for s in seqs {
            let mut kv = SeqKv::new(&pool);
            kv.reserve(s.len()).map_err(|e| self.err(e))?;
            caches.push(kv);
        }
        let mut steps: Vec<SeqStep<'_>> =
            seqs.iter().zip(caches.iter_mut()).map(|(s, kv)| SeqStep::new(s, 0, kv, Logits::Hidden)).collect();
        let hidden = self.model.forward(&mut steps).map_err(|e| self.err(e))?;
        let h = self.model.config.hidden;
        let bos = self.model.tokenizer.bos_id();
        Ok(seqs
            .iter()
            .zip(hidden)
            .map(|(ids, rows)| {
                let skip = usize::from(ids.len() > 1 && Some(ids[0]) == bos);
                let mut sum = vec![0.0f64; h];
                for row in rows.chunks_exact(h).skip(skip) {
                    sum.iter_mut().zip(row).for_each(|(s, &x)| *s += x as f64);
                }
                let n = (ids.len() - skip) as f64;
                let mut v: Vec<f32> = sum.iter().map(|s| (s / n) as f32).collect();
                normalize(&mut v);
                v
            })
            .collect())
    }

    fn err(&self, e: impl fmt::Display) -> EmbedError {
        EmbedError::Backend { encoder: self.id.clone(), reason: e.to_string() }
    }
}

impl TextEncoder for PooledEncoder {
    fn id(&self) -> &str {
        &self.id
    }

    fn dim(&self) -> usize {
        self.model.config.hidden
    }

    fn describe(&self) -> String {
        format!(
            "{} (the LLM's own final-normed hidden states, mean-pooled without BOS, normalized; dim {}; max {MAX_TEXT_TOKENS} tokens) of {}",
            self.id,
            self.model.config.hidden,
            self.model.describe()
        )
    }

    fn encode(&self, texts: &[String]) -> engram_embed::Result<Embeddings> {
        let ids = texts.iter().map(|t| self.tokenize(t)).collect::<engram_embed::Result<Vec<_>>>()?;
        let num_tokens = ids.iter().map(Vec::len).collect();
        Ok(Embeddings { vectors: self.embed_ids(&ids)?, num_tokens })
    }

    fn max_tokens(&self) -> Option<usize> {
        Some(MAX_TEXT_TOKENS)
    }

    /// No: a code model's hidden states rank prose pairs at chance (docs/embeddings.md).
    fn ranks_relevance(&self) -> bool {
        false
    }
}
