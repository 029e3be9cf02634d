//! Structured output: OpenAI's `response_format` (`text`, `json_object`, `json_schema`), the
//! `grammar` (llguidance's Lark) and `regex` extension fields, and Ollama's `format`
//! (`"json"` or a JSON schema) compiled into the grammar the engine decodes under (`engram_engine::grammar`). The vocabulary's token trie is built once, on
//! the first request that asks for structure, and kept for the server's life.
//!
//! Invariant: a format that does not compile is a 400 naming the field, with llguidance's
//! message, before anything is queued.

use std::sync::Arc;

use engram_engine::{Grammar, GrammarCompiler};
use serde_json::Value;

use crate::api;
use crate::error::ApiError;
use crate::AppState;

/// The served model's grammar compiler (built on first use, off the async workers).
pub(crate) async fn compiler(s: &AppState) -> Result<Arc<GrammarCompiler>, ApiError> {
    if let Some(c) = s.grammars.get() {
        return c.clone().map_err(ApiError::internal);
    }
    let state = s.clone();
    api::off_runtime(move || {
        let c = state.grammars.get_or_init(|| {
            GrammarCompiler::new(&state.model.tokenizer, state.model.config.vocab).map(Arc::new).map_err(|e| e.to_string())
        });
        c.clone().map_err(ApiError::internal)
    })
    .await
}

/// What a request asks its answer to follow.
enum Format {
    Object,
    Schema(Value),
    Lark(String),
    Regex(String),
}

/// Compiles `format` for `field`, off the async workers (a large schema takes a while).
async fn compile(s: &AppState, field: &'static str, format: Format) -> Result<Arc<Grammar>, ApiError> {
    let c = compiler(s).await?;
    api::off_runtime(move || {
        let (g, what) = match format {
            Format::Object => (c.json_object(), "schema"),
            Format::Schema(schema) => (c.json_schema(schema), "schema"),
            Format::Lark(src) => (c.lark(&src), "grammar"),
            Format::Regex(rx) => (c.regex(&rx), "regular expression"),
        };
        g.map_err(|e| ApiError::bad_param(field, format!("{field}: the {what} does not compile: {e}")))
    })
    .await
}

/// OpenAI's `response_format`: `None`, `null` or `{"type":"text"}` ask for nothing;
/// `{"type":"json_object"}` any JSON object; `{"type":"json_schema","json_schema":{"name",
/// "schema","strict"}}` JSON valid against `schema` (always enforced, `strict` or not).
pub async fn response_format(s: &AppState, v: Option<Value>) -> Result<Option<Arc<Grammar>>, ApiError> {
    const F: &str = "response_format";
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    let Some(o) = v.as_object() else {
        return Err(ApiError::bad_param(F, "response_format must be an object with a `type`"));
    };
    let format = match o.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => Format::Object,
        Some("json_schema") => {
            let js = o.get("json_schema").and_then(Value::as_object).ok_or_else(|| {
                ApiError::bad_param(
                    "response_format.json_schema",
                    "response_format.json_schema: an object with `name` and `schema` is required",
                )
            })?;
            if js.get("strict").is_some_and(|v| !v.is_boolean() && !v.is_null()) {
                return Err(ApiError::bad_param(
                    "response_format.json_schema.strict",
                    "response_format.json_schema.strict must be a boolean",
                ));
            }
            match js.get("schema") {
                Some(schema) if schema.is_object() => Format::Schema(schema.clone()),
                // OpenAI's default: a schema-less json_schema format is any JSON object.
                None | Some(Value::Null) => Format::Object,
                Some(_) => {
                    return Err(ApiError::bad_param(
                        "response_format.json_schema.schema",
                        "response_format.json_schema.schema must be an object",
                    ))
                }
            }
        }
        Some(other) => {
            return Err(ApiError::bad_param(
                "response_format.type",
                format!("response_format.type must be \"text\", \"json_object\" or \"json_schema\", got {other:?}"),
            ))
        }
        None => return Err(ApiError::bad_param("response_format.type", "response_format.type is required")),
    };
    compile(s, F, format).await.map(Some)
}

/// Ollama's `format`: absent, `null` or `""` ask for nothing; `"json"` any JSON value Ollama
/// calls JSON mode (here: a JSON object, as Ollama's own grammar); an object is a JSON schema.
pub async fn ollama_format(s: &AppState, v: Option<&Value>) -> Result<Option<Arc<Grammar>>, ApiError> {
    let format = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(t)) if t.is_empty() => return Ok(None),
        Some(Value::String(t)) if t == "json" => Format::Object,
        Some(Value::Object(_)) => Format::Schema(v.cloned().unwrap_or_default()),
        Some(other) => return Err(ApiError::bad_param("format", format!("format must be \"json\" or a JSON schema object, got {other}"))),
    };
    compile(s, "format", format).await.map(Some)
}

/// The largest `grammar` or `regex` a request may send, in bytes.
pub const MAX_GRAMMAR_SOURCE_BYTES: usize = 64 << 10;

/// The request's grammar: `response_format`, or the extension fields `grammar` (a Lark
/// grammar, as llguidance takes it) or `regex` (the whole answer matches it). At most one
/// of the three; two are a 400 naming the second.
pub async fn request_grammar(
    s: &AppState,
    format: Option<Value>,
    grammar: Option<Value>,
    regex: Option<Value>,
) -> Result<Option<Arc<Grammar>>, ApiError> {
    let text = |field: &'static str, v: Option<Value>| -> Result<Option<String>, ApiError> {
        match v {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(t)) if t.len() > MAX_GRAMMAR_SOURCE_BYTES => {
                Err(ApiError::bad_param(field, format!("{field} is {} bytes; at most {MAX_GRAMMAR_SOURCE_BYTES}", t.len())))
            }
            Some(Value::String(t)) => Ok(Some(t)),
            Some(_) => Err(ApiError::bad_param(field, format!("{field} must be a string"))),
        }
    };
    let (grammar, regex) = (text("grammar", grammar)?, text("regex", regex)?);
    let format = format.filter(|v| !v.is_null() && v.get("type").and_then(Value::as_str) != Some("text"));
    let asked = [format.is_some(), grammar.is_some(), regex.is_some()];
    if asked.iter().filter(|&&a| a).count() > 1 {
        let second = if format.is_some() && grammar.is_some() { "grammar" } else { "regex" };
        return Err(ApiError::bad_param(second, format!("{second}: give one of response_format, grammar and regex")));
    }
    if let Some(src) = grammar {
        return compile(s, "grammar", Format::Lark(src)).await.map(Some);
    }
    if let Some(rx) = regex {
        return compile(s, "regex", Format::Regex(rx)).await.map(Some);
    }
    response_format(s, format).await
}
