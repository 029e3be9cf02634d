//! `Decoding`: the output side of one sequence — sampling, detokenizing, stop tokens and stop
//! strings, the token limit — with one [`Decoding::accept`] per sampled token. The engine's
//! step decodes every sequence through it (requests, background work, a lone sequence), and
//! the sparse CLI path does too, so they end a sequence the same way and stream the same text.
//!
//! A sequence under a grammar has its logits masked to the tokens the grammar allows before
//! each draw, feeds each accepted token to its matcher, and ends (`stop`) when the grammar
//! is complete. A lazy grammar leaves the sequence free until its text holds the trigger.
//!
//! Invariant: the concatenation of every `release` equals the generated text up to the stop
//! string (if one matched) — text held back as a possible stop-string prefix is released when
//! the sequence ends any other way (a stop token, the length limit), never dropped.

use engram_tokenizer::{StreamDecoder, Tokenizer};

use crate::error::EngineError;
use crate::grammar::GrammarState;
use crate::logprobs::{token_logprob, TokenLogprob};
use crate::sampling::{Sampler, SamplingParams};
use crate::stop::StopMatcher;

/// Tokens at the prompt's end read for a lazy grammar's quiet section.
const PROMPT_TAIL: usize = 16;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token or stop string.
    Stop,
    /// `max_tokens` or the context limit.
    Length,
    /// The caller asked to stop (a client went away, a callback said no).
    Cancelled,
}

impl FinishReason {
    /// OpenAI's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

/// Records the text end of a token just decoded. A token that produced no
/// text yet (it ends inside a UTF-8 character) is pending (`usize::MAX`)
/// until a later token completes the text; `end` is where the decoded text
/// ends after this token, and it becomes the end of every pending token.
pub fn push_token_end(ends: &mut Vec<usize>, produced_text: bool, end: usize) {
    ends.push(usize::MAX);
    if produced_text {
        for e in ends.iter_mut().rev().take_while(|e| **e == usize::MAX) {
            *e = end;
        }
    }
}

/// What accepting one token produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Accepted {
    /// Text that can be shown now (possibly empty).
    pub release: String,
    /// `Some`: the sequence is done (the accepted token is not fed back).
    pub done: Option<FinishReason>,
}

/// One sequence's sampler, stream decoder and stop matcher.
pub struct Decoding<'t> {
    tok: &'t Tokenizer,
    params: SamplingParams,
    sampler: Sampler,
    decoder: StreamDecoder<'t>,
    stops: StopMatcher,
    generated: Vec<u32>,
    decoded: String,
    text_base: usize,
    token_ends: Vec<usize>,
    stopped_by_string: bool,
    /// The last sampled token's log-probabilities, when the request asks for them.
    logprob: Option<TokenLogprob>,
    /// The sequence's place in its grammar, when it decodes under one.
    grammar: Option<GrammarState>,
    /// Why the grammar could not mask the last draw (reported by the next `accept`).
    grammar_error: Option<String>,
}

