//! `ApiError`: every failure a client can see, rendered as OpenAI's error
//! body `{"error":{"message","type","param","code"}}` (or Anthropic's
//! `{"type":"error","error":{"type","message"}}` for `/v1/messages`).
//!
//! Invariant: handlers never panic on client input; every rejection is one
//! of these with a 4xx status, and overload carries `Retry-After`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error response.
#[derive(Clone, Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type` (`invalid_request_error`, `not_found_error`, ...).
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds, sent as `Retry-After`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code: None, retry_after: None }
    }

    /// 400: the request is malformed or asks for something impossible.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the offending field.
    pub fn bad_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_string()), ..ApiError::bad_request(message) }
    }

    /// 413: the body is over `limit` bytes.
    pub fn too_large(limit: usize) -> ApiError {
        ApiError {
            code: Some("request_too_large"),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the request body is over this server's limit of {limit} bytes"),
            )
        }
    }

    /// 404.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found_error", message)
    }

    /// 404 for an unknown model, OpenAI's `model_not_found`.
    pub fn unknown_model(message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
        }
    }

    /// 401.
    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError { code: Some("invalid_api_key"), ..ApiError::new(StatusCode::UNAUTHORIZED, "authentication_error", message) }
    }

    /// 409.
    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, "invalid_request_error", message)
    }

    /// 429: too many requests queued; retry later.
    pub fn overloaded(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(1),
            code: Some("rate_limit_exceeded"),
            ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
        }
    }

    /// 503: the KV budget cannot hold the request now.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(5),
            code: Some("kv_budget_exhausted"),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded_error", message)
        }
    }

    /// 500.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// OpenAI's body.
    pub fn openai_body(&self) -> serde_json::Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }

    /// Anthropic's body (its `type` names differ slightly from OpenAI's).
    pub fn anthropic_body(&self) -> serde_json::Value {
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            503 | 529 => "overloaded_error",
            s if s >= 500 => "api_error",
            _ => "invalid_request_error",
        };
        json!({"type": "error", "error": {"type": kind, "message": self.message}})
    }

    fn respond(&self, body: serde_json::Value) -> Response {
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.respond(self.openai_body())
    }
}

/// An [`ApiError`] rendered in Anthropic's shape.
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        self.0.respond(self.0.anthropic_body())
    }
}

impl From<engram_engine::EngineError> for ApiError {
    fn from(e: engram_engine::EngineError) -> Self {
        match e {
            engram_engine::EngineError::BadRequest(m) => {
                // SamplingParams::validate says "field: why".
                match m.split_once(": ") {
                    Some((field, _)) if !field.contains(' ') => ApiError::bad_param(field, m.clone()),
                    _ => ApiError::bad_request(m),
                }
            }
            engram_engine::EngineError::Kv(k) => ApiError::unavailable(k.to_string()),
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl From<engram_tokenizer::TokenizerError> for ApiError {
    fn from(e: engram_tokenizer::TokenizerError) -> Self {
        ApiError::bad_request(e.to_string())
    }
}
