//! A call's arguments → what the engine runs: chat messages, and the sampling options
//! (`max_tokens`, `temperature`, …) checked as `/v1/chat/completions` checks them, with the same
//! messages, raised as `ValueError` (a wrong type: `TypeError`) before anything is queued.
//!
//! Invariant: a call refused here has queued nothing and changed nothing.

use std::sync::Arc;

use engram_engine::{Grammar, GrammarCompiler, SamplingParams};
use engram_tokenizer::ChatMessage;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use serde_json::Value;

use crate::convert::{from_py, type_name};
use crate::errors::value;

/// Most stop strings per request (as the server).
const MAX_STOPS: usize = 16;
/// Longest stop string, in bytes (as the server).
const MAX_STOP_BYTES: usize = 256;

/// The sampling options a call names (`None`: the default).
#[derive(Default)]
pub struct Options {
    pub max_tokens: Option<i64>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub ignore_eos: bool,
    pub response_format: Option<Value>,
    /// Alternatives per generated token's log-probability (`None`: no log-probabilities).
    pub logprobs: Option<usize>,
}

/// The option names [`Options::parse`] takes, in the order error messages list them.
pub const OPTION_NAMES: [&str; 14] = [
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "stop",
    "ignore_eos",
    "response_format",
    "logprobs",
    "top_logprobs",
];

impl Options {
    /// The options in `kwargs` for `method` (named in errors); an unknown name is a `TypeError`,
    /// as Python's own for an unexpected keyword argument. `None` values are the defaults.
    pub fn parse(method: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Options> {
        let mut o = Options::default();
        let Some(kwargs) = kwargs else { return Ok(o) };
        let (mut logprobs, mut top) = (None, None);
        for (k, v) in kwargs.iter() {
            let name: String = k.extract()?;
            if v.is_none() {
                if !OPTION_NAMES.contains(&name.as_str()) {
                    return Err(unexpected(method, &name));
                }
                continue;
            }
            match name.as_str() {
                "max_tokens" => o.max_tokens = Some(int(&v, &name)?),
                "temperature" => o.temperature = Some(float(&v, &name)?),
                "top_p" => o.top_p = Some(float(&v, &name)?),
                "top_k" => o.top_k = Some(int(&v, &name)?),
                "min_p" => o.min_p = Some(float(&v, &name)?),
                "repetition_penalty" => o.repetition_penalty = Some(float(&v, &name)?),
                "frequency_penalty" => o.frequency_penalty = Some(float(&v, &name)?),
                "presence_penalty" => o.presence_penalty = Some(float(&v, &name)?),
                "seed" => {
                    let s = int(&v, &name)?;
                    o.seed = Some(u64::try_from(s).map_err(|_| value(format!("seed must be >= 0, got {s}")))?);
                }
                "stop" => o.stop = stop_list(&v)?,
                "ignore_eos" => {
                    o.ignore_eos =
                        v.extract().map_err(|_| PyTypeError::new_err(format!("ignore_eos must be a bool, got {}", type_name(&v))))?
                }
                "response_format" => o.response_format = Some(from_py(&v, "response_format")?),
                "logprobs" => logprobs = Some(v.clone()),
                "top_logprobs" => top = Some(alternatives(&v, "top_logprobs")?),
                _ => return Err(unexpected(method, &name)),
            }
        }
        // `logprobs`: true (chat's, with `top_logprobs` alternatives) or a count (completions').
        o.logprobs = match logprobs {
            None => None,
            Some(v) if v.is_instance_of::<pyo3::types::PyBool>() => v.extract::<bool>()?.then_some(top.unwrap_or(0)),
            Some(v) => Some(alternatives(&v, "logprobs")?),
        };
        if top.is_some_and(|n| n > 0) && o.logprobs.is_none() {
            return Err(value("top_logprobs needs logprobs=True"));
        }
        Ok(o)
    }

    /// The engine's parameters for a prompt of `prompt_len` tokens in a context of `ctx`, with
    /// the default `max_tokens` (`None`: the rest of the context) and `temperature`; the same
    /// checks and messages as the server's.
    pub fn params(
        self,
        prompt_len: usize,
        ctx: usize,
        default_max: Option<i64>,
        grammar: Option<Arc<Grammar>>,
    ) -> PyResult<SamplingParams> {
        if prompt_len == 0 {
            return Err(value("the prompt is empty"));
        }
        if prompt_len >= ctx {
            return Err(value(format!("the prompt is {prompt_len} tokens; this model's context is {ctx} tokens")));
        }
        let room = ctx - prompt_len;
        let max_tokens = match self.max_tokens.or(default_max) {
            None => room,
            Some(n) if n < 1 => return Err(value(format!("max_tokens must be at least 1, got {n}"))),
            Some(n) if n as u64 > room as u64 => {
                return Err(value(format!(
                    "max_tokens is {n}, but the prompt ({prompt_len} tokens) leaves room for at most {room} in this model's context of {ctx} tokens"
                )))
            }
            Some(n) => n as usize,
        };
        if let Some(k) = self.top_k {
            if k < 0 && k != -1 {
                return Err(value("top_k must be >= 0 (or -1 for no limit)"));
            }
        }
        if let Some(t) = self.temperature {
            if t > 2.0 {
                return Err(value(format!("temperature must be in [0, 2], got {t}")));
            }
        }
        for (name, v) in [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)] {
            if let Some(v) = v {
                if !(-2.0..=2.0).contains(&v) {
                    return Err(value(format!("{name} must be in [-2, 2], got {v}")));
                }
            }
        }
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(1.0),
            top_k: self.top_k.filter(|&k| k > 0).unwrap_or(0) as usize,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            seed: self.seed.unwrap_or(0),
            max_tokens,
            stop: self.stop,
            stop_token_ids: Vec::new(),
            ignore_eos: self.ignore_eos,
            speculate: None,
            logprobs: self.logprobs,
            grammar,
            show_special_tokens: false,
        };
        p.validate().map_err(|e| value(e.to_string()))?;
        Ok(p)
    }
}