impl<'t> Decoding<'t> {
    /// Decoding after `prompt` (penalties observe it; the decoder continues its text).
    /// Token ends are reported as `text_base +` the end in the decoded text.
    pub fn new(tok: &'t Tokenizer, prompt: &[u32], params: &SamplingParams, text_base: usize) -> Decoding<'t> {
        let mut sampler = Sampler::new(params.clone());
        if params.repetition_penalty != 1.0 || params.frequency_penalty != 0.0 || params.presence_penalty != 0.0 {
            sampler.observe(prompt);
        }
        Decoding {
            tok,
            params: params.clone(),
            sampler,
            decoder: StreamDecoder::with_skip_special_tokens(tok, prompt, !params.show_special_tokens),
            stops: StopMatcher::new(&params.stop),
            generated: Vec::new(),
            decoded: String::new(),
            text_base,
            token_ends: Vec::new(),
            stopped_by_string: false,
            logprob: None,
            grammar: params.grammar.as_ref().map(|g| match g.wants_prompt_tail() {
                // A lazy grammar quiet in reasoning: whether the prompt left a section open.
                true => g.start_after(&tok.decode(&prompt[prompt.len().saturating_sub(PROMPT_TAIL)..], false).unwrap_or_default()),
                false => g.start(),
            }),
            grammar_error: None,
        }
    }

    /// Whether the next draw is masked by a grammar that binds now.
    pub fn masks_next_draw(&self) -> bool {
        self.grammar.as_ref().is_some_and(GrammarState::is_bound)
    }

    /// Computes the next draw's grammar mask ahead of it (while the forward pass runs, on
    /// another thread); [`Decoding::sample`] then uses it. Nothing without a bound grammar.
    pub fn prepare_mask(&mut self) {
        if let Some(g) = &mut self.grammar {
            g.prepare_mask();
        }
    }

    /// Samples the next token from `logits` (does not accept it). Under a grammar, the
    /// logits of the tokens it forbids are −∞ first (a failed mask is reported by the next
    /// [`Decoding::accept`]). With `params.logprobs`, its log-probabilities are taken from the
    /// raw logits, before the mask and the sampler's penalties ([`Decoding::take_logprob`]).
    pub fn sample(&mut self, logits: &mut [f32]) -> u32 {
        let raw = self.params.logprobs.map(|top| (top, logits.to_vec()));
        if let Some(g) = &mut self.grammar {
            if let Err(e) = g.mask(logits) {
                self.grammar_error = Some(e.to_string());
            }
        }
        let t = self.sampler.sample(logits);
        if let Some((top, raw)) = raw {
            self.logprob = Some(token_logprob(&raw, t, top));
        }
        t
    }

    /// The log-probabilities of the token sampled last, once (`None` unless asked for).
    pub fn take_logprob(&mut self) -> Option<TokenLogprob> {
        self.logprob.take()
    }

    /// Accepts sampled token `t`. `room`: whether the context can take one more token after
    /// this one (else the sequence ends at its length). A stop token or string, or the
    /// `max_tokens` limit, ends it too; whatever text is held back is released then.
    pub fn accept(&mut self, t: u32, room: bool) -> Result<Accepted, EngineError> {
        if let Some(e) = self.grammar_error.take() {
            return Err(EngineError::Grammar(e));
        }
        self.generated.push(t);
        if (!self.params.ignore_eos && self.tok.is_stop_token(t)) || self.params.stop_token_ids.contains(&t) {
            return Ok(Accepted { release: self.flush(), done: Some(FinishReason::Stop) });
        }
        // Under a grammar: a stop token (allowed only where the grammar may end) ends the
        // sequence even with `ignore_eos`; any other token advances the matcher.
        let was_bound = self.grammar.as_ref().is_some_and(GrammarState::is_bound);
        let mut complete = match &mut self.grammar {
            Some(_) if self.tok.is_stop_token(t) => {
                return Ok(Accepted { release: self.flush(), done: Some(FinishReason::Stop) });
            }
            Some(g) => g.consume(t)?,
            None => false,
        };
        let piece = self.decoder.push(t)?;
        // A lazy grammar watches the text for its trigger until it binds.
        if let Some(g) = self.grammar.as_mut().filter(|_| !was_bound) {
            complete = g.observe(self.tok, t, &piece);
        }
        self.decoded.push_str(&piece);
        push_token_end(&mut self.token_ends, !piece.is_empty(), self.text_base + self.decoded.len());
        let (mut release, stopped) = self.stops.push(&piece);
        if stopped {
            self.stopped_by_string = true;
            return Ok(Accepted { release, done: Some(FinishReason::Stop) });
        }
        if complete {
            release.push_str(&self.flush());
            return Ok(Accepted { release, done: Some(FinishReason::Stop) });
        }
        if self.generated.len() >= self.params.max_tokens || !room {
            release.push_str(&self.flush());
            return Ok(Accepted { release, done: Some(FinishReason::Length) });
        }
        Ok(Accepted { release, done: None })
    }

    /// Releases text held by the decoder and the stop matcher (the sequence ends without a
    /// stop string: cut short by its cache, say).
    pub fn flush(&mut self) -> String {
        let tail = self.decoder.flush();
        self.decoded.push_str(&tail);
        let (release, _) = self.stops.push(&tail);
        release + &self.stops.finish()
    }

    /// The request's sampling parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Tokens accepted so far (a stop token included).
    pub fn generated(&self) -> &[u32] {
        &self.generated
    }

    /// Everything the decoder produced, before any stop string cut it.
    pub fn decoded(&self) -> &str {
        &self.decoded
    }

    /// `text_base +` the end of each accepted token's text (`usize::MAX` while a character is
    /// incomplete; a stop token has none yet: see [`Decoding::finished_token_ends`]).
    pub fn token_ends(&self) -> &[usize] {
        &self.token_ends
    }

    /// Token ends with every pending end, and every token without text (a stop token), at
    /// the end of the decoded text: one per accepted token.
    pub fn finished_token_ends(&self) -> Vec<usize> {
        let end = self.text_base + self.decoded.len();
        let mut ends: Vec<usize> = self.token_ends.iter().map(|&e| if e == usize::MAX { end } else { e }).collect();
        ends.resize(self.generated.len(), end);
        ends
    }

    /// Whether a stop string (not a token) ended the sequence.
    pub fn stopped_by_string(&self) -> bool {
        self.stopped_by_string
    }
}
