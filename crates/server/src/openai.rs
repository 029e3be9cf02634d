//! OpenAI-compatible endpoints: `/v1/chat/completions`, `/v1/completions`,
//! `/v1/models` (every served model, the text encoder included: `catalog.rs`).
//! Extensions: `session_id` (or `X-Session-Id`) names a session; `top_k`,
//! `min_p`, `repetition_penalty`, `ignore_eos` as in vLLM;
//! responses carry the session in `X-Session-Id`; `logprobs` / `top_logprobs`
//! as OpenAI's (`logprobs.rs`); `grammar` (Lark) and `regex` beside `response_format`
//! (`structured.rs`). Tool calls (`tools`, `tool_choice`,
//! `parallel_tool_calls`, assistant `tool_calls` and `tool` messages in the history) and
//! reasoning (`reasoning_content`) go through `tools/`. Not implemented, and rejected with a
//! 400 naming the field: the legacy `functions` / `function_call` (send `tools`), `logit_bias`.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::sse::Event as SseEvent;
use axum::response::{IntoResponse, Response};
use engram_engine::FinishReason;
use engram_tokenizer::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::api::{self, Sampling, Started, StopField, Unsupported};
use crate::chat_job::ChatContext;
use crate::engine_handle::{Event, Job};
use crate::error::ApiError;
use crate::{sse, AppState};

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
pub(crate) struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

impl Content {
    /// The text of a message; only text parts are supported.
    pub(crate) fn text(self, param: &str) -> Result<String, ApiError> {
        match self {
            Content::Text(t) => Ok(t),
            Content::Parts(parts) => {
                let mut out = String::new();
                for p in parts {
                    match (p.kind.as_str(), p.text) {
                        ("text", Some(t)) => out.push_str(&t),
                        (kind, _) => {
                            return Err(ApiError::bad_param(param, format!("content part of type {kind:?} is not supported (only text)")))
                        }
                    }
                }
                Ok(out)
            }
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct InMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
    /// An assistant message's calls (checked by `tools::request::check_history`).
    #[serde(default)]
    tool_calls: Option<Value>,
    /// A tool message: the call it answers.
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
    /// An assistant message's reasoning, given back: the template decides whether it is shown.
    #[serde(default)]
    reasoning_content: Option<String>,
}

/// Converts OpenAI messages to chat-template messages.
pub(crate) fn to_chat(messages: Vec<InMessage>) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_param("messages", "messages must contain at least one message"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(ApiError::bad_param(
                    &format!("messages[{i}].role"),
                    format!("unsupported role {other:?} (expected system, developer, user, assistant or tool)"),
                ))
            }
        };
        let content = match m.content {
            Some(c) => c.text(&format!("messages[{i}].content"))?,
            None => String::new(),
        };
        let mut msg = ChatMessage::new(role, content);
        if let Some(calls) = m.tool_calls.filter(|c| !c.is_null() && role == "assistant") {
            msg = msg.with("tool_calls", calls);
        }
        if role == "tool" {
            if let Some(id) = m.tool_call_id {
                msg = msg.with("tool_call_id", Value::from(id));
            }
        }
        if let Some(name) = m.name.filter(|_| role == "tool") {
            msg = msg.with("name", Value::from(name));
        }
        if let Some(r) = m.reasoning_content.filter(|_| role == "assistant") {
            msg = msg.with("reasoning_content", Value::from(r));
        }
        out.push(msg);
    }
    Ok(out)
}

/// The sampling fields every generation endpoint but Anthropic's accepts
/// (OpenAI's names plus the common extensions `top_k`, `min_p`,
/// `repetition_penalty`, `ignore_eos`), flattened into each request.
#[derive(Deserialize)]
pub(crate) struct SamplingFields {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    frequency_penalty: Option<f32>,
    presence_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    seed: Option<i64>,
    stop: Option<StopField>,
    ignore_eos: Option<bool>,
    /// Speculative decoding for this request: "prompt-lookup" or "none" (default: the server's `--draft`).
    draft: Option<String>,
}

impl SamplingFields {
    /// The request's sampling with its `max_tokens` (validated by `api::params`).
    pub(crate) fn with_max_tokens(self, max_tokens: Option<i64>) -> Sampling {
        Sampling {
            max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            repetition_penalty: self.repetition_penalty,
            seed: self.seed,
            stop: self.stop.map(StopField::into_vec).unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            draft: self.draft,
            logprobs: None,
            fit_to_context: false,
            grammar: None,
        }
    }
}

