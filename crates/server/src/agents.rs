//! Agents: named owners with their own isolated cache.
//!
//! Each agent's requests run in its own owner key ([`OwnerKey::agent`]) on one named
//! session (with `--context dual`: the agent is the user of its own persistent stream,
//! its ring thread `main` unless `thread_id` names another), so nothing else can match its cache, and the
//! scheduler runs its requests one at a time in arrival order (a named
//! session is busy while a request uses it). Agents are kept by
//! [`crate::agent_registry`] (on disk when sessions are). Deleting an agent
//! drops its cached session, in RAM and on disk, and fails its queued requests; with a remote
//! tier, another replica that holds the agent does the same when it is next used or listed.
//!
//! A generate takes OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` beside its
//! `messages` (`tools/`), and answers the calls in `message.tool_calls`: a tool loop sends the
//! history back with each result and extends the agent's session (its `cached_tokens` grow).
//!
//! Invariant: a generate's job reaches the engine before the delete's forget of its
//! agent, or not at all (a 404): both happen under the registry's lock
//! ([`crate::agent_registry::Agents::while_current`], `remove_then`), so no job of a
//! deleted agent runs after its forget and saves a session nothing would remove.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use engram_engine::OwnerKey;
use engram_tokenizer::ChatMessage;
use serde::Deserialize;
use serde_json::json;

use crate::agent_registry::Agent;
use crate::api;
use crate::chat_job::ChatContext;
use crate::error::ApiError;
use crate::openai::{to_chat, InMessage, SamplingFields};
use crate::AppState;

/// The owner key of `tenant`'s agent `id`: its sessions, pinned on disk, are the agent's memory.
fn cache_key(tenant: &str, id: &str) -> OwnerKey {
    OwnerKey::agent(tenant, id)
}

#[derive(Deserialize)]
struct CreateRequest {
    id: Option<String>,
    name: Option<String>,
    #[serde(alias = "instructions", alias = "system_prompt")]
    system: Option<String>,
}

/// `POST /v1/agents`.
pub(crate) async fn create(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    let req: CreateRequest = if body.is_empty() { CreateRequest { id: None, name: None, system: None } } else { api::parse(&body)? };
    if let Some(id) = &req.id {
        api::check_id("id", id)?;
    }
    let st = s.clone();
    let agent = api::off_runtime(move || st.agents.create(&tenant, req.id, req.name, req.system)).await?;
    Ok((StatusCode::CREATED, axum::Json(agent)).into_response())
}

/// `GET /v1/agents`.
pub(crate) async fn list(State(s): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    let st = s.clone();
    let data: Vec<Agent> = api::off_runtime(move || Ok(st.agents.list(&tenant))).await?;
    Ok(axum::Json(json!({"object": "list", "data": data})).into_response())
}

/// `tenant`'s agent `id` (with a remote tier, checked there: a round trip, off the async
/// workers), or a 404.
async fn find(s: &AppState, tenant: &str, id: &str) -> Result<Agent, ApiError> {
    api::check_id("id", id)?;
    let (st, tenant, id) = (s.clone(), tenant.to_string(), id.to_string());
    api::off_runtime(move || st.agents.get(&tenant, &id).ok_or_else(|| ApiError::not_found(format!("no agent {id:?}")))).await
}

/// `GET /v1/agents/{id}`.
pub(crate) async fn get(State(s): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    Ok(axum::Json(find(&s, &tenant, &id).await?).into_response())
}

/// `DELETE /v1/agents/{id}`.
pub(crate) async fn delete(State(s): State<AppState>, headers: HeaderMap, Path(id): Path<String>) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    api::check_id("id", &id)?;
    s.agents.remove_then(&tenant, &id, || s.engine.forget(cache_key(&tenant, &id)))?;
    Ok(axum::Json(json!({"id": id, "object": "agent.deleted", "deleted": true})).into_response())
}

#[derive(Deserialize)]
struct GenerateRequest {
    messages: Option<Vec<InMessage>>,
    /// With `--context dual`: the agent's thread (default `main`).
    thread_id: Option<String>,
    prompt: Option<String>,
    max_tokens: Option<i64>,
    tools: Option<serde_json::Value>,
    tool_choice: Option<serde_json::Value>,
    parallel_tool_calls: Option<serde_json::Value>,
    #[serde(flatten)]
    sampling: SamplingFields,
}

/// `POST /v1/agents/{id}/generate`: `messages` (or `prompt`, one user
/// message) after the agent's system prompt, on the agent's own session.
pub(crate) async fn generate(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    let agent = find(&s, &tenant, &id).await?;
    let req: GenerateRequest = api::parse(&body)?;
    let mut chat: Vec<ChatMessage> = agent.system.iter().map(|t| ChatMessage::new("system", t.clone())).collect();
    match (req.messages, req.prompt) {
        (Some(m), None) => chat.extend(to_chat(m)?),
        (None, Some(p)) => chat.push(ChatMessage::new("user", p)),
        _ => return Err(ApiError::bad_request("give exactly one of `messages` and `prompt`")),
    }
    let tools = crate::tools::request::openai(req.tools, req.tool_choice, req.parallel_tool_calls)?;
    let prepared = crate::tools::job::prepare(&s, tools, chat, None).await?;
    let mut sampling = req.sampling.with_max_tokens(req.max_tokens);
    sampling.grammar = prepared.grammar.clone();
    let context = ChatContext {
        agent: Some(&id),
        thread_id: req.thread_id.as_deref(),
        template_kwargs: Some(&prepared.kwargs).filter(|k| !k.is_empty()),
        ..Default::default()
    };
    let job = crate::chat_job::job(&s, tenant.clone(), &headers, prepared.messages.clone(), sampling, context).await?;
    let split = prepared.splitter(&s, job.text.as_deref());
    // Submitted only if the agent found above is still registered, under the lock a
    // delete holds while it removes the agent and forgets its cache (see the module doc).
    let submitted = s.agents.while_current(&tenant, &agent, || s.engine.submit(job));
    let Some(rx) = submitted else {
        // Deleted meanwhile: with --context dual the job's anchors already reached the
        // policy, after the delete's forget; forget them again so nothing of it stays.
        s.engine.forget(cache_key(&tenant, &id));
        return Err(ApiError::not_found(format!("no agent {id:?}")));
    };
    let rx = rx?;
    let (st, mut rx) = api::started(rx).await?;
    let done = api::collect(&mut rx).await?;
    let reply = split.split(&done.text);
    Ok(axum::Json(json!({
        "agent_id": id,
        "object": "agent.generation",
        "text": reply.content,
        "message": crate::tools::openai_out::message(&reply),
        "finish_reason": crate::tools::openai_out::finish(done.finish, &reply),
        "usage": {"prompt_tokens": st.prompt_tokens, "completion_tokens": done.completion_tokens,
                  "total_tokens": st.prompt_tokens + done.completion_tokens,
                  "prompt_tokens_details": {"cached_tokens": st.cached_tokens}},
    }))
    .into_response())
}
