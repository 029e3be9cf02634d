//! Tool use in Anthropic's Messages shapes: a message's content blocks in (`text`,
//! `tool_use` from the assistant, `tool_result` from the user, `thinking` given back) as chat
//! messages, and a split answer out as content blocks (`thinking`, `text`, `tool_use` with
//! its `input` object), whole or as the stream's block events (`thinking_delta`,
//! `text_delta`, `input_json_delta`).
//!
//! Invariant: the streamed blocks put together equal the non-streamed content.

use engram_tokenizer::ChatMessage;
use serde_json::{json, Value};

use super::split::Piece;
use super::{Call, Reply};
use crate::error::ApiError;

/// An Anthropic `tool_use` id for a call (`toolu_` and random hex).
fn tool_use_id(c: &Call) -> String {
    c.id.replacen("call_", "toolu_", 1)
}

fn text_of(field: &str, v: &Value) -> Result<String, ApiError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => out.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::bad_param(
                            &format!("{field}[{j}].type"),
                            format!("{field}[{j}]: a content block of type {kind:?} is not supported here (only text)"),
                        ))
                    }
                }
            }
            Ok(out)
        }
        _ => Err(ApiError::bad_param(field, format!("{field} must be a string or a list of content blocks"))),
    }
}

/// One Anthropic message (`role`, `content`) as chat messages: its text; an assistant's
/// `tool_use` blocks as `tool_calls` and `thinking` as `reasoning_content`; a user's
/// `tool_result` blocks as `tool` messages (before the user's own text).
pub(crate) fn message(i: usize, role: &str, content: &Value) -> Result<Vec<ChatMessage>, ApiError> {
    let field = format!("messages[{i}].content");
    let Value::Array(blocks) = content else {
        return Ok(vec![ChatMessage::new(role, text_of(&field, content)?)]);
    };
    let (mut text, mut thinking, mut calls, mut results) = (String::new(), String::new(), Vec::new(), Vec::new());
    for (j, b) in blocks.iter().enumerate() {
        let bf = format!("{field}[{j}]");
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        match (kind, role) {
            ("text", _) => text.push_str(&text_of(&bf, &Value::Array(vec![b.clone()]))?),
            ("thinking", "assistant") => thinking.push_str(b.get("thinking").and_then(Value::as_str).unwrap_or("")),
            ("redacted_thinking", "assistant") => {}
            ("tool_use", "assistant") => {
                let id = b
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::bad_param(&format!("{bf}.id"), format!("{bf}.id: a string is required")))?;
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::bad_param(&format!("{bf}.name"), format!("{bf}.name: a string is required")))?;
                let input = b
                    .get("input")
                    .filter(|v| v.is_object())
                    .ok_or_else(|| ApiError::bad_param(&format!("{bf}.input"), format!("{bf}.input must be an object")))?;
                calls.push(json!({"id": id, "type": "function", "function": {"name": name, "arguments": input.to_string()}}));
            }
            ("tool_result", "user") => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::bad_param(&format!("{bf}.tool_use_id"), format!("{bf}.tool_use_id: a string is required")))?;
                let body = text_of(&format!("{bf}.content"), b.get("content").unwrap_or(&Value::Null))?;
                results.push(ChatMessage::new("tool", body).with("tool_call_id", Value::from(id)));
            }
            _ => {
                return Err(ApiError::bad_param(
                    &format!("{bf}.type"),
                    format!("{bf}: a content block of type {kind:?} is not supported in a {role} message"),
                ))
            }
        }
    }
    let mut out = results;
    if role == "assistant" {
        let mut m = ChatMessage::new(role, text);
        if !calls.is_empty() {
            m = m.with("tool_calls", Value::Array(calls));
        }
        if !thinking.is_empty() {
            m = m.with("reasoning_content", Value::from(thinking));
        }
        out.push(m);
    } else if !text.is_empty() || out.is_empty() {
        out.push(ChatMessage::new(role, text));
    }
    Ok(out)
}