#[derive(Deserialize)]
struct ChatRequest {
    model: Option<String>,
    messages: Vec<InMessage>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    max_completion_tokens: Option<i64>,
    #[serde(flatten)]
    sampling: SamplingFields,
    #[serde(flatten)]
    unsupported: Unsupported,
    /// Structured output (`structured.rs`), and its extension fields `grammar` (Lark) and `regex`.
    response_format: Option<Value>,
    grammar: Option<Value>,
    regex: Option<Value>,
    /// Tool calling (`tools/`).
    tools: Option<Value>,
    tool_choice: Option<Value>,
    parallel_tool_calls: Option<Value>,
    n: Option<i64>,
    session_id: Option<String>,
    /// With `--context dual`: whose persistent stream, and which thread's ring.
    user: Option<String>,
    thread_id: Option<String>,
    /// With `--context dual`: the thread's state entry (the hybrid mode: often-changing state
    /// pinned first in the thread's ring, replaced in place), rendered as a system message;
    /// `""` removes it; absent leaves it as it is.
    state: Option<String>,
    /// Extra variables for the chat template (vLLM's field; Qwen3's `enable_thinking`).
    chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    /// This conversation's own threshold for going sparse (`long_context.rs`).
    long_context_after: Option<Value>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
}

#[derive(Deserialize)]
struct CompletionRequest {
    model: Option<String>,
    prompt: PromptField,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    max_tokens: Option<i64>,
    #[serde(flatten)]
    sampling: SamplingFields,
    #[serde(flatten)]
    unsupported: Unsupported,
    /// Structured output (`structured.rs`), and its extension fields `grammar` (Lark) and `regex`.
    response_format: Option<Value>,
    grammar: Option<Value>,
    regex: Option<Value>,
    n: Option<i64>,
    session_id: Option<String>,
    /// This conversation's own threshold for going sparse (`long_context.rs`).
    long_context_after: Option<Value>,
}

fn check_n(n: Option<i64>) -> Result<(), ApiError> {
    match n {
        None | Some(1) => Ok(()),
        Some(n) => Err(ApiError::bad_param("n", format!("only n=1 is supported, got {n}"))),
    }
}

/// OpenAI's spelling of a finish reason.
pub(crate) fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

fn usage(st: &Started, completion_tokens: usize) -> Value {
    json!({
        "prompt_tokens": st.prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": st.prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": st.cached_tokens},
    })
}

fn with_session(mut r: Response, session_id: &str) -> Response {
    if let Ok(v) = session_id.parse() {
        r.headers_mut().insert("x-session-id", v);
    }
    r
}

