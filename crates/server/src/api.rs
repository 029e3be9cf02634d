//! What every endpoint shares: authentication (API key → tenant), session
//! ids, JSON parsing into 400s, model-name checks, prompt limits, sampling
//! parameters, and running a job to its first event.

use axum::http::HeaderMap;
use engram_engine::{FinishReason, SamplingParams};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::engine_handle::{Event, Job};
use crate::error::ApiError;
use crate::AppState;

/// The tenant a request acts for.
pub fn tenant(s: &AppState, headers: &HeaderMap) -> Result<String, ApiError> {
    if s.config.api_keys.is_empty() {
        return Ok("default".into());
    }
    let bearer = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer ")).map(str::trim);
    let key = bearer.or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()).map(str::trim));
    let Some(key) = key else {
        return Err(ApiError::unauthorized("missing API key (send `Authorization: Bearer KEY` or `x-api-key: KEY`)"));
    };
    // Constant time: blake3 hashes compare in constant time (and hide the keys' lengths),
    // and every configured key is compared whichever matches.
    let presented = blake3::hash(key.as_bytes());
    let mut tenant = None;
    for (k, t) in &s.config.api_keys {
        if blake3::hash(k.as_bytes()) == presented && tenant.is_none() {
            tenant = Some(t);
        }
    }
    tenant.cloned().ok_or_else(|| ApiError::unauthorized("invalid API key"))
}

/// Checks an id that names a session or an agent: 1..=128 characters of
/// `[A-Za-z0-9_.:-]`, not `.`/`..` — it may become a file name later.
pub fn check_id(param: &str, id: &str) -> Result<(), ApiError> {
    let ok_chars = id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'));
    if id.is_empty() || id.len() > 128 || !ok_chars || id.contains("..") || id == "." {
        return Err(ApiError::bad_param(
            param,
            format!("invalid {param} {id:?}: use 1 to 128 characters of A-Z a-z 0-9 _ - . : (no \"..\", no \"/\")"),
        ));
    }
    Ok(())
}

/// The session a request names: the `session_id` body field, else the
/// `X-Session-Id` header.
pub fn session(headers: &HeaderMap, body: Option<&str>) -> Result<Option<String>, ApiError> {
    let id = match body {
        Some(b) => Some(b.to_string()),
        None => match headers.get("x-session-id") {
            Some(v) => Some(v.to_str().map_err(|_| ApiError::bad_param("session_id", "X-Session-Id is not ASCII"))?.to_string()),
            None => None,
        },
    };
    if let Some(id) = &id {
        check_id("session_id", id)?;
    }
    Ok(id)
}

/// Longest stop sequence, in bytes (each is matched against the text held back as it streams).
pub const MAX_STOP_BYTES: usize = 256;

/// Parses a JSON body; any error is a 400 that says where.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.is_empty() {
        return Err(ApiError::bad_request("the request body is empty; expected a JSON object"));
    }
    serde_json::from_slice(body).map_err(|e| {
        let msg = format!("invalid JSON body: {e}");
        // serde names the field in "missing field `x`" / "unknown variant"; pass it as param.
        let param = msg.split('`').nth(1).filter(|_| msg.contains("field `")).map(str::to_string);
        ApiError { param, ..ApiError::bad_request(msg) }
    })
}

/// Request fields of the OpenAI and Anthropic APIs this server does not
/// implement, flattened into each request so they are rejected with a 400
/// naming the field instead of being silently ignored (serde ignores
/// unknown fields). NOTE: values that ask for nothing (`null`, `false`,
/// `[]`, `{}`, `"none"`) are accepted, as some clients always send them.
#[derive(Deserialize, Debug, Default)]
pub struct Unsupported {
    tools: Option<serde_json::Value>,
    tool_choice: Option<serde_json::Value>,
    functions: Option<serde_json::Value>,
    function_call: Option<serde_json::Value>,
    logit_bias: Option<serde_json::Value>,
    logprobs: Option<serde_json::Value>,
    top_logprobs: Option<serde_json::Value>,
}

impl Unsupported {
    /// Takes `logprobs` and `top_logprobs` out, for the endpoints that support them (OpenAI's
    /// chat and completions); left in, [`Unsupported::check`] refuses them.
    pub fn take_logprobs(&mut self) -> (Option<serde_json::Value>, Option<serde_json::Value>) {
        (self.logprobs.take(), self.top_logprobs.take())
    }

