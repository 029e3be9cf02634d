//! OpenAI's `logprobs`: the request fields (chat: `logprobs: true` with `top_logprobs` 0..=20;
//! completions: `logprobs` 0..=20) and the response shapes built from the engine's
//! [`TokenLogprob`] events — chat's `{"content": [{token, logprob, bytes, top_logprobs}]}` and
//! the legacy completions' `{tokens, token_logprobs, top_logprobs, text_offset}`.
//!
//! One entry per generated token, a stop token included (as `completion_tokens` counts it);
//! the values are the model's raw distribution (`engram_engine::logprobs`). Streamed, a
//! chunk carries the entries of the tokens whose text it is or precedes: text held back
//! (a possible stop string, a character split across tokens) is reported with the token.

use engram_engine::logprobs::MAX_TOP_LOGPROBS;
use engram_engine::TokenLogprob;
use engram_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

use crate::error::ApiError;

/// Chat's fields → alternatives per token (`None`: not asked). `top_logprobs` needs `logprobs: true`.
pub fn chat_request(logprobs: Option<&Value>, top: Option<&Value>) -> Result<Option<usize>, ApiError> {
    let on = match logprobs {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(v) => return Err(ApiError::bad_param("logprobs", format!("logprobs must be true or false, got {v}"))),
    };
    let top = match top {
        None | Some(Value::Null) => None,
        Some(v) => Some(count("top_logprobs", v)?),
    };
    match (on, top) {
        (false, Some(n)) if n > 0 => Err(ApiError::bad_param("top_logprobs", "top_logprobs needs \"logprobs\": true")),
        (false, _) => Ok(None),
        (true, n) => Ok(Some(n.unwrap_or(0))),
    }
}

/// Completions' `logprobs` (an integer: alternatives per token) → alternatives (`None`: not asked).
pub fn completion_request(logprobs: Option<&Value>) -> Result<Option<usize>, ApiError> {
    match logprobs {
        None | Some(Value::Null) => Ok(None),
        Some(v) => count("logprobs", v).map(Some),
    }
}

fn count(field: &str, v: &Value) -> Result<usize, ApiError> {
    match v.as_u64() {
        Some(n) if n as usize <= MAX_TOP_LOGPROBS => Ok(n as usize),
        _ => Err(ApiError::bad_param(field, format!("{field} must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {v}"))),
    }
}

/// A token's text as OpenAI shows it (lossy where it holds part of a character) and its bytes.
fn token_json(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let bytes = tok.token_bytes(id);
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// Chat's `logprobs` object for `entries`.
pub fn chat_object(tok: &Tokenizer, entries: &[TokenLogprob]) -> Value {
    let one = |id: u32, lp: f32| {
        let (token, bytes) = token_json(tok, id);
        json!({"token": token, "logprob": lp, "bytes": bytes})
    };
    let content: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut v = one(e.token, e.logprob);
            v["top_logprobs"] = e.top.iter().map(|&(t, lp)| one(t, lp)).collect();
            v
        })
        .collect();
    json!({"content": content})
}

/// The legacy completions' `logprobs` object for `entries`, whose text starts at byte
/// `*offset` of the completion; `*offset` is moved past their bytes (the next chunk's start).
pub fn completion_object(tok: &Tokenizer, entries: &[TokenLogprob], offset: &mut usize) -> Value {
    let (mut tokens, mut lps, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for e in entries {
        let (token, bytes) = token_json(tok, e.token);
        offsets.push(*offset);
        *offset += bytes.len();
        tokens.push(token);
        lps.push(e.logprob);
        let top: Map<String, Value> = e.top.iter().map(|&(t, lp)| (token_json(tok, t).0, json!(lp))).collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}