/// `GET /v1/models`: every served model (`catalog.rs`) with its `kind` (`llm` or `embedding`)
/// and `context_length` (and, as vLLM names it, `max_model_len`); an embedding model also
/// carries its `dimensions`.
pub async fn models(State(s): State<AppState>) -> Response {
    let data: Vec<Value> = crate::catalog::served(&s)
        .into_iter()
        .map(|m| {
            let mut o = json!({"id": m.id, "object": "model", "created": 0, "owned_by": "engram", "kind": m.kind.as_str(),
                               "context_length": m.context_length, "max_model_len": m.context_length});
            if let Some(d) = m.dimensions {
                o["dimensions"] = json!(d);
            }
            o
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// `POST /v1/chat/completions`.
pub async fn chat(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    let mut req: ChatRequest = api::parse(&body)?;
    api::check_model(&s, req.model.as_deref())?;
    let (lp, top) = req.unsupported.take_logprobs();
    let logprobs = crate::logprobs::chat_request(lp.as_ref(), top.as_ref())?;
    req.unsupported.check()?;
    check_n(req.n)?;
    let long_context_after = crate::long_context::request_threshold(&s, req.long_context_after.as_ref())?;
    let tools = crate::tools::request::openai(req.tools.take(), req.tool_choice.take(), req.parallel_tool_calls.take())?;
    let prepared = crate::tools::job::prepare(&s, tools, to_chat(req.messages)?, req.chat_template_kwargs.as_ref()).await?;
    let mut sampling = req.sampling.with_max_tokens(req.max_completion_tokens.or(req.max_tokens));
    sampling.logprobs = logprobs;
    sampling.grammar = crate::structured::request_grammar(&s, req.response_format.take(), req.grammar.take(), req.regex.take()).await?;
    prepared.bind_grammar(
        &mut sampling,
        "response_format",
        "response_format, grammar and regex are not for answers that may call tools (tool_choice \"none\" allows them)",
    )?;
    let context = ChatContext {
        session_id: req.session_id.as_deref(),
        user: req.user.as_deref(),
        thread_id: req.thread_id.as_deref(),
        state: req.state.as_deref(),
        template_kwargs: Some(&prepared.kwargs).filter(|k| !k.is_empty()),
        long_context_after,
        ..Default::default()
    };
    let job = crate::chat_job::job(&s, tenant, &headers, prepared.messages.clone(), sampling, context).await?;
    let mut split = prepared.splitter(&s, job.text.as_deref());
    let (st, mut rx) = api::start(&s, job).await?;
    let id = api::new_id("chatcmpl");
    let created = api::now_s();
    let model = s.config.model_id.clone();
    if !req.stream.unwrap_or(false) {
        let done = api::collect(&mut rx).await?;
        let reply = split.split(&done.text);
        let body = json!({
            "id": id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": crate::tools::openai_out::message(&reply),
                         "logprobs": logprobs.map(|_| crate::logprobs::chat_object(&s.model.tokenizer, &done.logprobs)),
                         "finish_reason": crate::tools::openai_out::finish(done.finish, &reply)}],
            "usage": usage(&st, done.completion_tokens),
            "session_id": st.session_id,
        });
        return Ok(with_session(axum::Json(body).into_response(), &st.session_id));
    }
    let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
    let chunk = {
        let (id, model, tok_model) = (id.clone(), model.clone(), s.model.clone());
        // Log-probabilities of tokens not yet reported, given to the next chunk.
        let mut pending: Vec<engram_engine::TokenLogprob> = Vec::new();
        move |delta: Value, finish: Option<&str>, lp: Option<engram_engine::TokenLogprob>| {
            if let Some(l) = lp {
                pending.push(l);
                return None;
            }
            let logprobs = match logprobs {
                Some(_) => crate::logprobs::chat_object(&tok_model.tokenizer, &std::mem::take(&mut pending)),
                None => Value::Null,
            };
            Some(json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                   "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}))
        }
    };
    let mut chunk = chunk;
    let first =
        vec![SseEvent::default().data(chunk(json!({"role": "assistant", "content": ""}), None, None).expect("a chunk").to_string())];
    let session_id = st.session_id.clone();
    // Tool calls streamed so far (their indices), to name the final chunk's finish reason.
    let mut calls = crate::tools::openai_out::StreamedCalls::default();
    let format: sse::Formatter = Box::new(move |ev| match ev {
        Some(Event::Logprob(l)) => {
            chunk(Value::Null, None, Some(l));
            (vec![], false)
        }
        Some(Event::Text(t)) => {
            let deltas = calls.deltas(split.push(&t));
            (deltas.into_iter().map(|d| SseEvent::default().data(chunk(d, None, None).expect("a chunk").to_string())).collect(), false)
        }
        Some(Event::Finished { finish, completion_tokens, .. }) => {
            let deltas = calls.deltas(split.finish());
            let mut out: Vec<SseEvent> =
                deltas.into_iter().map(|d| SseEvent::default().data(chunk(d, None, None).expect("a chunk").to_string())).collect();
            let reason = calls.finish(finish);
            out.push(SseEvent::default().data(chunk(json!({}), Some(reason), None).expect("a chunk").to_string()));
            if include_usage {
                let u = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                               "choices": [], "usage": usage(&st, completion_tokens)});
                out.push(SseEvent::default().data(u.to_string()));
            }
            out.push(SseEvent::default().data("[DONE]"));
            (out, true)
        }
        Some(Event::Failed(e)) => (vec![SseEvent::default().data(e.openai_body().to_string())], true),
        Some(Event::Started { .. }) => (vec![], false),
        None => (vec![SseEvent::default().data(ApiError::internal("the engine stopped").openai_body().to_string())], true),
    });
    let (head, rx) = api::first_output(rx).await?;
    Ok(sse::respond(first, head, rx, format, vec![("x-session-id", session_id)]))
}

