//! What every request passes before a handler runs, in this order:
//! [`authenticate`] (the API key, from the headers alone), then [`read_body`] (the
//! whole body within the body deadline and the size limit).
//!
//! Invariant: a request without a valid key (when keys are set) is answered 401
//! before a byte of its body is read — a 2 MiB body from a stranger is never
//! buffered, parsed or tokenized; a body that is too slow is a 408 and one that is
//! too large a 413, both in the API's error shape (Anthropic's under `/v1/messages`,
//! Ollama's under `/api/`).

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::{AnthropicError, ApiError};
use crate::{api, AppState, MAX_BODY_BYTES};

/// Routes anyone may call: liveness for load balancers and supervisors.
const OPEN_ROUTES: &[&str] = &["/health"];

fn render(e: ApiError, path: &str) -> Response {
    if path.starts_with("/v1/messages") {
        AnthropicError(e).into_response()
    } else if path.starts_with("/api/") {
        crate::ollama::OllamaError(e).into_response()
    } else {
        e.into_response()
    }
}

/// 401 unless the request carries a valid key (or no keys are configured, or the route is open).
pub(crate) async fn authenticate(State(s): State<AppState>, req: Request, next: Next) -> Response {
    if s.config.api_keys.is_empty() || OPEN_ROUTES.contains(&req.uri().path()) {
        return next.run(req).await;
    }
    match api::tenant(&s, req.headers()) {
        Ok(_) => next.run(req).await,
        Err(e) => render(e, req.uri().path()),
    }
}

/// Reads the whole body (at most [`MAX_BODY_BYTES`]) within `limits.body_timeout`, then
/// hands the request on with the bytes in memory.
pub(crate) async fn read_body(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let declared = req.headers().get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return render(ApiError::too_large(MAX_BODY_BYTES), &path);
    }
    let (parts, body) = req.into_parts();
    let deadline = s.config.limits.body_timeout;
    let bytes = match tokio::time::timeout(deadline, axum::body::to_bytes(body, MAX_BODY_BYTES)).await {
        Err(_) => {
            let e = ApiError {
                status: StatusCode::REQUEST_TIMEOUT,
                code: Some("request_timeout"),
                ..ApiError::bad_request(format!("the request body did not arrive within {} s", deadline.as_secs_f32()))
            };
            return render(e, &path);
        }
        // Over the limit without a Content-Length (chunked), or the client went away.
        Ok(Err(e)) => {
            let too_large = std::error::Error::source(&e).is_some_and(|s| s.to_string().contains("length limit"))
                || e.to_string().contains("length limit");
            let e = if too_large {
                ApiError::too_large(MAX_BODY_BYTES)
            } else {
                ApiError::bad_request(format!("could not read the request body: {e}"))
            };
            return render(e, &path);
        }
        Ok(Ok(b)) => b,
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}
