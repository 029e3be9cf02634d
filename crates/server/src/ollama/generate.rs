//! `POST /api/chat` and `POST /api/generate`: a conversation (or a prompt, rendered as
//! one user turn after the optional `system`, unless `raw`) answered through the same job
//! path as OpenAI's chat route (`chat_job.rs`). Streamed as newline-delimited JSON by
//! default: one object per piece of text (`"done": false`), then a last one with
//! `"done": true`, `done_reason` and the counts and durations; `"stream": false` answers
//! the whole text in that last object.
//!
//! On `/api/chat`, `tools` (OpenAI's shape) let the model call them (`tools/`): the calls come
//! back in `message.tool_calls` with `function.arguments` an object; `tool` messages in the
//! history answer the calls before them in order. A template's `<think>` section comes back
//! in `message.thinking`; `think: false` asks the template to skip it (`enable_thinking`).
//!
//! Counts and durations, as Ollama reports them: `prompt_eval_count` is the prompt
//! tokens computed (a cached prefix is not: it shows as a smaller count), `eval_count`
//! the generated tokens; `load_duration` is the wait until the engine admitted the
//! request (the model is always loaded), `prompt_eval_duration` admission to the first
//! token, `eval_duration` the first token to the last, `total_duration` the whole
//! request; all in nanoseconds.

use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use engram_engine::FinishReason;
use engram_tokenizer::ChatMessage;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{in_ollama_terms, now_rfc3339, refuse, untagged, OllamaError};
use crate::api::{self, Started};
use crate::chat_job::ChatContext;
use crate::engine_handle::{Event, Job};
use crate::error::ApiError;
use crate::sse::EventStream;
use crate::AppState;

const NO_IMAGES: &str = "the served model reads text only";

#[derive(Deserialize)]
struct InMessage {
    role: String,
    #[serde(default)]
    content: Option<String>,
    images: Option<Value>,
    tool_calls: Option<Value>,
    /// A `tool` message: the tool that answered (Ollama's field).
    tool_name: Option<String>,
    /// An assistant message's reasoning, given back.
    thinking: Option<String>,
}

/// A request to either route (each reads its own fields; Ollama ignores the ones it does
/// not know). NOTE: no `#[serde(flatten)]`, which would hide a wrong type's field name.
#[derive(Deserialize)]
struct Request {
    model: Option<String>,
    stream: Option<bool>,
    options: Option<Map<String, Value>>,
    format: Option<Value>,
    think: Option<Value>,
    tools: Option<Value>,
    logprobs: Option<Value>,
    top_logprobs: Option<Value>,
    /// Accepted and ignored: the served model stays loaded.
    #[allow(dead_code)]
    keep_alive: Option<Value>,
    /// Engram's extension, as on OpenAI's routes (else `X-Session-Id`).
    session_id: Option<String>,
    /// `/api/chat`.
    #[serde(default)]
    messages: Vec<InMessage>,
    /// `/api/chat` with `--context dual`: whose persistent stream, which thread's ring, its
    /// state entry.
    user: Option<String>,
    thread_id: Option<String>,
    state: Option<String>,
    /// `/api/generate`.
    #[serde(default)]
    prompt: String,
    system: Option<String>,
    #[serde(default)]
    raw: bool,
    suffix: Option<Value>,
    template: Option<Value>,
    context: Option<Value>,
    images: Option<Value>,
}

/// Which route answers: its text goes in `message.content` or in `response`.
#[derive(Clone, Copy)]
enum Route {
    Chat,
    Generate,
}

impl Route {
    /// One answer object carrying `text`.
    fn object(self, model: &str, text: &str, done: bool) -> Value {
        let mut o = json!({"model": model, "created_at": now_rfc3339()});
        match self {
            Route::Chat => o["message"] = json!({"role": "assistant", "content": text}),
            Route::Generate => o["response"] = json!(text),
        }
        o["done"] = json!(done);
        o
    }
}

