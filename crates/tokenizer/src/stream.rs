//! Incremental (streaming) detokenization.
//!
//! Owner: `engram-tokenizer`. Invariant (tested with random id sequences,
//! byte-fallback tokens and multi-byte characters split across tokens):
//!
//! > the concatenation of every [`StreamDecoder::push`] output plus
//! > [`StreamDecoder::flush`] equals the text that decoding the whole sequence adds
//! > after the prompt, i.e. `decode(prompt ++ generated)` minus its prefix
//! > `decode(prompt)`; with an empty prompt that is `decode(generated)`.
//!
//! How: the decoder keeps a small window of ids whose decoded text (`prefix_text`)
//! has already been accounted for, decodes `window ++ pending`, and emits the part
//! after `prefix_text` once it is final:
//! * never while it ends in U+FFFD (an incomplete UTF-8 sequence may still be completed);
//! * for `ByteFallback` decoders, never while the last (non-skipped) token is a
//!   `<0xXX>` byte token, because that decoder judges a whole run of byte tokens
//!   at once (one invalid byte turns the entire run into U+FFFDs);
//! * the window is only moved to a point where its own decoded text is non-empty,
//!   so start-of-text effects (SentencePiece `Strip`, `Metaspace` first-token
//!   rules) stay inside the window and never touch new text.
//!
//! If the prompt itself ends in the middle of a character, the first output
//! starts where the prompt's text and the combined text begin to differ (best effort).

use crate::error::Result;
use crate::tokenizer::Tokenizer;

/// Incremental detokenizer: feed generated ids one at a time, get back only
/// complete UTF-8 text (never splits a character, handles byte-fallback tokens
/// like `<0xE2>`, SentencePiece `▁` spaces and leading-space stripping exactly as
/// decoding the whole sequence would).
pub struct StreamDecoder<'t> {
    tok: &'t Tokenizer,
    skip_special_tokens: bool,
    byte_fallback: bool,
    /// Window (already accounted ids `..read`) followed by pending ids.
    ids: Vec<u32>,
    read: usize,
    /// `decode(ids[..read])`.
    prefix_text: String,
}

impl<'t> StreamDecoder<'t> {
    /// Start a stream after `prompt_ids` (used only as context, for correct leading
    /// spaces). Special tokens are skipped, as in `decode(ids, true)`; see
    /// [`StreamDecoder::with_skip_special_tokens`].
    pub fn new(tok: &'t Tokenizer, prompt_ids: &[u32]) -> Self {
        Self::with_skip_special_tokens(tok, prompt_ids, true)
    }

    /// Like [`StreamDecoder::new`], choosing whether special tokens are skipped
    /// (the output then matches `decode(.., skip_special_tokens)`).
    pub fn with_skip_special_tokens(tok: &'t Tokenizer, prompt_ids: &[u32], skip_special_tokens: bool) -> Self {
        let byte_fallback =
            tok.inner().get_decoder().and_then(|d| serde_json::to_string(d).ok()).is_some_and(|j| j.contains("\"ByteFallback\""));
        let mut s = StreamDecoder { tok, skip_special_tokens, byte_fallback, ids: Vec::new(), read: 0, prefix_text: String::new() };
        // Take enough of the prompt's tail that its text is non-empty and, for
        // byte-fallback decoders, that it does not start inside a run of byte tokens.
        let n = prompt_ids.len();
        let mut take = 8.min(n);
        loop {
            let mut start = n - take;
            while let Some(prev) = (0..start).rev().find(|&i| !s.is_skipped(prompt_ids[i])) {
                if !s.is_byte_token(prompt_ids[prev]) {
                    break;
                }
                start = prev;
            }
            let text = s.decode(&prompt_ids[start..]);
            if !text.is_empty() || start == 0 {
                s.ids = prompt_ids[start..].to_vec();
                s.read = s.ids.len();
                s.prefix_text = text;
                break;
            }
            take = (take * 2).min(n);
        }
        s
    }

    /// A `<0xXX>` token of a byte-fallback decoder.
    fn is_byte_token(&self, id: u32) -> bool {
        self.byte_fallback && self.tok.id_to_token(id).is_some_and(|t| t.len() == 6 && t.starts_with("<0x") && t.ends_with('>'))
    }

    fn decode(&self, ids: &[u32]) -> String {
        // `tokenizers` decoding of known ids does not fail in practice; an error
        // here would mean a broken decoder, in which case no text is produced.
        self.tok.decode(ids, self.skip_special_tokens).unwrap_or_default()
    }

    fn is_skipped(&self, id: u32) -> bool {
        self.skip_special_tokens && self.tok.is_special_id(id)
    }

    /// Whether the last token that reaches the decoder is a `<0xXX>` byte token.
    fn ends_in_open_byte_run(&self) -> bool {
        if !self.byte_fallback {
            return false;
        }
        self.ids.iter().rev().find(|&&id| !self.is_skipped(id)).is_some_and(|&last| self.is_byte_token(last))
    }

    /// Text of `new_text` beyond `prefix_text` (from the first difference if the
    /// prefix does not match, which only happens after an incomplete prompt).
    fn tail_after_prefix<'a>(&self, new_text: &'a str) -> &'a str {
        if let Some(rest) = new_text.strip_prefix(self.prefix_text.as_str()) {
            return rest;
        }
        let mut common = 0;
        for ((i, a), b) in new_text.char_indices().zip(self.prefix_text.chars()) {
            if a != b {
                break;
            }
            common = i + a.len_utf8();
        }
        &new_text[common..]
    }

    /// Feed one generated id; returns the newly completed text (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        if self.ends_in_open_byte_run() {
            return Ok(String::new());
        }
        let new_text = self.tok.decode(&self.ids, self.skip_special_tokens)?;
        if new_text.ends_with('\u{FFFD}') {
            return Ok(String::new());
        }
        let chunk = self.tail_after_prefix(&new_text).to_string();
        if chunk.is_empty() {
            return Ok(chunk);
        }
        self.advance(new_text);
        Ok(chunk)
    }

    /// Mark everything pushed so far as emitted; `new_text = decode(ids)`.
    fn advance(&mut self, new_text: String) {
        let sub = self.decode(&self.ids[self.read..]);
        if !sub.is_empty() {
            self.ids.drain(..self.read);
            self.prefix_text = sub;
        } else {
            self.prefix_text = new_text;
        }
        self.read = self.ids.len();
    }

    /// Emit whatever is still held back (e.g. an incomplete character at the very
    /// end, as U+FFFD, exactly as a full decode shows it).
    pub fn flush(&mut self) -> String {
        if self.read == self.ids.len() {
            return String::new();
        }
        let new_text = self.decode(&self.ids);
        let chunk = self.tail_after_prefix(&new_text).to_string();
        self.advance(new_text);
        chunk
    }
}
