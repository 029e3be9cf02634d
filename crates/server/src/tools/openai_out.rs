//! A split answer in OpenAI's chat shapes: the response's `message` (`content` null when
//! the answer is calls only, `tool_calls` with `arguments` a JSON string,
//! `reasoning_content` as OpenAI-compatible servers name it) and the streamed deltas (a
//! call's first delta carries `index`, `id`, `type`, `function.name` and `arguments: ""`,
//! the next its arguments).
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
pub(crate) fn finish(f: FinishReason, calls: &[Call]) -> &'static str {
    if !calls.is_empty() && f == FinishReason::Stop {
        "tool_calls"
    } else {
        crate::openai::finish_str(f)
    }
}

/// The deltas for `pieces`; `num_calls` counts the calls streamed so far (their indices).
pub(crate) fn deltas(pieces: Vec<Piece>, num_calls: &mut usize) -> Vec<Value> {
    let mut out = Vec::new();
    for p in pieces {
        match p {
            Piece::Reasoning(t) => out.push(json!({"reasoning_content": t})),
            Piece::Content(t) => out.push(json!({"content": t})),
            Piece::Call(c) => {
                let i = *num_calls;
                *num_calls += 1;
                out.push(
                    json!({"tool_calls": [{"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": ""}}]}),
                );
                out.push(json!({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]}));
            }
        }
    }
    out
}
