//! Splits generated text into reasoning (`<think>…</think>`), content and tool calls, as it
//! streams: [`Splitter::push`] takes each piece of text and gives back what is certain so
//! far; [`Splitter::finish`] the rest. A whole answer is split by the same two calls
//! ([`Splitter::split`]), so a streamed answer reassembles to the non-streamed one.
//!
//! Held back while undecided: a possible start of `</think>` or of the family's call
//! trigger, trailing whitespace before a call, and a call until its text is complete
//! (then it comes out whole: name and arguments). The generic family's JSON answer comes
//! out at the end.
//!
//! Invariant: every [`Piece::Call`] names a tool of the request and carries arguments its
//! checker accepted; a call that fails to parse or check turns the rest of the text into
//! content.

use serde_json::Value;

use super::format::Family;
use super::{call_id, Call, Reply};

/// Accepts a call: the tool's name and arguments → the arguments as a compact JSON string,
/// or `None` when the tool is unknown or the arguments fail its schema.
pub(crate) type Checker = Box<dyn Fn(&str, &Value) -> Option<String> + Send>;

/// One certain part of the answer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Piece {
    Reasoning(String),
    Content(String),
    Call(Call),
}

/// Where the answer starts, as to reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Think {
    /// The template has no reasoning section.
    No,
    /// The answer may open with `<think>`.
    May,
    /// The prompt opened `<think>`: the answer starts inside it.
    Inside,
}

impl Think {
    /// The reasoning mode for a template's source and the rendered prompt.
    pub fn of(template: &str, prompt: &str) -> Think {
        if !template.contains("<think>") {
            Think::No
        } else if prompt.trim_end().ends_with("<think>") {
            Think::Inside
        } else {
            Think::May
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before anything: a `<think>` may open.
    Lead,
    /// In the reasoning; `fresh`: its leading newlines are still to skip.
    Think { fresh: bool },
    /// Content; `fresh`: leading newlines (after a reasoning section) still to skip.
    Body { fresh: bool },
    /// From the first call trigger on.
    Calls,
    /// After a call that did not parse: all content.
    Rest,
    /// The generic family's JSON answer, split at the end.
    Json,
}

/// Splits one answer. Invariant: `pending` holds exactly the text pushed and not yet given
/// out as pieces.
pub(crate) struct Splitter {
    calls: Option<Family>,
    check: Checker,
    state: State,
    pending: String,
}

const THINK: &str = "<think>";
const END_THINK: &str = "</think>";

/// What a call parser found at the start of the text.
enum Block {
    /// Calls, and the bytes they took.
    Done(Vec<(String, Value)>, usize),
    NeedMore,
    Invalid,
}

impl Splitter {
    /// A splitter for an answer whose calls follow `calls` (`None`: no calls are parsed).
    pub fn new(think: Think, calls: Option<Family>, check: Checker) -> Splitter {
        let state = match think {
            Think::No => State::Body { fresh: false },
            Think::May => State::Lead,
            Think::Inside => State::Think { fresh: true },
        };
        let mut s = Splitter { calls, check, state, pending: String::new() };
        if think == Think::No {
            s.state = s.body(false);
        }
        s
    }

    /// Splits a whole answer.
    pub fn split(mut self, text: &str) -> Reply {
        let mut pieces = self.push(text);
        pieces.extend(self.finish());
        collect(pieces)
    }

    fn body(&self, fresh: bool) -> State {
        match self.calls {
            Some(Family::Generic) => State::Json,
            _ => State::Body { fresh },
        }
    }

    /// Takes the next piece of text; gives back what is certain.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        while self.step(false, &mut out) {}
        out
    }

    /// The answer ended: gives back everything still held.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        while self.step(true, &mut out) {}
        out
    }