    /// A 400 for the first field that asks for something.
    pub fn check(&self) -> Result<(), ApiError> {
        use serde_json::Value;
        let fields = [
            ("tools", &self.tools, "tools are taken on the chat routes (/v1/chat/completions, /v1/messages, /api/chat) only"),
            ("tool_choice", &self.tool_choice, "tools are taken on the chat routes (/v1/chat/completions, /v1/messages, /api/chat) only"),
            ("functions", &self.functions, "the legacy `functions` is not supported by this server (send `tools`)"),
            ("function_call", &self.function_call, "the legacy `function_call` is not supported by this server (send `tool_choice`)"),
            ("logit_bias", &self.logit_bias, "logit_bias is not supported by this server"),
            ("logprobs", &self.logprobs, "logprobs are supported on /v1/chat/completions and /v1/completions only"),
            ("top_logprobs", &self.top_logprobs, "logprobs are supported on /v1/chat/completions and /v1/completions only"),
        ];
        for (name, value, why) in fields {
            let asks = match value {
                None | Some(Value::Null) | Some(Value::Bool(false)) => false,
                Some(Value::Array(a)) => !a.is_empty(),
                Some(Value::Object(o)) => !o.is_empty(),
                Some(Value::String(s)) => s != "none",
                Some(_) => true,
            };
            if asks {
                return Err(ApiError::bad_param(name, format!("`{name}`: {why}; remove the field")));
            }
        }
        Ok(())
    }
}

/// Ids a request may name as `model`.
///
/// NOTE: not the model's source (`gguf:<path>`): error messages list these, and a
/// client has no business learning the server's file system paths.
pub fn model_ids(s: &AppState) -> Vec<String> {
    vec![s.config.model_id.clone(), "default".into(), "engram".into()]
}

/// Accepts the served model and its aliases (or no model at all).
pub fn check_model(s: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        None => Ok(()),
        Some(m) if model_ids(s).iter().any(|id| id == m) => Ok(()),
        Some(m) => Err(ApiError::unknown_model(format!(
            "The model `{m}` does not exist; this server serves `{}` (aliases: {})",
            s.config.model_id,
            model_ids(s)[1..].join(", ")
        ))),
    }
}

/// `stop`: a string or a list of strings.
#[derive(Deserialize, Debug)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

/// Sampling fields common to the APIs, all optional.
#[derive(Default, Debug)]
pub struct Sampling {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub seed: Option<i64>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    /// `"prompt-lookup"` or `"none"`; `None`: as the server is configured.
    pub draft: Option<String>,
    /// Alternatives per token to report with log-probabilities (`logprobs.rs`); `None`: none.
    pub logprobs: Option<usize>,
    /// A `max_tokens` past the room the prompt leaves is cut to that room instead of refused
    /// (Ollama's `num_predict`: generation ends at the context's end).
    pub fit_to_context: bool,
    /// The grammar the answer must follow (`response_format`, Ollama's `format`), compiled.
    pub grammar: Option<std::sync::Arc<engram_engine::Grammar>>,
}

