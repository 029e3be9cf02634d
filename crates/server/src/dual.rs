//! `engram serve --context dual`: a chat request mapped onto the dual-stream policy
//! (`engram_dual::DualStream`, the dual-stream design).
//!
//! ```text
//!  messages: [system…] [earlier turns…] [user: new message]
//!             │                           │
//!             anchors of `user` ──────┐   the new turn, rendered alone (after the closing of
//!             (set before the job)    │   the previous answer when there was one)
//!                                     ▼
//!  job: owner = <tenant>␟user:<user>, session = thread, prompt = the new turn's tokens
//! ```
//! The thread's earlier turns are the server's, not re-read from the request: a client may
//! send the whole conversation (as OpenAI clients do) or only the new message. Every chat
//! route maps the same way (`chat_job.rs`): the `user` field (Anthropic's
//! `metadata.user_id`; an agent is its own user) picks the persistent stream, `thread_id`
//! (or `X-Engram-Thread`) the ring. Raw-text routes are refused ([`refuse_raw_prompt`]).
//!
//! Invariant: a turn's text is exactly what the chat template renders for it after the
//! system messages (and after the previous answer's closing), so the ring holds what a full
//! render of the kept turns would.

use axum::http::HeaderMap;
use engram_tokenizer::ChatMessage;

use crate::api;
use crate::error::ApiError;
use crate::AppState;

/// One request's place in the dual-stream contexts.
pub(crate) struct DualTurn {
    pub owner: String,
    pub thread: String,
    /// The system messages rendered and tokenized: the user's anchors.
    pub anchors: Vec<u32>,
    /// The new turn's tokens.
    pub turn: Vec<u32>,
}

/// Whose persistent stream a request's turn joins, and its thread when the request names none.
pub(crate) struct DualOwner {
    /// The owner key: a tenant's user, or an agent (the agent is its own user).
    pub key: String,
    /// The thread when neither `thread_id` nor `X-Engram-Thread` names one.
    pub default_thread: &'static str,
}

impl DualOwner {
    /// `tenant`'s user `user` (`"default"` when the request names none), thread `default`.
    pub(crate) fn user(tenant: &str, user: Option<&str>) -> Result<DualOwner, ApiError> {
        let user = user.unwrap_or("default");
        api::check_id("user", user)?;
        Ok(DualOwner { key: owner(tenant, user), default_thread: "default" })
    }

    /// `tenant`'s agent `id` as the user of its own stream, thread `main` (its one session in
    /// the sessions mode).
    pub(crate) fn agent(tenant: &str, id: &str) -> DualOwner {
        DualOwner { key: engram_engine::OwnerKey::agent(tenant, id).to_string(), default_thread: "main" }
    }
}

/// Maps a chat request onto its owner's anchors and its thread's new turn (rendering and
/// tokenizing off the async workers).
pub(crate) async fn turn(
    s: &AppState,
    owner: DualOwner,
    headers: &HeaderMap,
    thread: Option<&str>,
    messages: Vec<ChatMessage>,
) -> Result<DualTurn, ApiError> {
    let header =
        headers.get("x-engram-thread").map(|v| v.to_str().map_err(|_| ApiError::bad_param("thread_id", "X-Engram-Thread is not text")));
    let thread = match (thread, header) {
        (Some(t), _) => t.to_string(),
        (None, Some(h)) => h?.to_string(),
        (None, None) => owner.default_thread.to_string(),
    };
    api::check_id("thread_id", &thread)?;
    if !matches!(messages.last(), Some(m) if m.role == "user") {
        return Err(ApiError::bad_param("messages", "with --context dual the last message must be the user's new turn"));
    }
    let state = s.clone();
    api::off_runtime(move || render_turn(&state, owner.key, thread, &messages)).await
}

/// A 400 for a request whose prompt is raw text (`/v1/completions`, Ollama's raw
/// `/api/generate`) under dual-stream contexts: raw text has no turns to keep apart, and
/// taking it whole as one turn would store every earlier turn in the ring again.
pub(crate) fn refuse_raw_prompt(s: &AppState, field: &str, route: &str) -> Result<(), ApiError> {
    match s.config.context {
        crate::ContextMode::Dual { .. } => Err(ApiError::bad_param(
            field,
            format!(
                "{route} takes raw text, which has no turns; with --context dual send the conversation as messages \
                 (/v1/chat/completions, /v1/messages, /api/chat) so each turn is kept once"
            ),
        )),
        crate::ContextMode::Sessions => Ok(()),
    }
}

/// The owner key of `tenant`'s user `user`: whose persistent stream, facts and threads.
pub(crate) fn owner(tenant: &str, user: &str) -> String {
    engram_engine::OwnerKey::user(tenant, user).to_string()
}

/// The anchors and the new turn of `messages` (whose last message is the user's).
fn render_turn(s: &AppState, owner: String, thread: String, messages: &[ChatMessage]) -> Result<DualTurn, ApiError> {
    let tok = &s.model.tokenizer;
    let tpl = tok.chat_template().ok_or_else(|| ApiError::bad_request("the served model has no chat template; use /v1/completions"))?;
    let t = engram_dual::turn_tokens(tok, tpl, messages)?;
    Ok(DualTurn { owner, thread, anchors: t.anchors, turn: t.turn })
}

/// The tokens of a thread's state entry: `text` rendered as a system message on its own (as
/// a fact is); over half the ring's capacity it is a 400 naming both (a state that size would
/// leave the thread little room for its turns).
pub(crate) fn state_tokens(s: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    let tokens = crate::facts::render_segment(&s.model, text)?;
    let ring = match s.config.context {
        crate::ContextMode::Dual { ring_tokens, .. } => ring_tokens,
        crate::ContextMode::Sessions => usize::MAX,
    };
    if tokens.len() > ring / 2 {
        return Err(ApiError::bad_param(
            "state",
            &format!("the state entry is {} tokens; at most {} (half the ring's {ring})", tokens.len(), ring / 2),
        ));
    }
    Ok(tokens)
}
