//! Constrained decoding with `llguidance`: a [`GrammarCompiler`] holds the model's
//! vocabulary as a token trie (built once per model) and compiles JSON schemas and Lark
//! grammars into [`Grammar`]s; each grammar-bound sequence runs its own [`GrammarState`],
//! which masks the logits of every token the grammar forbids before sampling and is fed
//! each accepted token.
//!
//! A grammar may be *lazy* ([`Grammar::lazy`]): its sequence decodes freely (no mask, no
//! matcher work) until the generated text contains the grammar's trigger (a tool call's
//! opening tag, say); the matcher then starts, is fed the text from the trigger on, and
//! binds every later token. The watch is sequence-local and only sequences with a lazy
//! grammar pay for it. A trigger may also be a special token ([`Grammar::lazy_on_tokens`]:
//! the decoder hides special tokens from the text, so such a trigger is matched on the
//! sampled token's id; the grammar's language then starts with that token, `<[id]>` in
//! Lark). A lazy grammar may have a *quiet* section
//! ([`Grammar::quiet_between`], a reasoning block `<think>…</think>`): a trigger inside one
//! does not arm it, and a sequence whose prompt left such a section open starts inside it.
//! A grammar bound from the first token may start differently by how the prompt left such
//! a section ([`Grammar::after_prompt`]: a call that may follow reasoning starts inside the
//! reasoning when the template opened it, and with the call when the template closed it).
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

    /// A grammar for text matching the regular expression `rx` (whole).
    pub fn regex(&self, rx: &str) -> Result<Arc<Grammar>, String> {
        self.compile(TopLevelGrammar::from_regex(rx), "regex")
    }

    fn compile(&self, g: TopLevelGrammar, kind: &'static str) -> Result<Arc<Grammar>, String> {
        let parser = self.factory.create_parser(g).map_err(|e| e.to_string())?;
        // A grammar that fails on its first mask (nothing it allows) is refused now, not
        // mid-generation.
        let mut m = Matcher::new(Ok(parser.clone()));
        m.compute_mask().map_err(|e| e.to_string())?;
        Ok(Arc::new(Grammar { parser, kind, vocab: self.vocab, trigger: None, trigger_tokens: Vec::new(), quiet: None, sections: None }))
    }
}

/// A compiled grammar, shared by every sequence that decodes under it (each runs its own
/// [`GrammarState`] from it). Invariant: compiled by a [`GrammarCompiler`] for a model with
/// `vocab` logits.
#[derive(Clone)]
pub struct Grammar {
    parser: TokenParser,
    kind: &'static str,
    vocab: usize,
    /// `Some`: the grammar is lazy and binds from the first occurrence of this text on.
    trigger: Option<String>,
    /// Special tokens that arm the grammar too (it is lazy when it has any), consumed as its
    /// first token.
    trigger_tokens: Vec<u32>,
    /// The opening and closing text of a section the trigger is not watched in.
    quiet: Option<(String, String)>,
    /// A bound grammar's other starts, by how the prompt leaves a section.
    sections: Option<Arc<Sections>>,
}

/// The starts of a bound grammar for a prompt that leaves an `open` … `close` section open
/// (`inside`) or ends with one closed (`closed`).
struct Sections {
    open: String,
    close: String,
    inside: TokenParser,
    closed: TokenParser,
}

impl fmt::Debug for Grammar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Grammar({})", self.kind)
    }
}

impl Grammar {
    /// The same grammar made lazy: a sequence under it decodes freely until its text
    /// contains `trigger`, and the grammar (whose language starts with `trigger`) binds
    /// from there. An empty trigger binds from the first token, as a plain grammar.
    pub fn lazy(&self, trigger: &str) -> Arc<Grammar> {
        Arc::new(Grammar { trigger: Some(trigger.to_string()).filter(|t| !t.is_empty()), ..self.clone() })
    }

    /// The same grammar made lazy on special tokens too: sampling one of `ids` arms it, the
    /// token consumed as the grammar's first (its language starts with it).
    pub fn lazy_on_tokens(&self, ids: &[u32]) -> Arc<Grammar> {
        Arc::new(Grammar { trigger_tokens: ids.to_vec(), ..self.clone() })
    }

    /// The same grammar with its trigger not watched between `open` and `close` (a reasoning
    /// section: a model thinking about a call does not make one). Only a lazy grammar
    /// watches; a sequence whose prompt ends inside such a section starts inside it.
    pub fn quiet_between(&self, open: &str, close: &str) -> Arc<Grammar> {
        let quiet = Some((open.to_string(), close.to_string())).filter(|(o, c)| !o.is_empty() && !c.is_empty());
        Arc::new(Grammar { quiet, ..self.clone() })
    }

