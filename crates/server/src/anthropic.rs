//! Anthropic Messages API: `POST /v1/messages`, non-streamed and streamed
//! (`message_start`, `content_block_start`, `content_block_delta`,
//! `content_block_stop`, `message_delta`, `message_stop`), and
//! `POST /v1/messages/count_tokens`. Errors use Anthropic's body shape. A request becomes
//! its job through the chat routes' shared path (`chat_job.rs`): sessions, prefix caching
//! and, with `--context dual`, the persistent stream of `metadata.user_id` and the ring of
//! `thread_id` (or `X-Engram-Thread`). Tool use (`tools`, `tool_choice`, `tool_use` /
//! `tool_result` blocks, streamed `input_json_delta`) and `thinking` blocks go through
//! `tools/` (`tools/anthropic_io.rs`).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use engram_engine::FinishReason;
use engram_tokenizer::ChatMessage;
use serde::Deserialize;
use serde_json::json;

use crate::api::{self, Sampling, Unsupported};
use crate::chat_job::ChatContext;
use crate::engine_handle::Event;
use crate::error::{AnthropicError, ApiError};
use crate::openai::Content;
use crate::{sse, AppState};

#[derive(Deserialize)]
struct InMessage {
    role: String,
    /// A string or content blocks (`tools::anthropic_io::message`).
    content: serde_json::Value,
}

#[derive(Deserialize)]
struct MessagesRequest {
    model: Option<String>,
    max_tokens: i64,
    messages: Vec<InMessage>,
    system: Option<Content>,
    stream: Option<bool>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    stop_sequences: Option<Vec<String>>,
    session_id: Option<String>,
    /// `metadata.user_id`: with `--context dual`, whose persistent stream.
    metadata: Option<Metadata>,
    /// With `--context dual`: which thread's ring (else `X-Engram-Thread`).
    thread_id: Option<String>,
    tools: Option<serde_json::Value>,
    tool_choice: Option<serde_json::Value>,
    #[serde(flatten)]
    unsupported: Unsupported,
}

#[derive(Deserialize)]
struct Metadata {
    user_id: Option<String>,
}

fn stop_reason(f: FinishReason, stopped_by_sequence: bool) -> &'static str {
    match f {
        FinishReason::Length => "max_tokens",
        FinishReason::Stop if stopped_by_sequence => "stop_sequence",
        FinishReason::Stop | FinishReason::Cancelled => "end_turn",
    }
}

/// The conversation of a `/v1/messages` (or `count_tokens`) request: `system` first, then the
/// turns, each `user` or `assistant`.
fn conversation(messages: Vec<InMessage>, system: Option<Content>) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_param("messages", "messages must contain at least one message"));
    }
    let mut chat = Vec::new();
    if let Some(sys) = system {
        chat.push(ChatMessage::new("system", sys.text("system")?));
    }
    for (i, m) in messages.into_iter().enumerate() {
        if m.role != "user" && m.role != "assistant" {
            return Err(ApiError::bad_param(
                &format!("messages[{i}].role"),
                format!("unsupported role {:?} (expected user or assistant)", m.role),
            ));
        }
        chat.extend(crate::tools::anthropic_io::message(i, &m.role, &m.content)?);
    }
    Ok(chat)
}

#[derive(Deserialize)]
struct CountTokensRequest {
    model: Option<String>,
    messages: Vec<InMessage>,
    system: Option<Content>,
    tools: Option<serde_json::Value>,
    tool_choice: Option<serde_json::Value>,
    #[serde(flatten)]
    unsupported: Unsupported,
}

