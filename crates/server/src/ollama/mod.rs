//! Ollama's API on the same server: `/api/chat` and `/api/generate` (`generate.rs`:
//! newline-delimited JSON streamed by default, one object with `"stream": false`),
//! `/api/tags`, `/api/show`, `/api/ps`, `/api/version` (`models.rs`), `/api/embed` and
//! the legacy `/api/embeddings` (`embed.rs`), with Ollama's field names, durations in
//! nanoseconds and `created_at` in RFC 3339. Errors are Ollama's `{"error": "..."}`, the
//! message naming the field at fault; any other `/api/` route (model management) is a 404
//! in that shape.
//!
//! Generation goes through the same path as OpenAI's chat route (`chat_job.rs`,
//! `api::start`): the same tenants and keys, limits, sessions (`X-Session-Id` or
//! `session_id`), prefix caching and dual-stream contexts, and the same statuses (a full
//! KV budget is a 503 with `Retry-After`). A model is named by its id, an alias, or
//! either with Ollama's default tag `:latest`.
//!
//! `options` map onto the sampler (`temperature`, `top_p`, `top_k`, `min_p`, `seed`,
//! `num_predict`, `stop`, `repeat_penalty`, `presence_penalty`, `frequency_penalty`);
//! other options are ignored, as Ollama ignores those it does not know. `format` (`"json"`
//! or a JSON schema) constrains the answer as OpenAI's `response_format` does
//! (`structured.rs`). `/api/chat` takes `tools` and `think` (`generate.rs`, `tools/`).
//! Refused with a 400 naming the field rather than ignored: `tools` on `/api/generate`,
//! `images`, `suffix`, `template`, `context`, `logprobs`. `keep_alive` is accepted; the
//! served model never unloads.

mod embed;
mod generate;
mod models;

pub use embed::{embed, embeddings};
pub use generate::{chat, generate};
pub use models::{not_found, ps, show, tags, version};

use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};

use crate::api::{self, Sampling, StopField};
use crate::error::ApiError;

/// Ollama's default sampling (its Modelfile defaults), used where `options` is silent.
const DEFAULT_TEMPERATURE: f32 = 0.8;
const DEFAULT_TOP_K: i64 = 40;
const DEFAULT_TOP_P: f32 = 0.9;

/// An [`ApiError`] in Ollama's shape: `{"error": message}` with the same status (and
/// `Retry-After`); the message starts with the field at fault unless it names it already.
pub struct OllamaError(pub ApiError);

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

impl OllamaError {
    /// The `{"error": ...}` body.
    pub fn body(&self) -> Value {
        json!({"error": message(&self.0)})
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let mut r = (self.0.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.0.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// The error's message, led by its field when the message does not name it.
fn message(e: &ApiError) -> String {
    match &e.param {
        Some(p) if !e.message.contains(p.as_str()) => format!("{p}: {}", e.message),
        _ => e.message.clone(),
    }
}

/// Parses a JSON body; a field of the wrong type is a 400 naming its path
/// (`messages[0].content`, `stream`).
pub(crate) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty; expected a JSON object"));
    }
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let missing = inner.to_string().split('`').nth(1).filter(|_| inner.to_string().starts_with("missing field")).map(str::to_string);
        let param = missing.or((path != ".").then_some(path));
        let msg = match &param {
            Some(p) => format!("invalid JSON body: {p}: {inner}"),
            None => format!("invalid JSON body: {inner}"),
        };
        ApiError { param, ..ApiError::bad_request(msg) }
    })
}

/// A model name without Ollama's default tag (`tiny:latest` names `tiny`).
pub(crate) fn untagged(name: &str) -> &str {
    name.strip_suffix(":latest").unwrap_or(name)
}

/// A 400 for an Ollama field that asks for something this server does not do; `null`,
/// `false`, `""`, `[]` and `{}` ask for nothing.
pub(crate) fn refuse(name: &str, value: &Option<Value>, why: &str) -> Result<(), ApiError> {
    let asks = match value {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
    };
    if asks {
        return Err(ApiError::bad_param(name, format!("`{name}`: {why}; remove the field")));
    }
    Ok(())
}