/// `POST /v1/completions`.
pub async fn completions(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, ApiError> {
    let tenant = api::tenant(&s, &headers)?;
    let mut req: CompletionRequest = api::parse(&body)?;
    api::check_model(&s, req.model.as_deref())?;
    let (lp, top) = req.unsupported.take_logprobs();
    if top.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad_param("top_logprobs", "/v1/completions takes the number of alternatives in \"logprobs\""));
    }
    let logprobs = crate::logprobs::completion_request(lp.as_ref())?;
    req.unsupported.check()?;
    check_n(req.n)?;
    let long_context_after = crate::long_context::request_threshold(&s, req.long_context_after.as_ref())?;
    crate::dual::refuse_raw_prompt(&s, "prompt", "/v1/completions")?;
    let session = api::session(&headers, req.session_id.as_deref())?;
    let encode = |t: String| {
        let model = s.model.clone();
        api::off_runtime(move || {
            let ids = model.tokenizer.encode(&t, true)?.ids;
            Ok((Some(t), ids))
        })
    };
    let (text, prompt) = match req.prompt {
        PromptField::Text(t) => encode(t).await?,
        PromptField::Texts(v) if v.len() == 1 => encode(v.into_iter().next().unwrap_or_default()).await?,
        PromptField::Texts(v) => return Err(ApiError::bad_param("prompt", format!("exactly one prompt is supported, got {}", v.len()))),
        PromptField::Ids(ids) => {
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= s.model.config.vocab) {
                return Err(ApiError::bad_param("prompt", format!("token id {bad} is outside the vocabulary of {}", s.model.config.vocab)));
            }
            (None, ids)
        }
    };
    let mut sampling = req.sampling.with_max_tokens(Some(req.max_tokens.unwrap_or(16)));
    sampling.logprobs = logprobs;
    sampling.grammar = crate::structured::request_grammar(&s, req.response_format.take(), req.grammar.take(), req.regex.take()).await?;
    let params = api::params(&s, prompt.len(), sampling)?;
    let (st, mut rx) =
        api::start(&s, Job { owner: tenant.into(), session, text, add_special: true, prompt, params, pinned: false, long_context_after })
            .await?;
    let id = api::new_id("cmpl");
    let created = api::now_s();
    let model = s.config.model_id.clone();
    if !req.stream.unwrap_or(false) {
        let done = api::collect(&mut rx).await?;
        let body = json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": done.text,
                         "logprobs": logprobs.map(|_| crate::logprobs::completion_object(&s.model.tokenizer, &done.logprobs, &mut 0)),
                         "finish_reason": finish_str(done.finish)}],
            "usage": usage(&st, done.completion_tokens),
            "session_id": st.session_id,
        });
        return Ok(with_session(axum::Json(body).into_response(), &st.session_id));
    }
    let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
    let session_id = st.session_id.clone();
    let tok_model = s.model.clone();
    // Log-probabilities not yet reported, and the byte offset of their text.
    let (mut pending, mut offset): (Vec<engram_engine::TokenLogprob>, usize) = (Vec::new(), 0);
    let mut chunk = move |text: &str, finish: Option<&str>, lp: Option<engram_engine::TokenLogprob>| {
        if let Some(l) = lp {
            pending.push(l);
            return None;
        }
        let logprobs = match logprobs {
            Some(_) => crate::logprobs::completion_object(&tok_model.tokenizer, &std::mem::take(&mut pending), &mut offset),
            None => Value::Null,
        };
        Some(json!({"id": id, "object": "text_completion", "created": created, "model": model,
               "choices": [{"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}]}))
    };
    let format: sse::Formatter = Box::new(move |ev| match ev {
        Some(Event::Logprob(l)) => {
            chunk("", None, Some(l));
            (vec![], false)
        }
        Some(Event::Text(t)) => (vec![SseEvent::default().data(chunk(&t, None, None).expect("a chunk").to_string())], false),
        Some(Event::Finished { finish, completion_tokens, .. }) => {
            let mut last = chunk("", Some(finish_str(finish)), None).expect("a chunk");
            if include_usage {
                last["usage"] = usage(&st, completion_tokens);
            }
            (vec![SseEvent::default().data(last.to_string()), SseEvent::default().data("[DONE]")], true)
        }
        Some(Event::Failed(e)) => (vec![SseEvent::default().data(e.openai_body().to_string())], true),
        Some(Event::Started { .. }) => (vec![], false),
        None => (vec![SseEvent::default().data(ApiError::internal("the engine stopped").openai_body().to_string())], true),
    });
    let (head, rx) = api::first_output(rx).await?;
    Ok(sse::respond(Vec::new(), head, rx, format, vec![("x-session-id", session_id)]))
}
