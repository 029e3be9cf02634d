//! The [`Tokenizer`]: a `tokenizers::Tokenizer` plus the special-token facts
//! (BOS/EOS, stop ids, chat template) that the engine needs.
//!
//! Owner: `engram-tokenizer`. Invariants:
//! * `encode(text, true)` applies the model's own special-token rule (the HF
//!   post-processor, adjusted by an explicit `add_bos_token` in
//!   `tokenizer_config.json`; for GGUF the `add_bos`/`add_eos` flags);
//! * offsets are byte offsets into the input text; tokens added by the
//!   post-processor carry `(0, 0)`;
//! * `is_stop_token` is true for EOS, every `generation_config.json` eos id and
//!   the GGUF end-of-turn id;
//! * truncation and padding from `tokenizer.json` are switched off: the engine
//!   manages sequence lengths itself.

use crate::chat_template::ChatTemplate;
use crate::error::{Result, TokenizerError};

/// Result of [`Tokenizer::encode`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Encoding {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Byte range `(start, end)` of each token in the input text; special tokens
    /// added by the post-processor have an empty range (normally `(0, 0)`).
    pub offsets: Vec<(usize, usize)>,
}

/// Special-token facts gathered by the loaders (HF folder or GGUF).
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialFacts {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    /// Extra stop ids (generation_config eos ids, GGUF eot id).
    pub extra_stop_ids: Vec<u32>,
    /// Explicit `add_bos_token` from tokenizer_config.json (None: trust the post-processor).
    pub add_bos_override: Option<bool>,
}

/// A loaded tokenizer: the `tokenizers` pipeline plus BOS/EOS/stop ids and the chat template.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos_token: Option<String>,
    eos_token: Option<String>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    stop_ids: Vec<u32>,
    /// `Some(want)` when encode must correct what the post-processor does about BOS.
    bos_fix: Option<bool>,
    chat_template: Option<ChatTemplate>,
    /// The decoder maps GPT-2's byte table back to bytes (`token_bytes.rs`).
    byte_level: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos", &self.bos_token)
            .field("eos", &self.eos_token)
            .field("stop_ids", &self.stop_ids)
            .field("chat_template", &self.chat_template.is_some())
            .finish()
    }
}

impl Tokenizer {
    /// Assemble from a ready `tokenizers::Tokenizer` and the facts the loader found.
    pub(crate) fn from_parts(
        mut inner: tokenizers::Tokenizer,
        facts: SpecialFacts,
        chat_template: Option<ChatTemplate>,
    ) -> Result<Tokenizer> {
        inner.with_truncation(None).map_err(TokenizerError::tk)?;
        inner.with_padding(None);

        let bos_id = facts.bos_token.as_deref().and_then(|t| inner.token_to_id(t));
        let eos_id = facts.eos_token.as_deref().and_then(|t| inner.token_to_id(t));
        let mut stop_ids = Vec::new();
        for id in eos_id.into_iter().chain(facts.extra_stop_ids.iter().copied()) {
            if !stop_ids.contains(&id) {
                stop_ids.push(id);
            }
        }
        let bos_fix = match (facts.add_bos_override, bos_id) {
            (Some(want), Some(bos)) => {
                let probe = inner.encode("", true).map_err(TokenizerError::tk)?;
                let pp_adds = probe.get_ids().first() == Some(&bos);
                (pp_adds != want).then_some(want)
            }
            _ => None,
        };
        Ok(Tokenizer {
            bos_token: facts.bos_token.filter(|_| bos_id.is_some()),
            eos_token: facts.eos_token.filter(|_| eos_id.is_some()),
            bos_id,
            eos_id,
            stop_ids,
            bos_fix,
            chat_template,
            byte_level: inner.get_decoder().and_then(|d| serde_json::to_string(d).ok()).is_some_and(|j| j.contains("\"ByteLevel\"")),
            inner,
        })
    }

