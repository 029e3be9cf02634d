//! What a tool call written by the model looks like, per template family: the calls at the
//! start of a piece of text ([`parse_block`]: the family's markers around JSON call objects,
//! or Llama 3.1's built-in `tool.call(..)` form) and the generic family's whole JSON answer
//! ([`generic_answer`]). The streaming splitter (`split.rs`) decides where such a block
//! starts; this file only reads it.
//!
//! Invariant: a block is `Done` only when every call in it has a name and an object of
//! arguments (whether the tool exists and accepts them is the splitter's check); text that a longer text could still complete is `NeedMore`, never `Invalid`.

use serde_json::Value;

use super::format::Family;

/// One call as written: its tool's name, its arguments (an object) and the id written with
/// it (Mistral's templates write one after the arguments).
#[derive(Debug)]
pub(super) struct Written {
    pub name: String,
    pub args: Value,
    pub id: Option<String>,
}

/// What a call parser found at the start of the text.
pub(super) enum Block {
    /// Calls, and the bytes they took.
    Done(Vec<Written>, usize),
    NeedMore,
    Invalid,
}

/// A call object's name, arguments (`arguments`, or Llama's `parameters`; an object, or
/// a string holding one) and id, if it has one.
fn name_args(v: &Value) -> Option<Written> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters"))?;
    let args = match args {
        Value::String(s) => serde_json::from_str(s).ok()?,
        a => a.clone(),
    };
    let id = v.get("id").and_then(Value::as_str).map(str::to_string);
    args.is_object().then_some(Written { name, args, id })
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

/// The calls `family`'s model wrote at the start of `text` (its markers and JSON, or Llama's
/// built-in form), whether more text could complete them, or that it is no call.
pub(super) fn parse_block(family: Family, text: &str) -> Block {
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
        Family::Llama3 if text.starts_with("<|python_tag|>") => {
            let body = &text["<|python_tag|>".len()..];
            let ws = body.len() - body.trim_start().len();
            let offset = "<|python_tag|>".len() + ws;
            match body[ws..].chars().next() {
                None => Block::NeedMore,
                Some('{') => json(&body[ws..], offset, false),
                Some(_) => match builtin_call(&body[ws..]) {
                    Block::Done(c, n) => Block::Done(c, offset + n),
                    b => b,
                },
            }
        }
        Family::Llama3 if "<|python_tag|>".starts_with(text) => Block::NeedMore,
        Family::Llama3 | Family::Generic | Family::Harmony => Block::Invalid,
    }
}

/// A Llama built-in tool's call after `<|python_tag|>`: `name.call(key=value, ..)` with
/// JSON values (the template writes strings in double quotes), as a name and an object.
fn builtin_call(text: &str) -> Block {
    let name_len = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(text.len());
    let rest = &text[name_len..];
    if name_len == 0 || !rest.starts_with(".call(") {
        return if name_len == text.len() || ".call(".starts_with(rest) { Block::NeedMore } else { Block::Invalid };
    }
    let mut at = name_len + ".call(".len();
    let mut args = serde_json::Map::new();
    loop {
        at += text[at..].len() - text[at..].trim_start().len();
        if text[at..].starts_with(')') {
            return Block::Done(vec![Written { name: text[..name_len].to_string(), args: Value::Object(args), id: None }], at + 1);
        }
        let Some(eq) = text[at..].find('=') else { return Block::NeedMore };
        let key = text[at..at + eq].trim();
        if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Block::Invalid;
        }
        at += eq + 1;
        at += text[at..].len() - text[at..].trim_start().len();
        let rest = &text[at..];
        // A string, list or object is read as JSON; a number or literal up to its delimiter
        // (JSON's reader wants a number followed by a JSON delimiter, not `)`).
        let (value, n) = if rest.starts_with(['"', '{', '[']) {
            match json_prefix(rest) {
                Ok(v) => v,
                Err(true) => return Block::NeedMore,
                Err(false) => return Block::Invalid,
            }
        } else {
            let Some(end) = rest.find([',', ')']) else { return Block::NeedMore };
            match serde_json::from_str(rest[..end].trim()) {
                Ok(v) => (v, end),
                Err(_) => return Block::Invalid,
            }
        };
        args.insert(key.to_string(), value);
        at += n;
        at += text[at..].len() - text[at..].trim_start().len();
        if text[at..].starts_with(',') {
            at += 1;
        } else if text[at..].is_empty() {
            return Block::NeedMore;
        } else if !text[at..].starts_with(')') {
            return Block::Invalid;
        }
    }
}

/// The generic family's answer: `Ok(text)` for `{"response": text}`, `Err(calls)` for
/// `{"tool_call": ..}` / `{"tool_calls": [..]}`; `None` for anything else.
pub(super) fn generic_answer(text: &str) -> Option<Result<String, Vec<Written>>> {
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
