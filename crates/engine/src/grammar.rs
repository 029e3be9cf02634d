//! Constrained decoding with `llguidance`: a [`GrammarCompiler`] holds the model's
//! vocabulary as a token trie (built once per model) and compiles JSON schemas and Lark
//! grammars into [`Grammar`]s; each grammar-bound sequence runs its own [`GrammarState`],
//! which masks the logits of every token the grammar forbids before sampling and is fed
//! each accepted token.
//!
//! Invariant: a sequence under a grammar only ever samples tokens the grammar allows (or a
//! stop token once the grammar can end), so its text is in the grammar's language whenever
//! it ends with finish reason `stop` (not cut by `max_tokens` or a stop string).

use std::fmt;
use std::sync::Arc;

use engram_tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{JsonCompileOptions, Matcher, ParserFactory, TokenParser};
use toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};

use crate::error::EngineError;

/// The byte that marks a special token's text in the trie (llguidance never matches it
/// against grammar text, so special tokens are only ever allowed as end-of-sequence).
const SPECIAL_MARKER: u8 = 0xFF;

/// Compiles grammars over one model's vocabulary. Invariant: its trie has one entry per
/// logit (`vocab` ids; ids past the tokenizer's vocabulary are empty, never allowed) and
/// the tokenizer's stop ids as its end-of-sequence tokens.
pub struct GrammarCompiler {
    factory: ParserFactory,
    vocab: usize,
}

impl fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GrammarCompiler({} tokens)", self.vocab)
    }
}

impl GrammarCompiler {
    /// The trie of `tok`'s token bytes for a model with `vocab` logits (special tokens
    /// marked special). Fails if the tokenizer has no stop token to end a grammar with.
    pub fn new(tok: &Tokenizer, vocab: usize) -> Result<GrammarCompiler, EngineError> {
        let vocab = vocab.max(tok.vocab_size());
        let words: Vec<Vec<u8>> = (0..vocab as u32)
            .map(|id| {
                if tok.is_special_id(id) || tok.is_stop_token(id) {
                    let mut w = vec![SPECIAL_MARKER];
                    w.extend(tok.id_to_token(id).unwrap_or_default().into_bytes());
                    w
                } else {
                    tok.token_bytes(id)
                }
            })
            .collect();
        let stops: Vec<u32> = tok.stop_ids().iter().copied().filter(|&t| (t as usize) < vocab).collect();
        let Some(&eos) = stops.first() else {
            return Err(EngineError::Grammar("the tokenizer has no end-of-sequence token to end a grammar with".into()));
        };
        let info = TokRxInfo::new(vocab as u32, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&stops);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| EngineError::Grammar(e.to_string()))?;
        factory.quiet();
        Ok(GrammarCompiler { factory, vocab })
    }

    /// Logits (token ids) the trie covers.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// A grammar for JSON valid against `schema` (a JSON Schema). Without an `x-guidance`
    /// key of its own, the JSON is compact (no whitespace between tokens), as OpenAI's
    /// structured outputs are. Errors carry llguidance's message.
    pub fn json_schema(&self, mut schema: serde_json::Value) -> Result<Arc<Grammar>, String> {
        if !schema.is_object() && !schema.is_boolean() {
            return Err("a JSON schema is an object".into());
        }
        if schema.get("x-guidance").is_none() && schema.is_object() {
            JsonCompileOptions { whitespace_flexible: false, ..Default::default() }.apply_to(&mut schema);
        }
        self.compile(TopLevelGrammar::from_json_schema(schema), "json_schema")
    }

    /// A grammar for any JSON object (OpenAI's `json_object`).
    pub fn json_object(&self) -> Result<Arc<Grammar>, String> {
        self.json_schema(serde_json::json!({"type": "object"}))
    }

    /// A grammar in llguidance's Lark dialect.
    pub fn lark(&self, source: &str) -> Result<Arc<Grammar>, String> {
        self.compile(TopLevelGrammar::from_lark(source.to_string()), "lark")
    }

    fn compile(&self, g: TopLevelGrammar, kind: &'static str) -> Result<Arc<Grammar>, String> {
        let parser = self.factory.create_parser(g).map_err(|e| e.to_string())?;
        // A grammar that fails on its first mask (nothing it allows) is refused now, not
        // mid-generation.
        let mut m = Matcher::new(Ok(parser.clone()));
        m.compute_mask().map_err(|e| e.to_string())?;
        Ok(Arc::new(Grammar { parser, kind, vocab: self.vocab }))
    }
}

/// A compiled grammar, shared by every sequence that decodes under it (each runs its own
/// [`GrammarState`] from it). Invariant: compiled by a [`GrammarCompiler`] for a model with
/// `vocab` logits.
pub struct Grammar {
    parser: TokenParser,
    kind: &'static str,
    vocab: usize,
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Grammar({})", self.kind)
    }
}

impl Grammar {
    /// A fresh matcher at the grammar's start.
    pub fn start(&self) -> GrammarState {
        GrammarState { matcher: Matcher::new(Ok(self.parser.clone())), vocab: self.vocab }
    }
}

/// One sequence's place in its grammar. Invariant: it has consumed exactly the sequence's
/// accepted tokens (stop tokens aside).
pub struct GrammarState {
    matcher: Matcher,
    vocab: usize,
}

impl GrammarState {
    /// Sets every logit the grammar forbids now to −∞ (ids past the trie too). Errors if
    /// the matcher failed or allows nothing.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), EngineError> {
        let mask: SimpleVob = self.matcher.compute_mask_or_eos().map_err(|e| EngineError::Grammar(e.to_string()))?;
        if mask.is_zero() {
            return Err(EngineError::Grammar("the grammar allows no token here".into()));
        }
        let n = logits.len().min(self.vocab).min(mask.len());
        // 32 tokens per mask word: a word of zeros (most of them, in a string or a number)
        // masks its 32 logits at once.
        for (chunk, &word) in logits[..n].chunks_mut(32).zip(mask.as_slice()) {
            if word == 0 {
                chunk.fill(f32::NEG_INFINITY);
            } else if word != u32::MAX {
                for (b, l) in chunk.iter_mut().enumerate() {
                    if word & (1 << b) == 0 {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
        logits[n..].fill(f32::NEG_INFINITY);
        Ok(())
    }

    /// Feeds accepted token `t`; true when the grammar is complete (nothing may follow).
    pub fn consume(&mut self, t: u32) -> Result<bool, EngineError> {
        self.matcher.consume_token(t).map_err(|e| EngineError::Grammar(e.to_string()))?;
        Ok(self.matcher.is_stopped())
    }
}
