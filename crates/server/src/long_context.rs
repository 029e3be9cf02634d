//! The request field `long_context_after` (an Engram extension of OpenAI's chat and text
//! completions): this conversation's own threshold for going sparse, in tokens of history and
//! prompt, in place of the server's `--long-context-after`.
//!
//! Invariant: a request naming it is refused (400 naming the field, nothing started) unless it
//! is a whole number of tokens of at least 1 and the server serves long conversations sparse.

use serde_json::Value;

use crate::error::ApiError;
use crate::AppState;

/// The request's threshold from its `long_context_after` field (`None`: absent or null, the
/// server's default), checked.
pub(crate) fn request_threshold(s: &AppState, v: Option<&Value>) -> Result<Option<usize>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    let Some(n) = v.as_u64().filter(|&n| n >= 1) else {
        return Err(ApiError::bad_param(
            "long_context_after",
            format!("long_context_after must be a whole number of tokens of at least 1, got {v}"),
        ));
    };
    if s.config.long_context.is_none() {
        return Err(ApiError::bad_param(
            "long_context_after",
            "long_context_after needs a server that serves long conversations sparse (engram serve --long-context-after TOKENS)",
        ));
    }
    Ok(Some(usize::try_from(n).unwrap_or(usize::MAX)))
}