/// Validates limits and builds the engine's parameters for `prompt_len`.
pub fn params(s: &AppState, prompt_len: usize, f: Sampling) -> Result<SamplingParams, ApiError> {
    let ctx = s.model.config.max_positions;
    if prompt_len == 0 {
        return Err(ApiError::bad_request("the prompt is empty"));
    }
    if prompt_len >= ctx {
        return Err(ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::bad_param("messages", format!("the prompt is {prompt_len} tokens; this model's context is {ctx} tokens"))
        });
    }
    let room = ctx - prompt_len;
    let max_tokens = match f.max_tokens {
        None => room,
        Some(n) if n < 1 => return Err(ApiError::bad_param("max_tokens", format!("max_tokens must be at least 1, got {n}"))),
        Some(n) if f.fit_to_context && n as u64 > room as u64 => room,
        Some(n) if n as u64 > room as u64 => {
            return Err(ApiError { code: Some("context_length_exceeded"), ..ApiError::bad_param("max_tokens", format!("max_tokens is {n}, but the prompt ({prompt_len} tokens) leaves room for at most {room} in this model's context of {ctx} tokens")) })
        }
        Some(n) => n as usize,
    };
    if let Some(k) = f.top_k {
        if k < 0 && k != -1 {
            return Err(ApiError::bad_param("top_k", "top_k must be >= 0 (or -1 for no limit)"));
        }
    }
    if let Some(t) = f.temperature {
        if t > 2.0 {
            return Err(ApiError::bad_param("temperature", format!("temperature must be in [0, 2], got {t}")));
        }
    }
    for (name, v) in [("frequency_penalty", f.frequency_penalty), ("presence_penalty", f.presence_penalty)] {
        if let Some(v) = v {
            if !(-2.0..=2.0).contains(&v) {
                return Err(ApiError::bad_param(name, format!("{name} must be in [-2, 2], got {v}")));
            }
        }
    }
    if f.stop.len() > 16 {
        return Err(ApiError::bad_param("stop", "at most 16 stop sequences"));
    }
    if let Some(long) = f.stop.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(ApiError::bad_param("stop", format!("a stop sequence is {} bytes; at most {MAX_STOP_BYTES}", long.len())));
    }
    let speculate = match f.draft.as_deref() {
        None => None,
        Some("prompt-lookup") => Some(true),
        Some("none") => Some(false),
        Some(other) => {
            return Err(ApiError::bad_param(
                "draft",
                format!("draft must be \"prompt-lookup\" or \"none\", got {other:?} (draft models are not supported yet)"),
            ))
        }
    };
    let p = SamplingParams {
        temperature: f.temperature.unwrap_or(1.0),
        top_k: f.top_k.filter(|&k| k > 0).unwrap_or(0) as usize,
        top_p: f.top_p.unwrap_or(1.0),
        min_p: f.min_p.unwrap_or(0.0),
        repetition_penalty: f.repetition_penalty.unwrap_or(1.0),
        frequency_penalty: f.frequency_penalty.unwrap_or(0.0),
        presence_penalty: f.presence_penalty.unwrap_or(0.0),
        seed: f.seed.unwrap_or(0) as u64,
        max_tokens,
        stop: f.stop,
        stop_token_ids: Vec::new(),
        ignore_eos: f.ignore_eos,
        speculate,
        logprobs: f.logprobs,
        grammar: f.grammar,
        show_special_tokens: false,
    };
    p.validate()?;
    Ok(p)
}

/// What the engine said when it admitted a request.
pub struct Started {
    pub session_id: String,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
}

/// Submits `job` and waits until it is admitted (or refused).
pub async fn start(s: &AppState, job: Job) -> Result<(Started, UnboundedReceiver<Event>), ApiError> {
    started(s.engine.submit(job)?).await
}

/// Waits for a submitted job's `Started` event (see [`start`]).
pub async fn started(mut rx: UnboundedReceiver<Event>) -> Result<(Started, UnboundedReceiver<Event>), ApiError> {
    match rx.recv().await {
        Some(Event::Started { session_id, prompt_tokens, cached_tokens }) => Ok((Started { session_id, prompt_tokens, cached_tokens }, rx)),
        Some(Event::Failed(e)) => Err(e),
        Some(other) => Err(ApiError::internal(format!("engine protocol: expected Started, got {other:?}"))),
        None => Err(ApiError::unavailable("the engine stopped")),
    }
}

/// Waits for a streamed job's first output after `Started`: its first token (or log-probability),
/// its end, or its failure. A stream's status line and headers go out only after this, so a
/// failure before any output (the KV budget filling up while the prompt is prefilled) is answered
/// with its own status and headers (503 with Retry-After), which clients retry, instead of an
/// error event inside a `200` stream, which they do not.
pub async fn first_output(mut rx: UnboundedReceiver<Event>) -> Result<(Event, UnboundedReceiver<Event>), ApiError> {
    loop {
        match rx.recv().await {
            Some(Event::Failed(e)) => return Err(e),
            // Sent again when a sequence starts over without a cache that failed its check.
            Some(Event::Started { .. }) => continue,
            Some(ev) => return Ok((ev, rx)),
            None => return Err(ApiError::unavailable("the engine stopped")),
        }
    }
}

/// A whole (non-streamed) answer.
pub struct Completed {
    pub text: String,
    /// One per generated token, when the request asked for log-probabilities.
    pub logprobs: Vec<engram_engine::TokenLogprob>,
    pub finish: FinishReason,
    pub completion_tokens: usize,
    pub stop_string: bool,
}

/// Reads events to the end.
pub async fn collect(rx: &mut UnboundedReceiver<Event>) -> Result<Completed, ApiError> {
    let (mut text, mut logprobs) = (String::new(), Vec::new());
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Text(t) => text.push_str(&t),
            Event::Logprob(l) => logprobs.push(l),
            Event::Finished { finish, completion_tokens, stop_string } => {
                return Ok(Completed { text, logprobs, finish, completion_tokens, stop_string })
            }
            Event::Failed(e) => return Err(e),
            Event::Started { .. } => {}
        }
    }
    Err(ApiError::internal("the engine stopped before the answer was complete"))
}