    /// One move of the state machine; false when it must wait for more text (or, at the
    /// end, when everything is out).
    fn step(&mut self, end: bool, out: &mut Vec<Piece>) -> bool {
        match self.state {
            State::Lead => {
                if self.pending.starts_with(THINK) {
                    self.pending.drain(..THINK.len());
                    self.state = State::Think { fresh: true };
                } else if THINK.starts_with(self.pending.as_str()) && !end {
                    return false;
                } else {
                    self.state = self.body(false);
                }
                true
            }
            State::Think { fresh } => {
                if fresh {
                    let skip = self.pending.len() - self.pending.trim_start_matches('\n').len();
                    self.pending.drain(..skip);
                    if self.pending.is_empty() && !end {
                        return false;
                    }
                    self.state = State::Think { fresh: false };
                }
                if let Some(at) = self.pending.find(END_THINK) {
                    emit(out, Piece::Reasoning(self.pending[..at].trim_end_matches('\n').to_string()));
                    self.pending.drain(..at + END_THINK.len());
                    self.state = self.body(true);
                    return true;
                }
                let keep = if end { 0 } else { held(&self.pending, END_THINK, false) };
                let text: String = self.pending.drain(..self.pending.len() - keep).collect();
                emit(out, Piece::Reasoning(if end { text.trim_end_matches('\n').to_string() } else { text }));
                false
            }
            State::Body { fresh } => {
                if fresh {
                    let skip = self.pending.len() - self.pending.trim_start_matches('\n').len();
                    self.pending.drain(..skip);
                    if self.pending.is_empty() && !end {
                        return false;
                    }
                    self.state = State::Body { fresh: false };
                }
                let Some(trigger) = self.calls.and_then(Family::trigger) else {
                    let text = std::mem::take(&mut self.pending);
                    emit(out, Piece::Content(text));
                    return false;
                };
                if let Some(at) = self.pending.find(trigger) {
                    // The whitespace before a call stays pending: dropped if calls follow.
                    let text: String = self.pending.drain(..self.pending[..at].trim_end().len()).collect();
                    emit(out, Piece::Content(text));
                    self.state = State::Calls;
                    return true;
                }
                let keep = if end { 0 } else { held(&self.pending, trigger, true) };
                let text: String = self.pending.drain(..self.pending.len() - keep).collect();
                emit(out, Piece::Content(text));
                false
            }
            State::Calls => {
                let skip = self.pending.len() - self.pending.trim_start().len();
                if skip == self.pending.len() {
                    if end {
                        self.pending.clear();
                    }
                    return false;
                }
                match parse_block(self.calls.unwrap_or(Family::Generic), &self.pending[skip..]) {
                    Block::Done(calls, n) => {
                        let Some(checked) = self.checked(calls) else {
                            self.state = State::Rest;
                            return true;
                        };
                        out.extend(checked.into_iter().map(Piece::Call));
                        self.pending.drain(..skip + n);
                        true
                    }
                    Block::NeedMore if !end => false,
                    Block::NeedMore | Block::Invalid => {
                        self.state = State::Rest;
                        true
                    }
                }
            }
            State::Rest => {
                let text = std::mem::take(&mut self.pending);
                emit(out, Piece::Content(text));
                false
            }
            State::Json => {
                if !end {
                    return false;
                }
                let text = std::mem::take(&mut self.pending);
                match generic_answer(&text) {
                    Some(Ok(response)) => emit(out, Piece::Content(response)),
                    Some(Err(calls)) => match self.checked(calls) {
                        Some(c) => out.extend(c.into_iter().map(Piece::Call)),
                        None => emit(out, Piece::Content(text)),
                    },
                    None => emit(out, Piece::Content(text)),
                }
                false
            }
        }
    }

    /// A fresh call id: `call_…`, or for Mistral the 9 alphanumerics its templates require.
    fn new_id(&self) -> String {
        let id = call_id();
        match self.calls {
            Some(Family::Mistral) => id.chars().rev().take(9).collect(),
            _ => id,
        }
    }

    /// The calls with their arguments checked (`None` if any fails).
    fn checked(&self, calls: Vec<(String, Value)>) -> Option<Vec<Call>> {
        calls
            .into_iter()
            .map(|(name, args)| (self.check)(&name, &args).map(|arguments| Call { id: self.new_id(), name, arguments }))
            .collect()
    }
}