    /// The same grammar with two more starts, chosen by the prompt's end: a sequence whose
    /// prompt ends inside an `open` … `close` section (the last `open` not closed after it)
    /// decodes under `inside`, one whose prompt ends with such a section closed (only
    /// whitespace after `close`) under `closed`, any other under this grammar. Only for a
    /// grammar bound from the first token.
    pub fn after_prompt(&self, open: &str, close: &str, inside: &Grammar, closed: &Grammar) -> Arc<Grammar> {
        let sections = Sections { open: open.into(), close: close.into(), inside: inside.parser.clone(), closed: closed.parser.clone() };
        Arc::new(Grammar { sections: Some(Arc::new(sections)).filter(|s| !s.open.is_empty() && !s.close.is_empty()), ..self.clone() })
    }

    /// The text that arms a lazy grammar (`None`: it binds from the first token).
    pub fn trigger(&self) -> Option<&str> {
        self.trigger.as_deref()
    }

    /// A fresh matcher at the grammar's start (for a lazy grammar: waiting for its trigger).
    pub fn start(&self) -> GrammarState {
        self.start_after("")
    }

    /// A fresh matcher for a sequence whose prompt ends with `prompt_tail`: a lazy grammar
    /// with a quiet section starts inside it when the tail's last opening is not closed.
    pub fn start_after(&self, prompt_tail: &str) -> GrammarState {
        let matcher = match (&self.trigger, self.trigger_tokens.is_empty()) {
            (None, true) => {
                let parser = match self.sections.as_deref() {
                    Some(s) if leaves_open(prompt_tail, &s.open, &s.close) => &s.inside,
                    Some(s) if prompt_tail.trim_end().ends_with(s.close.as_str()) => &s.closed,
                    _ => &self.parser,
                };
                Phase::Bound(Matcher::new(Ok(parser.clone())))
            }
            (t, _) => {
                let inside = self.quiet.as_ref().is_some_and(|(open, close)| leaves_open(prompt_tail, open, close));
                Phase::Waiting {
                    trigger: t.clone(),
                    tokens: self.trigger_tokens.clone(),
                    parser: self.parser.clone(),
                    window: String::new(),
                    quiet: self.quiet.clone(),
                    inside,
                }
            }
        };
        GrammarState { phase: matcher, vocab: self.vocab, ready: None }
    }

    /// Whether a sequence's start needs its prompt's tail ([`Grammar::start_after`]).
    pub fn wants_prompt_tail(&self) -> bool {
        ((self.trigger.is_some() || !self.trigger_tokens.is_empty()) && self.quiet.is_some()) || self.sections.is_some()
    }

    /// Whether `text` is a complete sentence of the grammar (its trigger and laziness
    /// aside), tokenized with `tok`: how a tool call parsed from free text is validated
    /// against the schema it would have been decoded under.
    pub fn accepts(&self, tok: &Tokenizer, text: &str) -> bool {
        let Ok(enc) = tok.encode(text, false) else { return false };
        let mut m = Matcher::new(Ok(self.parser.clone()));
        m.consume_tokens(&enc.ids).is_ok() && m.is_accepting().unwrap_or(false)
    }
}

/// Where a sequence stands in its grammar.
enum Phase {
    /// A lazy grammar not armed yet: the text generated since the last possible start of
    /// the trigger (or of the quiet section's opening or, `inside` it, closing) is kept in
    /// `window`.
    Waiting {
        trigger: Option<String>,
        tokens: Vec<u32>,
        parser: TokenParser,
        window: String,
        quiet: Option<(String, String)>,
        inside: bool,
    },
    /// The grammar binds every token.
    Bound(Matcher),
    /// A lazy grammar whose triggered text the grammar refused: the sequence stays free.
    Off,
}

/// Whether `text`'s last `open` is not followed by a `close`.
fn leaves_open(text: &str, open: &str, close: &str) -> bool {
    text.rfind(open).is_some_and(|at| !text[at..].contains(close))
}

/// Drops all of `window` but what could begin a marker of `len` bytes.
fn keep_tail(window: &mut String, len: usize) {
    let mut cut = window.len().saturating_sub(len.saturating_sub(1));
    while !window.is_char_boundary(cut) {
        cut -= 1;
    }
    window.drain(..cut);
}