/// Seconds since the epoch (for `created` fields).
pub fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// A fresh response id with `prefix`.
/// `<prefix>-` and 24 random hex digits: not from a global counter or the clock, which
/// would tell a tenant how many requests other tenants sent.
pub fn new_id(prefix: &str) -> String {
    let mut b = [0u8; 12];
    if getrandom::fill(&mut b).is_err() {
        // No OS randomness: unique still (a counter with the time), not secret.
        use std::sync::atomic::{AtomicU64, Ordering};
        static N: AtomicU64 = AtomicU64::new(0);
        let seed = [now_s().to_le_bytes(), N.fetch_add(1, Ordering::Relaxed).to_le_bytes()].concat();
        b.copy_from_slice(&blake3::hash(&seed).as_bytes()[..12]);
    }
    format!("{prefix}-{}", b.iter().map(|x| format!("{x:02x}")).collect::<String>())
}

/// Runs CPU-heavy request work (rendering a template, tokenizing a prompt of up to
/// 2 MiB) on tokio's blocking pool, so the async workers go on serving other
/// connections meanwhile.
pub async fn off_runtime<T: Send + 'static>(work: impl FnOnce() -> Result<T, ApiError> + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work).await.map_err(|_| ApiError::internal("preparing the request failed (a worker panicked)"))?
}

/// The template variables a request may not set: the ones the renderer itself passes.
const TEMPLATE_OWN_VARIABLES: [&str; 4] = ["messages", "add_generation_prompt", "bos_token", "eos_token"];

/// Renders a conversation with the model's chat template and encodes it, off the async
/// workers, with extra template variables (`chat_template_kwargs`: Qwen3's
/// `enable_thinking`, say; the request's `tools`); one that would replace the renderer's own
/// is a 400 naming it.
pub async fn render_chat_with(
    s: &AppState,
    messages: Vec<engram_tokenizer::ChatMessage>,
    extra: serde_json::Map<String, serde_json::Value>,
) -> Result<(String, Vec<u32>), ApiError> {
    if let Some(k) = extra.keys().find(|k| TEMPLATE_OWN_VARIABLES.contains(&k.as_str())) {
        return Err(ApiError::bad_param(
            &format!("chat_template_kwargs.{k}"),
            format!("chat_template_kwargs.{k}: the template's `{k}` is set by the server"),
        ));
    }
    let model = s.model.clone();
    off_runtime(move || {
        let tok = &model.tokenizer;
        let tpl = tok.chat_template().ok_or_else(|| ApiError::bad_request("the served model has no chat template; use /v1/completions"))?;
        let text = tpl.render_with(&messages, true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""), &extra)?;
        let ids = tok.encode(&text, false)?.ids;
        Ok((text, ids))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc::unbounded_channel;

    fn started() -> Event {
        Event::Started { session_id: "s".into(), prompt_tokens: 3, cached_tokens: 0 }
    }

    #[tokio::test]
    async fn a_failure_before_any_output_is_the_streams_status() {
        let (tx, rx) = unbounded_channel();
        tx.send(started()).unwrap();
        tx.send(Event::Failed(ApiError::unavailable("KV cache budget exhausted"))).unwrap();
        let e = first_output(rx).await.err().expect("refused");
        assert_eq!(e.status.as_u16(), 503);
        assert!(e.retry_after.is_some(), "a 503 carries Retry-After");
    }

    #[tokio::test]
    async fn the_first_output_is_handed_back_with_the_rest() {
        let (tx, rx) = unbounded_channel();
        tx.send(started()).unwrap();
        tx.send(Event::Text("Hi".into())).unwrap();
        tx.send(Event::Failed(ApiError::internal("later"))).unwrap();
        let (head, mut rx) = first_output(rx).await.expect("output");
        assert!(matches!(head, Event::Text(ref t) if t == "Hi"), "{head:?}");
        assert!(matches!(rx.recv().await, Some(Event::Failed(_))), "a later failure stays in the stream");
    }

    #[tokio::test]
    async fn an_engine_gone_before_any_output_is_a_503() {
        let (tx, rx) = unbounded_channel::<Event>();
        tx.send(started()).unwrap();
        drop(tx);
        assert_eq!(first_output(rx).await.err().expect("refused").status.as_u16(), 503);
    }
}

/// How a JSON value's type reads in an error message ("a string", "an array", …).
pub(crate) fn json_kind(v: &serde_json::Value) -> &'static str {
    use serde_json::Value;
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