fn emit(out: &mut Vec<Piece>, p: Piece) {
    match &p {
        Piece::Reasoning(t) | Piece::Content(t) if t.is_empty() => {}
        _ => out.push(p),
    }
}

/// How many bytes at the end of `text` to hold back: the longest suffix that begins
/// `marker`, and (with `whitespace`) the whitespace before it.
fn held(text: &str, marker: &str, whitespace: bool) -> usize {
    let mut keep = 0;
    for n in (1..marker.len().min(text.len() + 1)).rev() {
        if text.is_char_boundary(text.len() - n) && marker.starts_with(&text[text.len() - n..]) {
            keep = n;
            break;
        }
    }
    let before = &text[..text.len() - keep];
    let ws = if whitespace { before.len() - before.trim_end().len() } else { before.len() - before.trim_end_matches('\n').len() };
    keep + ws
}

/// A call object's name and arguments (`arguments`, or Llama's `parameters`; an object, or
/// a string holding one).
fn name_args(v: &Value) -> Option<(String, Value)> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters"))?;
    let args = match args {
        Value::String(s) => serde_json::from_str(s).ok()?,
        a => a.clone(),
    };
    args.is_object().then_some((name, args))
}

/// The first JSON value of `text`: the value and its length, or whether more text could
/// complete it.
fn json_prefix(text: &str) -> Result<(Value, usize), bool> {
    let mut it = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    match it.next() {
        Some(Ok(v)) => Ok((v, it.byte_offset())),
        Some(Err(e)) => Err(e.is_eof()),
        None => Err(true),
    }
}

fn parse_block(family: Family, text: &str) -> Block {
    let json = |body: &str, offset: usize, list: bool| match json_prefix(body) {
        Ok((v, n)) => {
            let calls: Option<Vec<_>> = match (&v, list) {
                (Value::Array(a), true) => a.iter().map(name_args).collect(),
                (v, false) => name_args(v).map(|c| vec![c]),
                _ => None,
            };
            match calls {
                Some(c) if !c.is_empty() => Block::Done(c, offset + n),
                _ => Block::Invalid,
            }
        }
        Err(true) => Block::NeedMore,
        Err(false) => Block::Invalid,
    };
    let opened = |tag: &str| {
        if text.starts_with(tag) {
            Some(true)
        } else if tag.starts_with(text) {
            Some(false)
        } else {
            None
        }
    };
    match family {
        Family::Hermes => match opened("<tool_call>") {
            Some(true) => {
                let Some(end) = text.find("</tool_call>") else { return Block::NeedMore };
                let body = text["<tool_call>".len()..end].trim();
                match serde_json::from_str::<Value>(body).ok().as_ref().and_then(name_args) {
                    Some(c) => Block::Done(vec![c], end + "</tool_call>".len()),
                    None => Block::Invalid,
                }
            }
            Some(false) => Block::NeedMore,
            None => Block::Invalid,
        },
        Family::Mistral => match opened("[TOOL_CALLS]") {
            Some(true) => json(&text["[TOOL_CALLS]".len()..], "[TOOL_CALLS]".len(), true),
            Some(false) => Block::NeedMore,
            None => Block::Invalid,
        },
        Family::Llama3 if text.starts_with('{') => json(text, 0, false),
        Family::Llama3 | Family::Generic => Block::Invalid,
    }
}

/// The generic family's answer: `Ok(text)` for `{"response": text}`, `Err(calls)` for
/// `{"tool_call": ..}` / `{"tool_calls": [..]}`; `None` for anything else.
fn generic_answer(text: &str) -> Option<Result<String, Vec<(String, Value)>>> {
    let v: Value = serde_json::from_str(text.trim()).ok()?;
    let o = v.as_object()?;
    if o.len() != 1 {
        return None;
    }
    if let Some(r) = o.get("response") {
        return r.as_str().map(|s| Ok(s.to_string()));
    }
    if let Some(c) = o.get("tool_call") {
        return name_args(c).map(|c| Err(vec![c]));
    }
    let calls: Option<Vec<_>> = o.get("tool_calls")?.as_array()?.iter().map(name_args).collect();
    calls.filter(|c| !c.is_empty()).map(Err)
}

