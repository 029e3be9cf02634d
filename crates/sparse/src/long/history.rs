//! [`History`]: what a kept sparse session holds, as the next turn must extend it (its tokens,
//! text and the token that ends the answer unfed), shared by sessions kept in RAM and those
//! saved to disk.
//!
//! Invariant: `tokens` is exactly what the session's cache holds; `token_ends` has one
//! non-decreasing text end per token (empty `text`: a token-id conversation, matched by
//! tokens only).

use engram_policy::AdmitRequest;

/// A kept session's history (module doc).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct History {
    /// The prompt and answer text (empty for token-id prompts).
    pub text: String,
    /// Where each token's text ends.
    pub token_ends: Vec<usize>,
    /// Exactly what the cache holds.
    pub tokens: Vec<u32>,
    /// The last token sampled but never fed (its text ends `text`): the next turn's first.
    pub unfed: Option<u32>,
}

impl History {
    /// The tokens (and text ends) of a prompt `req` that extends this history, if it does:
    /// its cold tokenization when that starts with every token held; else, for a text that
    /// starts with this history's text, the held tokens, the unfed one, then the rest of the
    /// text tokenized alone. NOTE: the second keeps the tokens the model generated where a
    /// cold tokenization of its text would split them otherwise (as a chat that never
    /// re-tokenizes does): a long history is not prefilled again for a boundary.
    pub fn extended_by(&self, req: &AdmitRequest<'_>, cold: &(Vec<u32>, Vec<usize>)) -> Option<(Vec<u32>, Vec<usize>)> {
        let held = self.tokens.len();
        if cold.0.len() > held && cold.0.starts_with(&self.tokens) {
            return Some(cold.clone());
        }
        let text = req.text?;
        if self.text.is_empty() || !text.starts_with(&self.text) {
            return None;
        }
        let base = self.text.len();
        let rest = req.tok.encode(&text[base..], false).ok()?;
        let mut tokens = self.tokens.clone();
        let mut ends = self.token_ends.clone();
        tokens.extend(self.unfed);
        ends.extend(self.unfed.map(|_| base));
        tokens.extend_from_slice(&rest.ids);
        ends.extend(rest.offsets.iter().map(|o| base + o.1));
        monotonic(&mut ends);
        (tokens.len() > held).then_some((tokens, ends))
    }
}

/// Makes text ends non-decreasing (special tokens carry empty ranges).
pub(crate) fn monotonic(ends: &mut [usize]) {
    let mut m = 0;
    for e in ends.iter_mut() {
        m = m.max(*e);
        *e = m;
    }
}