/// `POST /v1/messages/count_tokens`: `{"input_tokens": N}`, the tokens of the prompt
/// `/v1/messages` would render for the same `system` and `messages` (validated the same way;
/// nothing is generated, stored or cached).
pub async fn count_tokens(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, AnthropicError> {
    api::tenant(&s, &headers)?;
    let req: CountTokensRequest = api::parse(&body)?;
    api::check_model(&s, req.model.as_deref())?;
    req.unsupported.check()?;
    let tools = crate::tools::request::anthropic(req.tools, req.tool_choice)?;
    let prepared = crate::tools::job::prepare(&s, tools, conversation(req.messages, req.system)?, None).await?;
    let (_, prompt) = api::render_chat_with(&s, prepared.messages, prepared.kwargs).await?;
    Ok(axum::Json(json!({"input_tokens": prompt.len()})).into_response())
}

/// `POST /v1/messages`.
pub async fn messages(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, AnthropicError> {
    let tenant = api::tenant(&s, &headers)?;
    let req: MessagesRequest = api::parse(&body)?;
    api::check_model(&s, req.model.as_deref())?;
    req.unsupported.check()?;
    let tools = crate::tools::request::anthropic(req.tools, req.tool_choice)?;
    let prepared = crate::tools::job::prepare(&s, tools, conversation(req.messages, req.system)?, None).await?;
    let temperature = req.temperature;
    if temperature.is_some_and(|t| t > 1.0) {
        return Err(ApiError::bad_param("temperature", "temperature must be in [0, 1]").into());
    }
    let sampling = Sampling {
        max_tokens: Some(req.max_tokens),
        temperature: Some(temperature.unwrap_or(1.0)),
        top_p: req.top_p,
        top_k: req.top_k,
        stop: req.stop_sequences.unwrap_or_default(),
        grammar: prepared.grammar.clone(),
        ..Default::default()
    };
    let context = ChatContext {
        session_id: req.session_id.as_deref(),
        user: req.metadata.as_ref().and_then(|m| m.user_id.as_deref()),
        thread_id: req.thread_id.as_deref(),
        template_kwargs: Some(&prepared.kwargs).filter(|k| !k.is_empty()),
        ..Default::default()
    };
    let job = crate::chat_job::job(&s, tenant, &headers, prepared.messages.clone(), sampling, context).await?;
    let mut split = prepared.splitter(&s, job.text.as_deref());
    let (st, mut rx) = api::start(&s, job).await?;
    let id = api::new_id("msg");
    let model = s.config.model_id.clone();
    if !req.stream.unwrap_or(false) {
        let done = api::collect(&mut rx).await?;
        let reply = split.split(&done.text);
        let reason = if reply.ended_on_calls(done.finish) { "tool_use" } else { stop_reason(done.finish, done.stop_string) };
        let body = json!({
            "id": id, "type": "message", "role": "assistant", "model": model,
            "content": crate::tools::anthropic_io::blocks(&reply),
            "stop_reason": reason,
            "stop_sequence": null,
            "usage": {"input_tokens": st.prompt_tokens - st.cached_tokens, "output_tokens": done.completion_tokens,
                      "cache_read_input_tokens": st.cached_tokens, "cache_creation_input_tokens": 0},
        });
        let mut r = axum::Json(body).into_response();
        if let Ok(v) = st.session_id.parse() {
            r.headers_mut().insert("x-session-id", v);
        }
        return Ok(r);
    }
    let ev = |name: &str, v: serde_json::Value| SseEvent::default().event(name).data(v.to_string());
    let first = vec![ev(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": st.prompt_tokens - st.cached_tokens, "output_tokens": 0,
                      "cache_read_input_tokens": st.cached_tokens, "cache_creation_input_tokens": 0}}}),
    )];
    let mut blocks = crate::tools::anthropic_io::BlockStream::default();
    let format: sse::Formatter = Box::new(move |e| match e {
        Some(Event::Text(t)) => (blocks.events(split.push(&t)).into_iter().map(|(name, v)| ev(name, v)).collect(), false),
        Some(Event::Finished { finish, completion_tokens, stop_string }) => {
            let mut events = blocks.events(split.finish());
            events.extend(blocks.end());
            let reason = if blocks.ended_on_calls(finish) { "tool_use" } else { stop_reason(finish, stop_string) };
            let mut out: Vec<SseEvent> = events.into_iter().map(|(name, v)| ev(name, v)).collect();
            out.push(ev(
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null},
                       "usage": {"output_tokens": completion_tokens}}),
            ));
            out.push(ev("message_stop", json!({"type": "message_stop"})));
            (out, true)
        }
        Some(Event::Failed(e)) => (vec![ev("error", e.anthropic_body())], true),
        Some(Event::Started { .. } | Event::Logprob(_)) => (vec![], false),
        None => (vec![ev("error", ApiError::internal("the engine stopped").anthropic_body())], true),
    });
    let (head, rx) = api::first_output(rx).await?;
    Ok(sse::respond(first, head, rx, format, vec![("x-session-id", st.session_id.clone())]))
}
