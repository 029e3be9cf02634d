//! The OpenAI-shaped results, as `/v1/chat/completions` and `/v1/completions` send them: a
//! whole `chat.completion` / `text_completion`, or the chunks of a stream.

use std::sync::Arc;

use engram_engine::{FinishReason, TokenLogprob};
use engram_model::Model;
use engram_server::logprobs::{chat_object, completion_object};
use serde_json::{json, Value};

use crate::job::Done;

/// What kind of answer a job gives.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Text,
}

/// The ids and names every object of one answer carries.
pub struct Header {
    pub id: String,
    pub created: u64,
    pub model: String,
    pub kind: Kind,
    /// The model whose tokens log-probabilities name, when the call asked for them.
    pub logprobs_of: Option<Arc<Model>>,
}

impl Header {
    /// A fresh header for `model`'s answer of `kind`.
    pub fn new(kind: Kind, model: &str, logprobs_of: Option<Arc<Model>>) -> Header {
        let prefix = if kind == Kind::Chat { "chatcmpl" } else { "cmpl" };
        Header { id: engram_server::new_id(prefix), created: engram_server::now_s(), model: model.to_string(), kind, logprobs_of }
    }

    /// The `logprobs` object of `entries` (`null` when the call asked for none); a text
    /// completion's offsets count from `*offset`, which moves past them.
    fn logprobs(&self, entries: &[TokenLogprob], offset: &mut usize) -> Value {
        match (&self.logprobs_of, self.kind) {
            (None, _) => Value::Null,
            (Some(m), Kind::Chat) => chat_object(&m.tokenizer, entries),
            (Some(m), Kind::Text) => completion_object(&m.tokenizer, entries, offset),
        }
    }

    /// The whole answer.
    pub fn whole(&self, d: &Done) -> Value {
        let logprobs = self.logprobs(&d.logprobs, &mut 0);
        let choice = match self.kind {
            Kind::Chat => {
                json!({"index": 0, "message": {"role": "assistant", "content": d.text}, "logprobs": logprobs, "finish_reason": finish_str(d.finish)})
            }
            Kind::Text => json!({"index": 0, "text": d.text, "logprobs": logprobs, "finish_reason": finish_str(d.finish)}),
        };
        json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": usage(d.prompt_tokens, d.completion_tokens, d.cached_tokens),
        })
    }

    /// One chunk of a stream: `piece` of text (a chat stream's first chunk carries the role),
    /// or the last one with its finish reason; with the log-probabilities of the tokens whose
    /// text it carries (`entries`; a text stream's offsets from `*offset`).
    pub fn chunk(
        &self,
        piece: Option<&str>,
        role: bool,
        finish: Option<FinishReason>,
        entries: &[TokenLogprob],
        offset: &mut usize,
    ) -> Value {
        let logprobs = if entries.is_empty() { Value::Null } else { self.logprobs(entries, offset) };
        let choice = match self.kind {
            Kind::Chat => {
                let mut delta = serde_json::Map::new();
                if role {
                    delta.insert("role".into(), json!("assistant"));
                }
                if let Some(p) = piece {
                    delta.insert("content".into(), json!(p));
                }
                json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish.map(finish_str)})
            }
            Kind::Text => json!({"index": 0, "text": piece.unwrap_or(""), "logprobs": logprobs, "finish_reason": finish.map(finish_str)}),
        };
        json!({
            "id": self.id,
            "object": if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }
}

/// OpenAI's usage object, with the cached prompt tokens.
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

/// OpenAI's spelling of a finish reason (a cancelled job reports `stop`).
pub fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}
