//! `POST /api/embed` (`input`: a string or a list of strings → `embeddings`) and the
//! legacy `POST /api/embeddings` (`prompt` → `embedding`), served by the same text
//! encoder as `/v1/embeddings` (`embeddings.rs`) and named by the same ids.
//!
//! Inputs past the encoder's limit are truncated (Ollama's `truncate: true`, the
//! default); with `truncate: false`, an input that reaches the limit is a 400 naming it.
//! `options` and `keep_alive` are accepted and change nothing.

use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{untagged, OllamaError};
use crate::embeddings::{check_model, encode, not_configured, texts};
use crate::error::ApiError;
use crate::{api, AppState};

#[derive(Deserialize)]
struct EmbedRequest {
    model: Option<String>,
    input: Option<Value>,
    truncate: Option<bool>,
    dimensions: Option<i64>,
}

#[derive(Deserialize)]
struct EmbeddingsRequest {
    model: Option<String>,
    #[serde(default)]
    prompt: String,
}

/// `POST /api/embed`.
pub async fn embed(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, OllamaError> {
    let t0 = Instant::now();
    api::tenant(&s, &headers)?;
    let Some(enc) = s.config.embedder.clone() else { return Err(not_configured().into()) };
    let req: EmbedRequest = super::parse(&body)?;
    check_model(enc.as_ref(), req.model.as_deref().map(untagged))?;
    if let Some(d) = req.dimensions {
        if d != enc.dim() as i64 {
            return Err(ApiError::bad_param(
                "dimensions",
                format!("this encoder makes {}-dimensional vectors only, got dimensions={d}", enc.dim()),
            )
            .into());
        }
    }
    let texts = texts(req.input)?;
    let out = encode(&enc, texts).await?;
    if req.truncate == Some(false) {
        if let Some(limit) = enc.max_tokens() {
            if let Some(i) = out.num_tokens.iter().position(|&n| n >= limit) {
                return Err(ApiError::bad_param(
                    "input",
                    format!("input[{i}] reaches the encoder's limit of {limit} tokens and truncate is false"),
                )
                .into());
            }
        }
    }
    let tokens: usize = out.num_tokens.iter().sum();
    let body = json!({
        "model": enc.id(), "embeddings": out.vectors,
        "total_duration": t0.elapsed().as_nanos() as u64, "load_duration": 0, "prompt_eval_count": tokens,
    });
    Ok(axum::Json(body).into_response())
}

/// `POST /api/embeddings` (superseded by `/api/embed`; an empty prompt embeds to `[]`).
pub async fn embeddings(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, OllamaError> {
    api::tenant(&s, &headers)?;
    let Some(enc) = s.config.embedder.clone() else { return Err(not_configured().into()) };
    let req: EmbeddingsRequest = super::parse(&body)?;
    check_model(enc.as_ref(), req.model.as_deref().map(untagged))?;
    if req.prompt.is_empty() {
        return Ok(axum::Json(json!({"embedding": []})).into_response());
    }
    let out = encode(&enc, vec![req.prompt]).await?;
    let vector = out.vectors.into_iter().next().unwrap_or_default();
    Ok(axum::Json(json!({"embedding": vector})).into_response())
}
