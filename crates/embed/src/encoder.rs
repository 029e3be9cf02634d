//! [`Encoder`]: a sentence-transformers folder loaded for use — tokenizer
//! (truncating at `max_seq_length`, never padding), BERT weights, pooling and
//! normalization — and `encode(texts) → vectors`.
//!
//! Invariant: a text's vector depends on that text only: not on the other
//! texts of the call, their number or order (`tests/it/batch.rs`), and equals
//! sentence-transformers' within cosine 0.9999 on the real all-MiniLM-L6-v2
//! (`tests/it/parity.rs`).

use std::fmt;
use std::path::{Path, PathBuf};

use tokenizers::{TruncationDirection, TruncationParams, TruncationStrategy};

use crate::bert::Bert;
use crate::config::{self, Layout, PoolingMode};
use crate::error::{EmbedError, Result};
use crate::vector::{normalize, pool};
use crate::weights::Weights;

/// Tokens per forward pass; longer calls are split (which cannot change any
/// result, see the invariant).
///
/// NOTE: the kernels' matmul keeps a chunk of weight rows in L2 and sweeps
/// every token's activations past it, so activations should stay in cache:
/// 512 tokens × 1536 (MiniLM's MLP width) × 4 bytes is 3 MiB.
const MAX_BATCH_TOKENS: usize = 512;

/// Vectors and token counts of one [`Encoder::encode`] call, in input order.
#[derive(Clone, Debug, Default)]
pub struct Embeddings {
    /// One vector of [`Encoder::dim`] floats per text.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens each text became after truncation, `[CLS]`/`[SEP]` included.
    pub num_tokens: Vec<usize>,
}

/// A loaded sentence encoder. Immutable; share it behind an `Arc`.
pub struct Encoder {
    id: String,
    dir: PathBuf,
    layout: Layout,
    bert: Bert,
    tokenizer: tokenizers::Tokenizer,
}

impl fmt::Debug for Encoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encoder")
            .field("id", &self.id)
            .field("dir", &self.dir)
            .field("dim", &self.dim())
            .field("layers", &self.bert.config.num_hidden_layers)
            .field("pooling", &self.layout.pooling)
            .field("normalize", &self.layout.normalize)
            .field("max_tokens", &self.layout.max_seq_length)
            .finish()
    }
}

/// The id a folder is served under: its name, or its parent's when it is
/// the generic `model` folder inside a Python package.
fn default_id(dir: &Path) -> String {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    match name(dir) {
        Some(n) if n != "model" => n,
        _ => dir.parent().and_then(name).unwrap_or_else(|| "encoder".into()),
    }
}

impl Encoder {
    /// Loads the sentence-transformers folder `dir` (`modules.json`,
    /// `config.json`, `model.safetensors`, `tokenizer.json`, `1_Pooling/`).
    /// Every file is checked; errors name the file and what is wrong.
    pub fn load(dir: impl AsRef<Path>) -> Result<Encoder> {
        let dir = dir.as_ref();
        let layout = config::read(dir)?;
        let td = &layout.transformer_dir;
        let weights = Weights::open(&td.join("model.safetensors"))?;
        let bert = Bert::load(&weights, layout.bert.clone())?;
        let tok_path = td.join("tokenizer.json");
        let tok_err = |reason: String| EmbedError::Tokenizer { path: tok_path.clone(), reason };
        if !tok_path.is_file() {
            return Err(tok_err("missing (folders with only vocab.txt are not supported; save the tokenizer with transformers)".into()));
        }
        let mut tokenizer = tokenizers::Tokenizer::from_file(&tok_path).map_err(|e| tok_err(e.to_string()))?;
        // The file's own truncation/padding (128, fixed padding for all-MiniLM-L6-v2) are not
        // what sentence-transformers uses: it truncates at max_seq_length and pads per batch.
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: layout.max_seq_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| tok_err(e.to_string()))?;
        tokenizer.with_padding(None);
        let vocab = tokenizer.get_vocab_size(true);
        if vocab > layout.bert.vocab_size {
            return Err(tok_err(format!("{vocab} tokens, but the model's vocab_size is {}", layout.bert.vocab_size)));
        }
        Ok(Encoder { id: default_id(dir), dir: dir.to_path_buf(), layout, bert, tokenizer })
    }

    /// The same encoder served under another id.
    pub fn with_id(mut self, id: impl Into<String>) -> Encoder {
        self.id = id.into();
        self
    }

    /// The id `/v1/embeddings` reports (the folder's name unless set).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The folder it was loaded from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Floats per vector.
    pub fn dim(&self) -> usize {
        self.bert.config.hidden_size
    }

    /// Tokens a text is truncated to, special tokens included.
    pub fn max_tokens(&self) -> usize {
        self.layout.max_seq_length
    }

    /// How token vectors are pooled.
    pub fn pooling(&self) -> PoolingMode {
        self.layout.pooling
    }

    /// Whether vectors have unit norm (a Normalize module is configured).
    pub fn normalizes(&self) -> bool {
        self.layout.normalize
    }

    /// One line for logs: id, shape, pooling, folder.
    pub fn describe(&self) -> String {
        let c = &self.bert.config;
        format!(
            "{} (BERT {} layers, hidden {}, {} heads; {:?} pooling{}; max {} tokens) from {}",
            self.id,
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            self.layout.pooling,
            if self.layout.normalize { ", normalized" } else { "" },
            self.layout.max_seq_length,
            self.dir.display()
        )
    }

    /// The ids the model sees for `text`: `[CLS] … [SEP]`, truncated to
    /// [`Encoder::max_tokens`].
    pub fn tokenize(&self, text: &str) -> Result<Vec<u32>> {
        let lowered;
        let text = if self.layout.lowercase {
            lowered = text.to_lowercase();
            &lowered
        } else {
            text
        };
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| EmbedError::Tokenizer { path: self.layout.transformer_dir.join("tokenizer.json"), reason: e.to_string() })?;
        Ok(enc.get_ids().to_vec())
    }

    /// Vectors of already tokenized texts (each as [`Encoder::tokenize`]
    /// returns it), in order.
    pub fn embed_ids(&self, seqs: &[Vec<u32>]) -> Result<Vec<Vec<f32>>> {
        let mut out = Vec::with_capacity(seqs.len());
        for range in crate::vector::token_batches(seqs, MAX_BATCH_TOKENS) {
            let batch: Vec<&[u32]> = seqs[range].iter().map(|s| s.as_slice()).collect();
            let (hidden, ranges) = self.bert.forward(&batch)?;
            for r in ranges {
                let mut v = pool(&hidden, self.dim(), r, self.layout.pooling);
                if self.layout.normalize {
                    normalize(&mut v);
                }
                out.push(v);
            }
        }
        Ok(out)
    }

    /// Tokenizes and embeds `texts` in one batch.
    pub fn encode<S: AsRef<str>>(&self, texts: &[S]) -> Result<Embeddings> {
        let ids = texts.iter().map(|t| self.tokenize(t.as_ref())).collect::<Result<Vec<_>>>()?;
        let num_tokens = ids.iter().map(Vec::len).collect();
        Ok(Embeddings { vectors: self.embed_ids(&ids)?, num_tokens })
    }

    /// The vector of one text.
    pub fn encode_one(&self, text: &str) -> Result<Vec<f32>> {
        Ok(self.encode(&[text])?.vectors.remove(0))
    }
}