/// The pieces of an answer put together.
pub(crate) fn collect(pieces: Vec<Piece>) -> Reply {
    let mut r = Reply::default();
    for p in pieces {
        match p {
            Piece::Reasoning(t) => r.reasoning.push_str(&t),
            Piece::Content(t) => r.content.push_str(&t),
            Piece::Call(c) => r.calls.push(c),
        }
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn any_tool() -> Checker {
        Box::new(|name, args| (name != "unknown").then(|| args.to_string()))
    }

    /// Splits `text` whole and one character at a time: the same reply.
    fn both(think: Think, calls: Option<Family>, text: &str) -> Reply {
        let whole = Splitter::new(think, calls, any_tool()).split(text);
        let mut s = Splitter::new(think, calls, any_tool());
        let mut pieces = Vec::new();
        for c in text.chars() {
            pieces.extend(s.push(&c.to_string()));
        }
        pieces.extend(s.finish());
        let streamed = collect(pieces);
        let strip = |r: &Reply| {
            (r.reasoning.clone(), r.content.clone(), r.calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect::<Vec<_>>())
        };
        assert_eq!(strip(&whole), strip(&streamed), "{text:?}");
        whole
    }

    #[test]
    fn hermes_calls_and_reasoning_split_the_same_whole_or_streamed() {
        let text = "<think>\nhmm\n</think>\n\nLet me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\":1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
        let r = both(Think::May, Some(Family::Hermes), text);
        assert_eq!(r.reasoning, "hmm");
        assert_eq!(r.content, "Let me look.");
        assert_eq!(r.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["f", "g"]);
        assert_eq!(r.calls[0].arguments, "{\"x\":1}");
        assert!(r.calls[0].id.starts_with("call_"));
    }

    #[test]
    fn a_call_that_does_not_parse_or_check_is_content() {
        let cut = "Hi <tool_call>\n{\"name\": \"f\", \"argu";
        let r = both(Think::No, Some(Family::Hermes), cut);
        assert!(r.calls.is_empty());
        assert_eq!(r.content, "Hi <tool_call>\n{\"name\": \"f\", \"argu");
        let unknown = "<tool_call>{\"name\": \"unknown\", \"arguments\": {}}</tool_call>";
        assert!(both(Think::No, Some(Family::Hermes), unknown).calls.is_empty());
        assert_eq!(both(Think::No, None, "plain <tool_call>").content, "plain <tool_call>");
    }

    #[test]
    fn reasoning_opened_by_the_prompt_and_never_closed() {
        let r = both(Think::Inside, None, "\nstill thinking");
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("still thinking", ""));
        let r = both(Think::May, None, "<thin");
        assert_eq!(r.content, "<thin");
    }

    #[test]
    fn the_generic_json_answer_is_text_or_calls() {
        assert_eq!(both(Think::No, Some(Family::Generic), "{\"response\":\"hi \\\"x\\\"\"}").content, "hi \"x\"");
        let r = both(
            Think::No,
            Some(Family::Generic),
            "{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{}},{\"name\":\"g\",\"arguments\":{\"a\":[1]}}]}",
        );
        assert_eq!(r.calls.len(), 2);
        assert_eq!(both(Think::No, Some(Family::Generic), "not json").content, "not json");
    }

    #[test]
    fn llama_and_mistral_calls() {
        let r = both(Think::No, Some(Family::Llama3), "{\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}");
        assert_eq!((r.calls[0].name.as_str(), r.calls[0].arguments.as_str()), ("f", "{\"q\":\"x\"}"));
        let r = both(
            Think::No,
            Some(Family::Mistral),
            "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {}}]",
        );
        assert_eq!(r.calls.len(), 2);
    }
}
