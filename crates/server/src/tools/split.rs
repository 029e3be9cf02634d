//! Splits generated text into reasoning (`<think>…</think>`), content and tool calls, as it
//! streams: [`Splitter::push`] takes each piece of text and gives back what is certain so
//! far; [`Splitter::finish`] the rest. A whole answer is split by the same two calls
//! ([`Splitter::split`]), so a streamed answer reassembles to the non-streamed one.
//!
//! Held back while undecided: a possible start of `</think>` or of the family's call
//! trigger, trailing whitespace before a call, and a call's head until it names a tool.
//! A call in its family's usual shape (`{"name": "f", "arguments": {..}}`) then streams:
//! [`Piece::CallStart`] (id and name), its arguments as they come ([`Piece::CallArgs`],
//! whitespace between JSON tokens dropped), and [`Piece::CallEnd`] once its text is
//! complete and the arguments passed the tool's schema. A call in another shape comes out
//! whole when complete ([`Piece::Call`]); so does every call with
//! [`Splitter::whole_calls`]. The generic family's JSON answer comes out at the end.
//!
//! Invariant: every call named by a [`Piece::Call`] or a [`Piece::CallStart`] is a tool of
//! the request; a whole call's arguments, and a streamed call's followed by `CallEnd`,
//! passed its checker. A streamed call without its `CallEnd` (cut short, or failing its
//! schema) leaves [`Reply::incomplete`] set; a call that fails to parse or check turns the
//! rest of the text into content.

use serde_json::Value;

use std::collections::VecDeque;

use super::call_block::{generic_answer, parse_block, Block, Written};
use super::format::Family;
use super::stream_call::{self, Args, Match};
use super::{call_id, Call, Reply};

/// Checks calls against the request's tools.
pub(crate) trait Check: Send {
    /// Whether `name` is one of the request's tools.
    fn knows(&self, name: &str) -> bool;
    /// Whether `arguments` (compact JSON text) are valid for tool `name`.
    fn accepts(&self, name: &str, arguments: &str) -> bool;
}

/// A request's call checker.
pub(crate) type Checker = Box<dyn Check>;

/// One certain part of the answer.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Piece {
    Reasoning(String),
    Content(String),
    /// A whole call.
    Call(Call),
    /// A streamed call opens; its arguments follow as [`Piece::CallArgs`].
    CallStart {
        id: String,
        name: String,
    },
    /// The next fragment of the open call's compact arguments.
    CallArgs(String),
    /// The open call's text is complete and its arguments passed the tool's schema.
    CallEnd,
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
    /// GPT-OSS's harmony messages: `<|channel|>analysis` is reasoning, a message to
    /// `functions.NAME` a call, the rest (`final`) content.
    Harmony,
}