fn unexpected(method: &str, name: &str) -> PyErr {
    PyTypeError::new_err(format!("{method}() got an unexpected keyword argument '{name}' (options: {})", OPTION_NAMES.join(", ")))
}

fn int(v: &Bound<'_, PyAny>, name: &str) -> PyResult<i64> {
    if v.is_instance_of::<pyo3::types::PyBool>() {
        return Err(PyTypeError::new_err(format!("{name} must be an int, got bool")));
    }
    v.extract().map_err(|_| PyTypeError::new_err(format!("{name} must be an int, got {}", type_name(v))))
}

/// A count of alternatives, 0..=20.
fn alternatives(v: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    let most = engram_engine::logprobs::MAX_TOP_LOGPROBS;
    let n = int(v, name)?;
    if !(0..=most as i64).contains(&n) {
        return Err(value(format!("{name} must be an integer from 0 to {most}, got {n}")));
    }
    Ok(n as usize)
}

fn float(v: &Bound<'_, PyAny>, name: &str) -> PyResult<f32> {
    if v.is_instance_of::<pyo3::types::PyBool>() || v.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!("{name} must be a number, got {}", type_name(v))));
    }
    let f: f64 = v.extract().map_err(|_| PyTypeError::new_err(format!("{name} must be a number, got {}", type_name(v))))?;
    if !f.is_finite() {
        return Err(value(format!("{name} must be a finite number, got {f}")));
    }
    Ok(f as f32)
}

/// `stop`: one string or a list of them (at most 16, each at most 256 bytes, none empty).
pub fn stop_list(v: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let list: Vec<String> = if let Ok(s) = v.extract::<String>() {
        vec![s]
    } else {
        v.extract().map_err(|_| PyTypeError::new_err(format!("stop must be a str or a list of str, got {}", type_name(v))))?
    };
    if list.len() > MAX_STOPS {
        return Err(value(format!("at most {MAX_STOPS} stop sequences")));
    }
    if let Some(long) = list.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(value(format!("a stop sequence is {} bytes; at most {MAX_STOP_BYTES}", long.len())));
    }
    if list.iter().any(String::is_empty) {
        return Err(value("a stop sequence is empty"));
    }
    Ok(list)
}