    /// Wrap a bare `tokenizers::Tokenizer` (e.g. from [`crate::train_bpe`]) without a
    /// config folder. BOS is the first id the post-processor puts before an empty
    /// input (if any); EOS is the first of `</s>`, `<|endoftext|>`, `<|end_of_text|>`,
    /// `<eos>`, `<|im_end|>` that is a special token. No chat template.
    pub fn from_tokenizers(inner: tokenizers::Tokenizer) -> Result<Tokenizer> {
        let facts = SpecialFacts { bos_token: guess_bos(&inner), eos_token: guess_eos(&inner), ..Default::default() };
        Tokenizer::from_parts(inner, facts, None)
    }

    /// Encode `text`. With `add_special_tokens` the model's own rule applies (BOS when
    /// the model asks for it). Text that spells a special token (e.g. `<|im_start|>`)
    /// becomes that token.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Encoding> {
        let enc = self.inner.encode(text, add_special_tokens).map_err(TokenizerError::tk)?;
        let mut ids = enc.get_ids().to_vec();
        let mut offsets = enc.get_offsets().to_vec();
        if add_special_tokens {
            if let (Some(want), Some(bos)) = (self.bos_fix, self.bos_id) {
                if want && ids.first() != Some(&bos) {
                    ids.insert(0, bos);
                    offsets.insert(0, (0, 0));
                } else if !want && ids.first() == Some(&bos) && enc.get_special_tokens_mask().first() == Some(&1) {
                    ids.remove(0);
                    offsets.remove(0);
                }
            }
        }
        Ok(Encoding { ids, offsets })
    }

    /// Decode ids to text (ids outside the vocabulary are skipped).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner.decode(ids, skip_special_tokens).map_err(TokenizerError::tk)
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// Id of a token string (vocabulary or added token).
    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.inner.token_to_id(s)
    }

    /// Token string of an id (raw form, e.g. `Ġthe` or `▁the`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Beginning-of-sequence id, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// End-of-sequence id, if the model has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Beginning-of-sequence token text.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// End-of-sequence token text.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// True for EOS, the generation_config eos ids and the GGUF end-of-turn id.
    pub fn is_stop_token(&self, id: u32) -> bool {
        self.stop_ids.contains(&id)
    }

    /// All stop ids (EOS first).
    pub fn stop_ids(&self) -> &[u32] {
        &self.stop_ids
    }

    /// Whether `id` is a special added token (skipped by `decode(.., true)`).
    pub fn is_special_id(&self, id: u32) -> bool {
        self.inner.get_added_vocabulary().simple_id_to_token(id).is_some_and(|t| self.inner.get_added_vocabulary().is_special_token(&t))
    }

    /// The model's chat template, if it has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Replace (or remove) the chat template.
    pub fn set_chat_template(&mut self, t: Option<ChatTemplate>) {
        self.chat_template = t;
    }

    /// Whether the vocabulary is byte-level BPE (pieces spelled in GPT-2's byte table).
    pub fn is_byte_level(&self) -> bool {
        self.byte_level
    }

    /// The underlying `tokenizers::Tokenizer`.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

pub(crate) fn guess_bos(inner: &tokenizers::Tokenizer) -> Option<String> {
    let probe = inner.encode("", true).ok()?;
    let first = *probe.get_ids().first()?;
    let tok = inner.get_added_vocabulary().simple_id_to_token(first)?;
    inner.get_added_vocabulary().is_special_token(&tok).then_some(tok)
}

fn guess_eos(inner: &tokenizers::Tokenizer) -> Option<String> {
    ["</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|im_end|>"]
        .iter()
        .find(|t| inner.get_added_vocabulary().is_special_token(t))
        .map(|t| t.to_string())
}

#[cfg(test)]
mod tests {
    #[test]
    fn shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::Tokenizer>();
        assert_send_sync::<crate::ChatTemplate>();
        assert_send_sync::<crate::GgufVocab>();
    }
}