/// One sequence's place in its grammar. Invariant: once bound, it has consumed exactly the
/// sequence's accepted tokens since the grammar bound (stop tokens aside).
pub struct GrammarState {
    phase: Phase,
    vocab: usize,
    /// The mask for the matcher's present position, computed ahead of the draw
    /// ([`GrammarState::prepare_mask`]); cleared whenever the position moves.
    ready: Option<Result<SimpleVob, String>>,
}

impl GrammarState {
    /// Whether the grammar binds the next token (a lazy grammar's trigger has been seen).
    pub fn is_bound(&self) -> bool {
        matches!(self.phase, Phase::Bound(_))
    }

    /// For a lazy grammar not yet bound: watches token `t` and `piece`, the text it added.
    /// When `t` is a trigger token (outside a quiet section), the grammar binds and consumes
    /// it; when the text holds the trigger, the grammar binds and consumes the text from the
    /// trigger on (re-tokenized with `tok`). True when the grammar is then complete. A
    /// triggered text the grammar refuses leaves the sequence free for good.
    pub fn observe(&mut self, tok: &Tokenizer, t: u32, piece: &str) -> bool {
        let Phase::Waiting { trigger, tokens, window, quiet, inside, .. } = &mut self.phase else { return false };
        if !*inside && tokens.contains(&t) {
            return self.bind(&[t]);
        }
        window.push_str(piece);
        let at = loop {
            if let (Some((_, close)), true) = (quiet.as_ref(), *inside) {
                match window.find(close.as_str()) {
                    Some(at) => {
                        window.drain(..at + close.len());
                        *inside = false;
                        continue;
                    }
                    None => {
                        keep_tail(window, close.len());
                        return false;
                    }
                }
            }
            let open = quiet.as_ref().and_then(|(open, _)| window.find(open.as_str()).map(|at| (at, open.len())));
            match (trigger.as_deref().and_then(|t| window.find(t)), open) {
                (Some(at), open) if open.is_none_or(|(o, _)| at < o) => break at,
                (_, Some((o, n))) => {
                    window.drain(..o + n);
                    *inside = true;
                }
                _ => {
                    // Keep only what could still begin the trigger or the quiet opening.
                    let open_len = quiet.as_ref().map_or(0, |(open, _)| open.len());
                    keep_tail(window, trigger.as_ref().map_or(0, String::len).max(open_len));
                    return false;
                }
            }
        };
        let ids = tok.encode(&window[at..], false).map(|e| e.ids).unwrap_or_default();
        self.bind(&ids)
    }

    /// Binds a waiting grammar, its matcher fed `ids`; true when it is then complete. Ids it
    /// refuses leave the sequence free for good.
    fn bind(&mut self, ids: &[u32]) -> bool {
        let Phase::Waiting { parser, .. } = &self.phase else { return false };
        let mut m = Matcher::new(Ok(parser.clone()));
        if m.consume_tokens(ids).is_err() {
            self.phase = Phase::Off;
            return false;
        }
        let done = m.is_stopped();
        self.phase = Phase::Bound(m);
        self.ready = None;
        done
    }

    /// Sets every logit the grammar forbids now to −∞ (ids past the trie too); nothing
    /// while a lazy grammar waits for its trigger. Errors if the matcher failed or allows
    /// nothing.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), EngineError> {
        let Phase::Bound(matcher) = &mut self.phase else { return Ok(()) };
        let mask = match self.ready.take() {
            Some(ready) => ready,
            None => matcher.compute_mask_or_eos().map_err(|e| e.to_string()),
        };
        let mask: SimpleVob = mask.map_err(EngineError::Grammar)?;
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

    /// Computes the mask of the next draw now, for [`GrammarState::mask`] to use: the
    /// scheduler calls it on another thread while the step's forward pass runs. Nothing
    /// unless bound; the same mask `mask` would compute.
    pub fn prepare_mask(&mut self) {
        if self.ready.is_none() {
            if let Phase::Bound(matcher) = &mut self.phase {
                self.ready = Some(matcher.compute_mask_or_eos().map_err(|e| e.to_string()));
            }
        }
    }

    /// Feeds accepted token `t` to a bound grammar; true when the grammar is complete
    /// (nothing may follow). A waiting or refused lazy grammar ignores it.
    pub fn consume(&mut self, t: u32) -> Result<bool, EngineError> {
        self.ready = None;
        let Phase::Bound(matcher) = &mut self.phase else { return Ok(false) };
        matcher.consume_token(t).map_err(|e| EngineError::Grammar(e.to_string()))?;
        Ok(matcher.is_stopped())
    }
}