/// The content blocks of a whole answer.
pub(crate) fn blocks(r: &Reply) -> Vec<Value> {
    let mut out = Vec::new();
    if !r.reasoning.is_empty() {
        out.push(json!({"type": "thinking", "thinking": r.reasoning, "signature": ""}));
    }
    if !r.content.is_empty() || (r.calls.is_empty() && r.reasoning.is_empty()) {
        out.push(json!({"type": "text", "text": r.content}));
    }
    for c in &r.calls {
        let input: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
        out.push(json!({"type": "tool_use", "id": tool_use_id(c), "name": c.name, "input": input}));
    }
    out
}

/// The stream's content blocks: opens, feeds and closes them as pieces come.
#[derive(Default)]
pub(crate) struct BlockStream {
    /// The open block's index and kind.
    open: Option<(usize, &'static str)>,
    next: usize,
    /// Whether any call was streamed.
    calls: bool,
    /// Whether the last streamed call's text is not complete yet.
    open_call: bool,
}

impl BlockStream {
    /// The `(event name, data)` pairs for `pieces`.
    pub fn events(&mut self, pieces: Vec<Piece>) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Reasoning(t) => {
                    let i = self.ensure(&mut out, "thinking", json!({"type": "thinking", "thinking": "", "signature": ""}));
                    out.push((
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i, "delta": {"type": "thinking_delta", "thinking": t}}),
                    ));
                }
                Piece::Content(t) => {
                    let i = self.ensure(&mut out, "text", json!({"type": "text", "text": ""}));
                    out.push((
                        "content_block_delta",
                        json!({"type": "content_block_delta", "index": i, "delta": {"type": "text_delta", "text": t}}),
                    ));
                }
                Piece::Call(c) => {
                    self.start_call(&mut out, &c);
                    self.call_args(&mut out, c.arguments);
                    self.close(&mut out);
                    self.open_call = false;
                }
                Piece::CallStart { id, name } => {
                    self.start_call(&mut out, &Call { id, name, arguments: String::new() });
                }
                Piece::CallArgs(t) => self.call_args(&mut out, t),
                Piece::CallEnd => {
                    self.close(&mut out);
                    self.open_call = false;
                }
            }
        }
        out
    }

    /// Whether the answer ended on complete calls (`tool_use`), given the engine's reason.
    pub fn ended_on_calls(&self, finish: engram_engine::FinishReason) -> bool {
        self.calls && !self.open_call && finish == engram_engine::FinishReason::Stop
    }

    /// Opens a `tool_use` block for call `c`.
    fn start_call(&mut self, out: &mut Vec<(&'static str, Value)>, c: &Call) {
        self.close(out);
        self.ensure(out, "tool_use", json!({"type": "tool_use", "id": tool_use_id(c), "name": c.name, "input": {}}));
        self.calls = true;
        self.open_call = true;
    }

    /// An `input_json_delta` of the open call's arguments.
    fn call_args(&mut self, out: &mut Vec<(&'static str, Value)>, partial: String) {
        let Some((i, "tool_use")) = self.open else { return };
        out.push((
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i, "delta": {"type": "input_json_delta", "partial_json": partial}}),
        ));
    }

    /// Closes the open block at the answer's end (an answer of nothing gets one empty text
    /// block, as Anthropic's API always has content).
    pub fn end(&mut self) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if self.next == 0 {
            self.ensure(&mut out, "text", json!({"type": "text", "text": ""}));
        }
        self.close(&mut out);
        out
    }

    fn ensure(&mut self, out: &mut Vec<(&'static str, Value)>, kind: &'static str, start: Value) -> usize {
        if let Some((i, k)) = self.open {
            if k == kind && kind != "tool_use" {
                return i;
            }
            self.close(out);
        }
        let i = self.next;
        self.next += 1;
        self.open = Some((i, kind));
        out.push(("content_block_start", json!({"type": "content_block_start", "index": i, "content_block": start})));
        i
    }

    fn close(&mut self, out: &mut Vec<(&'static str, Value)>) {
        if let Some((i, _)) = self.open.take() {
            out.push(("content_block_stop", json!({"type": "content_block_stop", "index": i})));
        }
    }
}
