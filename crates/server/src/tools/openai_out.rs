//! A split answer in OpenAI's chat shapes: the response's `message` (`content` null when
//! the answer is calls only, `tool_calls` with `arguments` a JSON string,
//! `reasoning_content` as OpenAI-compatible servers name it) and the streamed deltas (a
//! call's first delta carries `index`, `id`, `type`, `function.name` and `arguments: ""`,
//! the next ones fragments of its arguments as the model writes them).
//!
//! Invariant: the streamed deltas of an answer put together equal its non-streamed message.

use engram_engine::FinishReason;
use serde_json::{json, Value};

use super::split::Piece;
use super::{Call, Reply};

/// The response's `message`.
pub(crate) fn message(r: &Reply) -> Value {
    let content = if r.content.is_empty() && !r.calls.is_empty() { Value::Null } else { Value::from(r.content.as_str()) };
    let mut m = json!({"role": "assistant", "content": content});
    if !r.reasoning.is_empty() {
        m["reasoning_content"] = Value::from(r.reasoning.as_str());
    }
    if !r.calls.is_empty() {
        m["tool_calls"] = Value::Array(r.calls.iter().map(call).collect());
    }
    m
}

fn call(c: &Call) -> Value {
    json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
}

/// `tool_calls` when the answer ended on its calls, else the engine's reason.
pub(crate) fn finish(f: FinishReason, r: &Reply) -> &'static str {
    if r.ended_on_calls(f) {
        "tool_calls"
    } else {
        crate::openai::finish_str(f)
    }
}

/// The calls of a streamed answer so far. Invariant: `num` calls have had their first
/// delta; `open` while the last one's text is not complete.
#[derive(Debug, Default)]
pub(crate) struct StreamedCalls {
    num: usize,
    open: bool,
}

impl StreamedCalls {
    /// The deltas for `pieces`.
    pub fn deltas(&mut self, pieces: Vec<Piece>) -> Vec<Value> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Reasoning(t) => out.push(json!({"reasoning_content": t})),
                Piece::Content(t) => out.push(json!({"content": t})),
                Piece::Call(c) => {
                    out.push(self.start(&c.id, &c.name));
                    out.push(self.args(&c.arguments));
                    self.open = false;
                }
                Piece::CallStart { id, name } => out.push(self.start(&id, &name)),
                Piece::CallArgs(t) => out.push(self.args(&t)),
                Piece::CallEnd => self.open = false,
            }
        }
        out
    }

    /// The final chunk's finish reason: `tool_calls` when the answer ended on its calls.
    pub fn finish(&self, f: FinishReason) -> &'static str {
        if self.num > 0 && !self.open && f == FinishReason::Stop {
            "tool_calls"
        } else {
            crate::openai::finish_str(f)
        }
    }

    fn start(&mut self, id: &str, name: &str) -> Value {
        self.num += 1;
        self.open = true;
        json!({"tool_calls": [{"index": self.num - 1, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}]})
    }

    fn args(&self, fragment: &str) -> Value {
        json!({"tool_calls": [{"index": self.num.saturating_sub(1), "function": {"arguments": fragment}}]})
    }
}