impl Request {
    /// Checks what every generation request must, before anything is rendered.
    fn check(&self, s: &AppState) -> Result<(), ApiError> {
        api::check_model(s, self.model.as_deref().map(untagged))?;
        if !matches!(&self.think, None | Some(Value::Null) | Some(Value::Bool(_)) | Some(Value::String(_))) {
            return Err(ApiError::bad_param("think", "think must be a boolean (or \"low\", \"medium\", \"high\")"));
        }
        refuse("logprobs", &self.logprobs, "log-probabilities are served on /v1/chat/completions and /v1/completions only")?;
        refuse("top_logprobs", &self.top_logprobs, "log-probabilities are served on /v1/chat/completions and /v1/completions only")
    }
}

/// `POST /api/chat`.
pub async fn chat(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, OllamaError> {
    let t0 = Instant::now();
    let tenant = api::tenant(&s, &headers)?;
    let req: Request = super::parse(&body)?;
    req.check(&s)?;
    let mut sampling = super::sampling(req.options.as_ref())?;
    sampling.grammar = crate::structured::ollama_format(&s, req.format.as_ref()).await?;
    if req.messages.is_empty() {
        return Ok(loaded(&s, Route::Chat));
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    // Calls made and not yet answered, oldest first: a `tool` message answers the first.
    let mut unanswered: std::collections::VecDeque<String> = Default::default();
    for (i, m) in req.messages.into_iter().enumerate() {
        refuse(&format!("messages[{i}].images"), &m.images, NO_IMAGES)?;
        let role = match m.role.as_str() {
            "system" | "user" | "assistant" | "tool" => m.role,
            other => {
                return Err(ApiError::bad_param(
                    &format!("messages[{i}].role"),
                    format!("unsupported role {other:?} (expected system, user, assistant or tool)"),
                )
                .into())
            }
        };
        let mut msg = ChatMessage::new(role.as_str(), m.content.unwrap_or_default());
        if let Some(calls) = m.tool_calls.filter(|c| !c.is_null() && role == "assistant") {
            let calls = crate::tools::request::ollama_calls(i, &calls)?;
            unanswered.extend(calls.iter().filter_map(|c| c["id"].as_str().map(str::to_string)));
            msg = msg.with("tool_calls", Value::Array(calls));
        }
        if let Some(t) = m.thinking.filter(|_| role == "assistant") {
            msg = msg.with("reasoning_content", Value::from(t));
        }
        if role == "tool" {
            let id = unanswered.pop_front().ok_or_else(|| {
                ApiError::bad_param(
                    &format!("messages[{i}]"),
                    format!("messages[{i}]: a tool message answers a call, and no call before it is unanswered"),
                )
            })?;
            msg = msg.with("tool_call_id", Value::from(id));
            if let Some(n) = m.tool_name {
                msg = msg.with("name", Value::from(n));
            }
        }
        messages.push(msg);
    }
    let tools = crate::tools::request::ollama(req.tools.clone())?;
    let mut kwargs = Map::new();
    if let Some(Value::Bool(think)) = req.think {
        kwargs.insert("enable_thinking".into(), Value::Bool(think));
    }
    let prepared = crate::tools::job::prepare(&s, tools, messages, Some(&kwargs)).await?;
    prepared.bind_grammar(&mut sampling, "format", "format: not with tools the model may call")?;
    let context = ChatContext {
        session_id: req.session_id.as_deref(),
        user: req.user.as_deref(),
        thread_id: req.thread_id.as_deref(),
        state: req.state.as_deref(),
        template_kwargs: Some(&prepared.kwargs).filter(|k| !k.is_empty()),
        ..Default::default()
    };
    let job = crate::chat_job::job(&s, tenant, &headers, prepared.messages.clone(), sampling, context)
        .await
        .map_err(|e| in_ollama_terms(e, "messages"))?;
    let split = prepared.splitter(&s, job.text.as_deref()).whole_calls();
    run(&s, job, Route::Chat, req.stream.unwrap_or(true), t0, Some(split)).await
}

/// `POST /api/generate`.
pub async fn generate(State(s): State<AppState>, headers: HeaderMap, body: Bytes) -> Result<Response, OllamaError> {
    let t0 = Instant::now();
    let tenant = api::tenant(&s, &headers)?;
    let req: Request = super::parse(&body)?;
    req.check(&s)?;
    refuse("images", &req.images, NO_IMAGES)?;
    refuse("tools", &req.tools, "tools are taken on /api/chat")?;
    refuse("suffix", &req.suffix, "fill-in-the-middle is not supported by this server")?;
    refuse("template", &req.template, "the model's own chat template is the only one this server renders")?;
    refuse("context", &req.context, "token contexts are not kept; send the conversation to /api/chat (sessions cache it)")?;
    let mut sampling = super::sampling(req.options.as_ref())?;
    sampling.grammar = crate::structured::ollama_format(&s, req.format.as_ref()).await?;
    if req.prompt.is_empty() {
        return Ok(loaded(&s, Route::Generate));
    }
    let job = if req.raw {
        crate::dual::refuse_raw_prompt(&s, "raw", "/api/generate with raw")?;
        // As the text is: no template, the tokenizer's own special tokens (as /v1/completions).
        let session = api::session(&headers, req.session_id.as_deref())?;
        let (model, text) = (s.model.clone(), req.prompt);
        let (text, prompt) = api::off_runtime(move || {
            let ids = model.tokenizer.encode(&text, true)?.ids;
            Ok((text, ids))
        })
        .await?;
        let params = api::params(&s, prompt.len(), sampling).map_err(|e| in_ollama_terms(e, "prompt"))?;
        Job { owner: tenant.into(), session, text: Some(text), add_special: true, prompt, params, pinned: false, long_context_after: None }
    } else {
        let mut messages = Vec::with_capacity(2);
        if let Some(system) = req.system.filter(|t| !t.is_empty()) {
            messages.push(ChatMessage::new("system", system));
        }
        messages.push(ChatMessage::new("user", req.prompt));
        let context = ChatContext { session_id: req.session_id.as_deref(), ..Default::default() };
        crate::chat_job::job(&s, tenant, &headers, messages, sampling, context).await.map_err(|e| in_ollama_terms(e, "prompt"))?
    };
    run(&s, job, Route::Generate, req.stream.unwrap_or(true), t0, None).await
}

/// Ollama's `message` for a (piece of a) split answer: `content`, and `thinking` and
/// `tool_calls` (`function.arguments` an object) when there are any.
fn chat_message(r: &crate::tools::Reply) -> Value {
    let mut m = json!({"role": "assistant", "content": r.content});
    if !r.reasoning.is_empty() {
        m["thinking"] = json!(r.reasoning);
    }
    if !r.calls.is_empty() {
        let calls: Vec<Value> = r
            .calls
            .iter()
            .map(|c| {
                let args: Value = serde_json::from_str(&c.arguments).unwrap_or_else(|_| json!({}));
                json!({"id": c.id, "function": {"name": c.name, "arguments": args}})
            })
            .collect();
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

/// Ollama's answer to a request without a prompt: the model is loaded (it always is).
fn loaded(s: &AppState, route: Route) -> Response {
    let mut o = route.object(&s.config.model_id, "", true);
    o["done_reason"] = json!("load");
    axum::Json(o).into_response()
}

/// When each phase of a request ended, for the durations Ollama reports.
#[derive(Clone, Copy)]
struct Timeline {
    received: Instant,
    admitted: Instant,
    first_output: Instant,
}

impl Timeline {
    /// The last object's counts and durations, ended now.
    fn stats(&self, st: &Started, completion_tokens: usize) -> Map<String, Value> {
        let ns = |from: Instant, to: Instant| to.saturating_duration_since(from).as_nanos() as u64;
        let end = Instant::now();
        let mut m = Map::new();
        m.insert("total_duration".into(), json!(ns(self.received, end)));
        m.insert("load_duration".into(), json!(ns(self.received, self.admitted)));
        m.insert("prompt_eval_count".into(), json!(st.prompt_tokens.saturating_sub(st.cached_tokens)));
        m.insert("prompt_eval_duration".into(), json!(ns(self.admitted, self.first_output)));
        m.insert("eval_count".into(), json!(completion_tokens));
        m.insert("eval_duration".into(), json!(ns(self.first_output, end)));
        m
    }
}

/// Ollama's spelling of a finish reason.
fn done_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        FinishReason::Stop | FinishReason::Cancelled => "stop",
    }
}

/// The last object: `done`, `done_reason`, counts and durations.
fn last(route: Route, model: &str, text: &str, finish: FinishReason, t: &Timeline, st: &Started, completion_tokens: usize) -> Value {
    let mut o = route.object(model, text, true);
    o["done_reason"] = json!(done_reason(finish));
    if let Value::Object(m) = &mut o {
        m.extend(t.stats(st, completion_tokens));
    }
    o
}

/// Submits `job` and answers it, streamed or whole. Failures before the first token are
/// the response's own status (a full KV budget is a 503), as on the OpenAI routes.
/// With `split` (the chat route), the answer is split into `content`, `thinking` and
/// `tool_calls`.
async fn run(
    s: &AppState,
    job: Job,
    route: Route,
    stream: bool,
    received: Instant,
    mut split: Option<crate::tools::split::Splitter>,
) -> Result<Response, OllamaError> {
    let (st, rx) = api::start(s, job).await?;
    let admitted = Instant::now();
    let (head, mut rx) = api::first_output(rx).await?;
    let t = Timeline { received, admitted, first_output: Instant::now() };
    let model = s.config.model_id.clone();
    let session_header = HeaderValue::from_str(&st.session_id).ok();
    if !stream {
        let mut text = String::new();
        let mut ev = Some(head);
        let (finish, completion_tokens) = loop {
            match ev {
                Some(Event::Text(piece)) => text.push_str(&piece),
                Some(Event::Finished { finish, completion_tokens, .. }) => break (finish, completion_tokens),
                Some(Event::Failed(e)) => return Err(e.into()),
                Some(Event::Started { .. } | Event::Logprob(_)) => {}
                None => return Err(ApiError::internal("the engine stopped before the answer was complete").into()),
            }
            ev = rx.recv().await;
        };
        let mut o = last(route, &model, &text, finish, &t, &st, completion_tokens);
        if let Some(split) = split {
            o["message"] = chat_message(&split.split(&text));
        }
        let mut r = axum::Json(o).into_response();
        if let Some(v) = session_header {
            r.headers_mut().insert("x-session-id", v);
        }
        return Ok(r);
    }
    let line = |v: Value| {
        let mut b = serde_json::to_vec(&v).unwrap_or_default();
        b.push(b'\n');
        Bytes::from(b)
    };
    // One object per piece of the split answer (or per piece of text, unsplit).
    let mut objects = move |model: &str, text: Option<&str>| -> Vec<Value> {
        let pieces = match (&mut split, text) {
            (None, Some(t)) => return vec![route.object(model, t, false)],
            (None, None) => return vec![],
            (Some(sp), Some(t)) => sp.push(t),
            (Some(sp), None) => sp.finish(),
        };
        pieces
            .into_iter()
            .map(|p| {
                let mut o = route.object(model, "", false);
                o["message"] = chat_message(&crate::tools::split::collect(vec![p]));
                o
            })
            .collect()
    };
    let format: crate::sse::FormatterOf<Bytes> = Box::new(move |ev| match ev {
        Some(Event::Text(piece)) => (objects(&model, Some(&piece)).into_iter().map(line).collect(), false),
        Some(Event::Finished { finish, completion_tokens, .. }) => {
            let mut out: Vec<Bytes> = objects(&model, None).into_iter().map(line).collect();
            out.push(line(last(route, &model, "", finish, &t, &st, completion_tokens)));
            (out, true)
        }
        // Mid-stream, Ollama reports a failure as an error object on its own line.
        Some(Event::Failed(e)) => (vec![line(OllamaError(e).body())], true),
        Some(Event::Started { .. } | Event::Logprob(_)) => (vec![], false),
        None => (vec![line(OllamaError(ApiError::internal("the engine stopped")).body())], true),
    });
    let mut r = Body::from_stream(EventStream::new(Vec::new(), head, rx, format)).into_response();
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/x-ndjson"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Some(v) = session_header {
        r.headers_mut().insert("x-session-id", v);
    }
    Ok(r)
}