/// OpenAI-shaped messages (`[{"role": ..., "content": ...}]`, content a str or a list of
/// `{"type": "text", "text": ...}` parts) as chat messages.
pub fn messages(obj: &Bound<'_, PyAny>) -> PyResult<Vec<ChatMessage>> {
    if obj.is_instance_of::<PyString>() || obj.is_instance_of::<PyDict>() {
        return Err(PyTypeError::new_err(format!(
            "messages must be a list of dicts like {{\"role\": \"user\", \"content\": \"...\"}}, got a {}",
            type_name(obj)
        )));
    }
    let items = obj.try_iter().map_err(|_| PyTypeError::new_err(format!("messages must be a list of dicts, got {}", type_name(obj))))?;
    let mut out = Vec::new();
    for (i, item) in items.enumerate() {
        let item = item?;
        let d = item.cast::<PyDict>().map_err(|_| {
            PyTypeError::new_err(format!("messages[{i}] must be a dict with \"role\" and \"content\", got {}", type_name(&item)))
        })?;
        let role = match d.get_item("role")? {
            Some(r) => r.extract::<String>().map_err(|_| PyTypeError::new_err(format!("messages[{i}][\"role\"] must be a str")))?,
            None => return Err(value(format!("messages[{i}] has no \"role\""))),
        };
        if !matches!(role.as_str(), "system" | "developer" | "user" | "assistant" | "tool") {
            return Err(value(format!(
                "messages[{i}][\"role\"] must be \"system\", \"developer\", \"user\", \"assistant\" or \"tool\", got {role:?}"
            )));
        }
        let content = match d.get_item("content")? {
            None => return Err(value(format!("messages[{i}] has no \"content\""))),
            Some(c) if c.is_none() => String::new(),
            Some(c) => content(&c, i)?,
        };
        // `developer` is OpenAI's newer name for `system`; templates know only `system`.
        let role = if role == "developer" { "system".to_string() } else { role };
        out.push(ChatMessage::new(role, content));
    }
    if out.is_empty() {
        return Err(value("messages must not be empty"));
    }
    Ok(out)
}

fn content(c: &Bound<'_, PyAny>, i: usize) -> PyResult<String> {
    if let Ok(s) = c.extract::<String>() {
        return Ok(s);
    }
    let bad = || {
        PyTypeError::new_err(format!("messages[{i}][\"content\"] must be a str or a list of {{\"type\": \"text\", \"text\": ...}} parts"))
    };
    let mut text = String::new();
    for part in c.try_iter().map_err(|_| bad())? {
        let part = part?;
        let d = part.cast::<PyDict>().map_err(|_| bad())?;
        match d.get_item("type")?.map(|t| t.extract::<String>()).transpose().map_err(|_| bad())?.as_deref() {
            Some("text") => {}
            Some(other) => return Err(value(format!("messages[{i}]: content parts of type {other:?} are not supported (only \"text\")"))),
            None => return Err(bad()),
        }
        let t: String = d.get_item("text")?.ok_or_else(bad)?.extract().map_err(|_| bad())?;
        text.push_str(&t);
    }
    Ok(text)
}

/// OpenAI's `response_format`: `None` or `{"type": "text"}` ask for nothing; `{"type":
/// "json_object"}` any JSON object; `{"type": "json_schema", "json_schema": {"schema": ...}}`
/// JSON valid against the schema. The same shapes and messages as the server's.
pub fn response_format(v: Option<Value>, compiler: impl FnOnce() -> PyResult<Arc<GrammarCompiler>>) -> PyResult<Option<Arc<Grammar>>> {
    const F: &str = "response_format";
    let Some(v) = v.filter(|v| !v.is_null()) else { return Ok(None) };
    let Some(o) = v.as_object() else { return Err(value("response_format must be an object with a `type`")) };
    let schema = match o.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => None,
        Some("json_schema") => {
            let js = o
                .get("json_schema")
                .and_then(Value::as_object)
                .ok_or_else(|| value("response_format.json_schema: an object with `name` and `schema` is required"))?;
            if js.get("strict").is_some_and(|v| !v.is_boolean() && !v.is_null()) {
                return Err(value("response_format.json_schema.strict must be a boolean"));
            }
            match js.get("schema") {
                Some(schema) if schema.is_object() => Some(schema.clone()),
                None | Some(Value::Null) => None,
                Some(_) => return Err(value("response_format.json_schema.schema must be an object")),
            }
        }
        Some(other) => {
            return Err(value(format!("response_format.type must be \"text\", \"json_object\" or \"json_schema\", got {other:?}")))
        }
        None => return Err(value("response_format.type is required")),
    };
    let c = compiler()?;
    let g = match schema {
        Some(s) => c.json_schema(s),
        None => c.json_object(),
    };
    g.map(Some).map_err(|e| value(format!("{F}: the schema does not compile: {e}")))
}