/// Now, as Ollama writes `created_at`.
pub(crate) fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// `options` → the sampler's fields. Unknown options are ignored; a known one of the
/// wrong type is a 400 naming `options.<name>`.
pub(crate) fn sampling(options: Option<&Map<String, Value>>) -> Result<Sampling, ApiError> {
    let empty = Map::new();
    let o = options.unwrap_or(&empty);
    let num_predict = int(o, "num_predict")?;
    let stop = match o.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value::<StopField>(v.clone())
            .map_err(|_| ApiError::bad_param("options.stop", format!("options.stop must be a list of strings, got {}", api::json_kind(v))))?
            .into_vec(),
    };
    Ok(Sampling {
        // -1 (and Ollama's -2, "fill the context") generate until the context's end.
        max_tokens: num_predict.filter(|&n| n > 0),
        temperature: Some(float(o, "temperature")?.unwrap_or(DEFAULT_TEMPERATURE)),
        top_p: Some(float(o, "top_p")?.unwrap_or(DEFAULT_TOP_P)),
        top_k: Some(int(o, "top_k")?.unwrap_or(DEFAULT_TOP_K)),
        min_p: float(o, "min_p")?,
        frequency_penalty: float(o, "frequency_penalty")?,
        presence_penalty: float(o, "presence_penalty")?,
        repetition_penalty: float(o, "repeat_penalty")?,
        // Negative: Ollama's "random"; the server's default seed stands in.
        seed: int(o, "seed")?.filter(|&s| s >= 0),
        stop,
        fit_to_context: true,
        ..Default::default()
    })
}

/// Renames the sampler's field names in a validation error to Ollama's (`max_tokens` is
/// `options.num_predict`, `messages` is `prompt` on `/api/generate`).
pub(crate) fn in_ollama_terms(mut e: ApiError, prompt_field: &str) -> ApiError {
    let renamed = match e.param.as_deref() {
        Some("max_tokens") => Some("options.num_predict".to_string()),
        Some("repetition_penalty") => Some("options.repeat_penalty".to_string()),
        Some("messages") => Some(prompt_field.to_string()),
        Some(p @ ("temperature" | "top_p" | "top_k" | "min_p" | "seed" | "stop" | "frequency_penalty" | "presence_penalty")) => {
            Some(format!("options.{p}"))
        }
        _ => None,
    };
    if let Some(p) = renamed {
        e.message = e.message.replace("max_tokens", "num_predict").replace("repetition_penalty", "repeat_penalty");
        e.param = Some(p);
    }
    e
}

fn float(o: &Map<String, Value>, key: &str) -> Result<Option<f32>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64().map(|x| x as f32)),
        Some(v) => {
            Err(ApiError::bad_param(&format!("options.{key}"), format!("options.{key} must be a number, got {}", api::json_kind(v))))
        }
    }
}

fn int(o: &Map<String, Value>, key: &str) -> Result<Option<i64>, ApiError> {
    let bad =
        |v: &Value| ApiError::bad_param(&format!("options.{key}"), format!("options.{key} must be an integer, got {}", api::json_kind(v)));
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Ok(Some(i)),
            // JSON has one number type; 40.0 is 40.
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
            _ => Err(bad(v)),
        },
        Some(v) => Err(bad(v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(v: Value) -> Result<Sampling, ApiError> {
        sampling(v.as_object())
    }

    #[test]
    fn options_map_onto_the_sampler_and_unknown_ones_are_ignored() {
        let s = opts(json!({"temperature": 0, "top_k": 5.0, "num_predict": 7, "seed": 3, "repeat_penalty": 1.2,
                            "stop": ["\n"], "mirostat": 1, "num_ctx": 4096, "no_such_option": "x"}))
        .unwrap();
        assert_eq!((s.temperature, s.top_k, s.max_tokens, s.seed), (Some(0.0), Some(5), Some(7), Some(3)));
        assert_eq!(s.repetition_penalty, Some(1.2));
        assert_eq!(s.stop, vec!["\n".to_string()]);
        let d = opts(json!({"num_predict": -1, "seed": -1})).unwrap();
        assert_eq!((d.max_tokens, d.seed, d.temperature, d.top_k, d.top_p), (None, None, Some(0.8), Some(40), Some(0.9)));
    }

    #[test]
    fn an_option_of_the_wrong_type_is_named() {
        for (body, field) in [
            (json!({"temperature": "hot"}), "options.temperature"),
            (json!({"num_predict": 1.5}), "options.num_predict"),
            (json!({"top_k": true}), "options.top_k"),
            (json!({"stop": 3}), "options.stop"),
        ] {
            let e = opts(body).expect_err("refused");
            assert_eq!(e.param.as_deref(), Some(field));
            assert!(message(&e).contains(field), "{}", message(&e));
        }
    }

    #[test]
    fn the_samplers_names_become_ollamas() {
        let e = in_ollama_terms(ApiError::bad_param("max_tokens", "max_tokens must be at least 1"), "prompt");
        assert_eq!(e.param.as_deref(), Some("options.num_predict"));
        assert!(e.message.contains("num_predict"));
        let e = in_ollama_terms(ApiError::bad_param("messages", "the prompt is 9000 tokens"), "prompt");
        assert_eq!(e.param.as_deref(), Some("prompt"));
    }
}