impl Think {
    /// The reasoning mode for a template's source and the rendered prompt.
    pub fn of(template: &str, prompt: &str) -> Think {
        if template.contains(H_CHANNEL) && template.contains(H_MESSAGE) {
            Think::Harmony
        } else if !template.contains("<think>") {
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
    /// From the first call trigger on, before a call.
    Calls,
    /// Inside a streamed call's arguments.
    Args,
    /// After a streamed call's arguments: the literals that close the call.
    Close,
    /// Mistral, after a call in its list: `,` and the next call, or `]`.
    Next,
    /// After a call that did not parse: all content.
    Rest,
    /// The generic family's JSON answer, before its shape is known.
    Json,
    /// The generic family's text answer: the string of `{"response": "..."}`, decoded as it
    /// comes.
    JsonText,
    /// After the generic answer's string or single call: its closing `}`.
    JsonEnd,
    /// A generic answer in a shape of its own: split whole at the end.
    JsonWhole,
    /// Harmony: a message's header, up to `<|message|>`.
    HHeader,
    /// Harmony: a message's body, reasoning (the `analysis` channel) or content.
    HBody { reasoning: bool },
    /// Harmony: after a message, its end marker and the next `<|start|>`.
    HNext,
}

/// Harmony's markers (special tokens in GPT-OSS's vocabulary, shown in the answer's text).
const H_CHANNEL: &str = "<|channel|>";
const H_MESSAGE: &str = "<|message|>";
const H_START: &str = "<|start|>";
/// What ends a harmony message's body (`<|call|>` and `<|return|>` are stop tokens of
/// GPT-OSS: they end the answer before the text shows them, but a model without them as
/// stops writes them).
const H_ENDS: [&str; 4] = ["<|end|>", "<|call|>", "<|return|>", H_START];
/// The longest header a harmony message may have: past it, the answer is not harmony.
const MAX_HEADER: usize = 256;

/// Splits one answer. Invariant: `pending` holds exactly the text pushed and not yet given
/// out as pieces.
pub(crate) struct Splitter {
    calls: Option<Family>,
    check: Checker,
    state: State,
    pending: String,
    /// The streamed call's arguments so far, and its name.
    args: Args,
    name: String,
    /// Whether calls come out whole ([`Piece::Call`]) instead of streamed.
    whole: bool,
    /// With `whole`: the streamed call being put together.
    open: Option<Call>,
    /// Mistral's call ids the grammar writes, in order, not yet given to a call.
    ids: VecDeque<String>,
    /// The streamed call's id.
    id: String,
    /// The generic answer holds a list of calls (`{"tool_calls": [..]}`).
    generic_list: bool,
}

const THINK: &str = "<think>";
const END_THINK: &str = "</think>";

impl Splitter {
    /// A splitter for an answer whose calls follow `calls` (`None`: no calls are parsed).
    pub fn new(think: Think, calls: Option<Family>, check: Checker) -> Splitter {
        let state = match think {
            Think::No => State::Body { fresh: false },
            Think::May => State::Lead,
            Think::Inside => State::Think { fresh: true },
            Think::Harmony => State::HHeader,
        };
        let mut s = Splitter {
            calls,
            check,
            state,
            pending: String::new(),
            args: Args::default(),
            name: String::new(),
            whole: false,
            open: None,
            ids: VecDeque::new(),
            id: String::new(),
            generic_list: false,
        };
        if think == Think::No {
            s.state = s.body(false);
        }
        s
    }

    /// The same splitter with the call ids the grammar writes (Mistral's), in order: each
    /// call takes the next.
    pub fn with_ids(mut self, ids: Vec<String>) -> Splitter {
        self.ids = ids.into();
        self
    }

    /// The same splitter giving each call whole, once complete (a call cut short is left
    /// out): for APIs without streamed arguments.
    pub fn whole_calls(mut self) -> Splitter {
        self.whole = true;
        self
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
        self.joined(out)
    }

    /// The answer ended: gives back everything still held.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        while self.step(true, &mut out) {}
        self.joined(out)
    }

    /// With [`Splitter::whole_calls`], streamed calls put together.
    fn joined(&mut self, pieces: Vec<Piece>) -> Vec<Piece> {
        if !self.whole {
            return pieces;
        }
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::CallStart { id, name } => self.open = Some(Call { id, name, arguments: String::new() }),
                Piece::CallArgs(t) => {
                    if let Some(c) = &mut self.open {
                        c.arguments.push_str(&t);
                    }
                }
                Piece::CallEnd => out.extend(self.open.take().map(Piece::Call)),
                p => out.push(p),
            }
        }
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
                let triggers = self.calls.map_or(&[][..], Family::text_triggers);
                if triggers.is_empty() {
                    let text = std::mem::take(&mut self.pending);
                    emit(out, Piece::Content(text));
                    return false;
                }
                if let Some(at) = triggers.iter().filter_map(|t| self.pending.find(t)).min() {
                    // The whitespace before a call stays pending: dropped if calls follow.
                    let text: String = self.pending.drain(..self.pending[..at].trim_end().len()).collect();
                    emit(out, Piece::Content(text));
                    self.state = State::Calls;
                    return true;
                }
                let keep = if end { 0 } else { triggers.iter().map(|t| held(&self.pending, t, true)).max().unwrap_or(0) };
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
                let family = self.calls.unwrap_or(Family::Generic);
                for opening in openings(family) {
                    match stream_call::head(&self.pending[skip..], opening) {
                        Match::Yes(name, n) if self.check.knows(&name) => {
                            self.pending.drain(..skip + n);
                            self.start_call(name, out);
                            return true;
                        }
                        Match::More if !end => return false,
                        _ => {}
                    }
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
            State::Args => {
                let fed = self.args.feed(&self.pending);
                self.pending.drain(..fed.taken);
                if !fed.fragment.is_empty() {
                    out.push(Piece::CallArgs(fed.fragment));
                }
                if !fed.done {
                    return false;
                }
                let args = &self.args.text;
                let valid = serde_json::from_str::<Value>(args).is_ok_and(|v| v.is_object()) && self.check.accepts(&self.name, args);
                self.state = if valid { State::Close } else { State::Rest };
                true
            }
            State::Close => {
                let family = self.calls.unwrap_or(Family::Generic);
                // Mistral's call ends with its id (`, "id": "<id>"}`) when the grammar wrote one.
                let quoted = format!("\"{}\"", self.id);
                let with_id = [",", "\"id\"", ":", quoted.as_str(), "}"];
                let with_id = match family {
                    Family::Mistral => stream_call::literals(&self.pending, &with_id),
                    _ => Match::No,
                };
                let generic_one = ["}", "}"];
                let plain = match family {
                    Family::Generic if !self.generic_list => stream_call::literals(&self.pending, &generic_one),
                    _ => stream_call::literals(&self.pending, closing(family)),
                };
                let closed = match (with_id, plain) {
                    (Match::Yes((), n), _) | (_, Match::Yes((), n)) => Match::Yes((), n),
                    (Match::More, _) | (_, Match::More) => Match::More,
                    _ => Match::No,
                };
                match closed {
                    Match::Yes((), n) => {
                        self.pending.drain(..n);
                        out.push(Piece::CallEnd);
                        self.state = match family {
                            Family::Mistral => State::Next,
                            Family::Generic if self.generic_list => State::Next,
                            Family::Generic => State::Rest,
                            Family::Harmony => State::HNext,
                            _ => State::Calls,
                        };
                        true
                    }
                    Match::More if !end => false,
                    _ => {
                        self.state = State::Rest;
                        true
                    }
                }
            }
            State::Next => {
                let generic = self.calls == Some(Family::Generic);
                let close = stream_call::literals(&self.pending, if generic { &["]", "}"] } else { &["]"] });
                let comma = stream_call::literals(&self.pending, &[","]);
                match (close, comma) {
                    (Match::Yes((), n), _) => {
                        self.pending.drain(..n);
                        self.state = if generic { State::Rest } else { State::Calls };
                        true
                    }
                    (_, Match::Yes((), n)) => match stream_call::head(&self.pending[n..], &[]) {
                        Match::Yes(name, m) if self.check.knows(&name) => {
                            self.pending.drain(..n + m);
                            self.start_call(name, out);
                            true
                        }
                        Match::More if !end => false,
                        _ => {
                            self.state = State::Rest;
                            true
                        }
                    },
                    (Match::More, _) | (_, Match::More) if !end => false,
                    _ => {
                        self.state = State::Rest;
                        true
                    }
                }
            }
            State::HHeader => {
                let Some(at) = self.pending.find(H_MESSAGE) else {
                    if end || self.pending.len() > MAX_HEADER {
                        self.state = State::Rest;
                        return true;
                    }
                    return false;
                };
                let header: String = self.pending.drain(..at + H_MESSAGE.len()).collect();
                let header = &header[..at];
                let call = header_field(header, "to=").and_then(|r| r.strip_prefix("functions."));
                match call {
                    Some(name) if self.calls.is_some() && self.check.knows(name) => self.start_call(name.to_string(), out),
                    _ => self.state = State::HBody { reasoning: header_field(header, H_CHANNEL) == Some("analysis") },
                }
                true
            }
            State::HBody { reasoning } => {
                let found = H_ENDS.iter().filter_map(|m| self.pending.find(m)).min();
                let cut = match found {
                    Some(at) => at,
                    None if end => self.pending.len(),
                    None => self.pending.len() - H_ENDS.iter().map(|m| held(&self.pending, m, false)).max().unwrap_or(0),
                };
                let text: String = self.pending.drain(..cut).collect();
                emit(out, if reasoning { Piece::Reasoning(text) } else { Piece::Content(text) });
                if found.is_some() {
                    self.state = State::HNext;
                    return true;
                }
                false
            }
            State::HNext => {
                while let Some(m) = H_ENDS.iter().find(|m| self.pending.starts_with(*m)) {
                    self.pending.drain(..m.len());
                }
                if self.pending.is_empty() || (!end && H_ENDS.iter().any(|m| m.starts_with(self.pending.as_str()))) {
                    return false;
                }
                self.state = State::HHeader;
                true
            }
            State::Rest => {
                let text = std::mem::take(&mut self.pending);
                emit(out, Piece::Content(text));
                false
            }
            State::Json => {
                // A call's arguments stream as they are written; a text answer's string as it
                // is decoded; any other shape is split whole at the end. With whole calls, the
                // calls are read at the end too: an answer cut inside one stays its text.
                let mut more = false;
                let calls: &[(&[&str], bool)] = if self.whole { &[] } else { &[(&GENERIC_ONE, false), (&GENERIC_LIST, true)] };
                for &(opening, list) in calls {
                    match stream_call::head(&self.pending, opening) {
                        Match::Yes(name, n) if self.check.knows(&name) => {
                            self.pending.drain(..n);
                            self.generic_list = list;
                            self.start_call(name, out);
                            return true;
                        }
                        Match::More => more = true,
                        _ => {}
                    }
                }
                match stream_call::literals(&self.pending, &GENERIC_TEXT) {
                    Match::Yes((), n) => {
                        self.pending.drain(..n);
                        self.state = State::JsonText;
                        return true;
                    }
                    Match::More => more = true,
                    Match::No => {}
                }
                if more && !end {
                    return false;
                }
                self.state = State::JsonWhole;
                true
            }
            State::JsonText => {
                let (text, taken, closed) = stream_call::string_prefix(&self.pending, end);
                self.pending.drain(..taken);
                emit(out, Piece::Content(text));
                if closed {
                    self.state = State::JsonEnd;
                    return true;
                }
                if end {
                    self.state = State::Rest;
                    return true;
                }
                false
            }
            State::JsonEnd => match stream_call::literals(&self.pending, &["}"]) {
                Match::More if !end => false,
                Match::Yes((), n) => {
                    self.pending.drain(..n);
                    self.state = State::Rest;
                    true
                }
                _ => {
                    self.state = State::Rest;
                    true
                }
            },
            State::JsonWhole => {
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

    /// Opens a streamed call of tool `name`.
    fn start_call(&mut self, name: String, out: &mut Vec<Piece>) {
        self.id = self.new_id();
        out.push(Piece::CallStart { id: self.id.clone(), name: name.clone() });
        self.name = name;
        self.args = Args::default();
        self.state = State::Args;
    }

    /// The next call's id: `call_…`, or for Mistral the next id the grammar writes (else
    /// fresh: the 9 alphanumerics its templates require).
    fn new_id(&mut self) -> String {
        match self.calls {
            Some(Family::Mistral) => self.ids.pop_front().unwrap_or_else(super::mistral_call_id),
            _ => call_id(),
        }
    }

    /// The calls with their arguments checked (`None` if any fails); a Mistral call keeps
    /// the id it was written with.
    fn checked(&mut self, calls: Vec<Written>) -> Option<Vec<Call>> {
        let mut out = Vec::new();
        for Written { name, args, id } in calls {
            let arguments = serde_json::to_string(&args).ok()?;
            if !(self.check.knows(&name) && self.check.accepts(&name, &arguments)) {
                return None;
            }
            let id = match id.filter(|id| self.calls == Some(Family::Mistral) && is_mistral_id(id)) {
                Some(id) => {
                    if self.ids.front() == Some(&id) {
                        self.ids.pop_front();
                    }
                    id
                }
                None => self.new_id(),
            };
            out.push(Call { id, name, arguments });
        }
        Some(out)
    }
}

/// The generic answer's openings: one call, a list of calls, a text answer's string.
const GENERIC_ONE: [&str; 3] = ["{", "\"tool_call\"", ":"];
const GENERIC_LIST: [&str; 4] = ["{", "\"tool_calls\"", ":", "["];
const GENERIC_TEXT: [&str; 4] = ["{", "\"response\"", ":", "\""];

/// Whether `id` is a Mistral call id: 9 ASCII letters and digits.
fn is_mistral_id(id: &str) -> bool {
    id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric())
}

/// The literals that may come before a streamed call's `{"name"`, tried in order (none:
/// the family's calls are not streamed this way).
fn openings(family: Family) -> &'static [&'static [&'static str]] {
    match family {
        Family::Hermes => &[&["<tool_call>"]],
        Family::Mistral => &[&["[TOOL_CALLS]", "["]],
        Family::Llama3 => &[&["<|python_tag|>"], &[]],
        Family::Generic | Family::Harmony => &[],
    }
}

/// A harmony header's field: the word after `key` (`<|channel|>`, `to=`), up to a space or
/// the next marker.
fn header_field<'h>(header: &'h str, key: &str) -> Option<&'h str> {
    let rest = &header[header.find(key)? + key.len()..];
    let end = rest.find(|c: char| c.is_whitespace() || c == '<').unwrap_or(rest.len());
    Some(&rest[..end])
}

/// The literals after a streamed call's arguments that complete the call.
fn closing(family: Family) -> &'static [&'static str] {
    match family {
        Family::Hermes => &["}", "</tool_call>"],
        Family::Harmony => &[],
        _ => &["}"],
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

/// The pieces of an answer put together.
pub(crate) fn collect(pieces: Vec<Piece>) -> Reply {
    let mut r = Reply::default();
    for p in pieces {
        match p {
            Piece::Reasoning(t) => r.reasoning.push_str(&t),
            Piece::Content(t) => r.content.push_str(&t),
            Piece::Call(c) => r.calls.push(c),
            Piece::CallStart { id, name } => {
                r.calls.push(Call { id, name, arguments: String::new() });
                r.incomplete = true;
            }
            Piece::CallArgs(t) => {
                if let Some(c) = r.calls.last_mut() {
                    c.arguments.push_str(&t);
                }
            }
            Piece::CallEnd => r.incomplete = false,
        }
    }
    r
}

#[cfg(test)]
#[path = "split_tests.rs"]
mod tests;
