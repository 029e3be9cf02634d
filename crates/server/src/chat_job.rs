//! A chat request → the engine [`Job`] that answers it, shared by every chat route
//! (OpenAI's `/v1/chat/completions`, Anthropic's `/v1/messages`, Ollama's `/api/chat` and
//! templated `/api/generate`, an agent's `/v1/agents/{id}/generate`), so each gets the same
//! context handling: with `--context dual`, the user's persistent stream and the
//! thread's ring (`dual.rs`); otherwise the whole conversation rendered with the chat
//! template under the request's session (`session_id` / `X-Session-Id`, or the
//! character-level match of the default policy).
//!
//! Invariant: a request refused here has changed nothing: every check runs before the
//! dual-stream anchors or state are sent to the engine.

use axum::http::HeaderMap;
use engram_tokenizer::ChatMessage;

use crate::api::{self, Sampling};
use crate::engine_handle::Job;
use crate::error::ApiError;
use crate::AppState;

/// Where a chat request's context lives (the Engram extensions every chat route accepts).
#[derive(Default)]
pub(crate) struct ChatContext<'a> {
    /// The session to reuse (else the `X-Session-Id` header).
    pub session_id: Option<&'a str>,
    /// With `--context dual`: whose persistent stream.
    pub user: Option<&'a str>,
    /// With `--context dual`: which thread's ring (else `X-Engram-Thread`).
    pub thread_id: Option<&'a str>,
    /// With `--context dual`: the thread's state entry; `""` removes it.
    pub state: Option<&'a str>,
    /// Extra chat-template variables (`chat_template_kwargs`: Qwen3's `enable_thinking`).
    pub template_kwargs: Option<&'a serde_json::Map<String, serde_json::Value>>,
    /// The agent the request runs as: its own owner key and its one session `main`, pinned on
    /// disk (with `--context dual`: the agent is the user, `main` its default thread).
    pub agent: Option<&'a str>,
    /// This conversation's own threshold for going sparse (`long_context_after`, checked).
    pub long_context_after: Option<usize>,
}

/// The job for `messages` (already validated) with `sampling`, for `tenant`.
pub(crate) async fn job(
    s: &AppState,
    tenant: String,
    headers: &HeaderMap,
    messages: Vec<ChatMessage>,
    sampling: Sampling,
    context: ChatContext<'_>,
) -> Result<Job, ApiError> {
    if let crate::ContextMode::Dual { .. } = s.config.context {
        if context.template_kwargs.is_some_and(|k| !k.is_empty()) {
            return Err(ApiError::bad_param(
                "chat_template_kwargs",
                "chat_template_kwargs: dual-stream contexts render each turn alone, without extra template variables (chat_template_kwargs, or tools the chat template renders itself); use the default sessions mode",
            ));
        }
        let owner = match context.agent {
            Some(id) => crate::dual::DualOwner::agent(&tenant, id),
            None => crate::dual::DualOwner::user(&tenant, context.user)?,
        };
        let d = crate::dual::turn(s, owner, headers, context.thread_id, messages).await?;
        let params = api::params(s, d.turn.len(), sampling)?;
        // Checked before anything is sent: a bad state changes nothing.
        let state = match context.state {
            Some("") => Some(Vec::new()),
            Some(text) => Some(crate::dual::state_tokens(s, text)?),
            None => None,
        };
        // One message: the anchors, then the facts, then the state entry computed on them.
        match &s.facts {
            Some(_) => {
                // With a remote tier the user's facts and the thread's state entry are taken
                // from there first when newer (one round trip, off the async workers).
                let (st, owner, thread, anchors) = (s.clone(), d.owner.clone(), d.thread.clone(), d.anchors);
                let text = context.state.map(str::to_string);
                api::off_runtime(move || {
                    let f = st.facts.as_ref().expect("dual-stream contexts keep facts");
                    let given = text.as_deref().zip(state);
                    let state = f.sync_turn(&st, &tenant, &owner, &thread, given)?.map(|tokens| (thread.clone(), tokens));
                    f.send_turn(&st, &owner, anchors, state)
                })
                .await?
            }
            None => s.engine.control(engram_engine::PolicyControl::new(engram_dual::DualControl::Turn {
                user: d.owner.as_str().into(),
                anchors: d.anchors,
                facts: None,
                state: state.map(|tokens| (d.thread.clone(), tokens)),
            })),
        }
        return Ok(Job {
            owner: d.owner.into(),
            session: Some(d.thread),
            text: None,
            add_special: false,
            prompt: d.turn,
            params,
            pinned: context.agent.is_some(),
            long_context_after: context.long_context_after,
        });
    }
    if context.state.is_some() {
        return Err(ApiError::bad_param("state", "a thread's state entry needs dual-stream contexts (engram serve --context dual)"));
    }
    let (owner, session) = match context.agent {
        Some(id) => (engram_engine::OwnerKey::agent(&tenant, id), Some("main".to_string())),
        None => (tenant.into(), api::session(headers, context.session_id)?),
    };
    let (text, prompt) = api::render_chat_with(s, messages, context.template_kwargs.cloned().unwrap_or_default()).await?;
    let mut params = api::params(s, prompt.len(), sampling)?;
    params.show_special_tokens = crate::tools::job::shows_special_tokens(s, params.grammar.is_some());
    Ok(Job {
        owner,
        session,
        text: Some(text),
        add_special: false,
        prompt,
        params,
        pinned: context.agent.is_some(),
        long_context_after: context.long_context_after,
    })
}
