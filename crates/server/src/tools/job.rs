//! A chat request's tools turned into what its job needs: the conversation and template
//! variables to render ([`super::prompt`]), the grammar to decode under
//! ([`super::format`]), and, once the prompt is rendered, the [`Splitter`] its answer goes
//! through (reasoning apart whenever the template has a `<think>` section, with or without
//! tools).
//!
//! Invariant: every check runs here, before the job is built: a refused request has
//! queued and stored nothing.

use std::sync::Arc;

use engram_engine::Grammar;
use engram_tokenizer::ChatMessage;
use serde_json::{Map, Value};

use super::format::{self, Family};
use super::split::{Check, Splitter, Think};
use super::{key_order, prompt, request, Choice, Tools};
use crate::error::ApiError;
use crate::AppState;

/// A chat request ready to render, with how to read its answer.
pub(crate) struct Prepared {
    pub messages: Vec<ChatMessage>,
    /// The template variables: the request's own, and `tools` for the template families.
    pub kwargs: Map<String, Value>,
    /// What the answer decodes under for its tools (`None`: free, or the request's own
    /// structured output).
    pub grammar: Option<Arc<Grammar>>,
    /// Whether the request has tools the answer may call (not `none`).
    pub calls: Option<Family>,
    args: Vec<format::ArgsGrammar>,
    /// Mistral's call ids, as the grammar writes them.
    ids: Vec<String>,
}

/// Marker `m`'s id when it is one special token of `tok`.
fn special_id(tok: &engram_tokenizer::Tokenizer, m: &str) -> Option<u32> {
    tok.token_to_id(m).filter(|&id| tok.is_special_id(id))
}

/// Whether an answer's text shows special tokens: always for harmony (its structure is
/// special tokens: `<|channel|>`, `<|message|>`), and under a grammar (`tools`) when the
/// family's call marker is a special token of the vocabulary (`[TOOL_CALLS]`), for the
/// splitter to find reasoning, content and calls.
pub(crate) fn shows_special_tokens(s: &AppState, grammar: bool) -> bool {
    let family = family(s);
    family == Family::Harmony || (grammar && family.marker_token().is_some_and(|m| special_id(&s.model.tokenizer, m).is_some()))
}

/// The served template's family (`Generic` without a template: rendering then fails).
pub(crate) fn family(s: &AppState) -> Family {
    s.model.tokenizer.chat_template().map(|t| Family::detect(t.source())).unwrap_or(Family::Generic)
}

/// Checks a request's tools and tool turns and prepares its rendering.
pub(crate) async fn prepare(
    s: &AppState,
    tools: Option<Tools>,
    messages: Vec<ChatMessage>,
    kwargs: Option<&Map<String, Value>>,
) -> Result<Prepared, ApiError> {
    request::check_history(&messages)?;
    let mut kwargs = kwargs.cloned().unwrap_or_default();
    if tools.is_some() {
        if let crate::ContextMode::Dual { .. } = s.config.context {
            return Err(ApiError::bad_param("tools", "tools: dual-stream contexts render each turn alone; use the default sessions mode"));
        }
        if kwargs.contains_key("tools") {
            return Err(ApiError::bad_param(
                "chat_template_kwargs.tools",
                "chat_template_kwargs.tools: the template's `tools` come from the request's tools",
            ));
        }
    }
    let family = family(s);
    let think = format::Think {
        section: s.model.tokenizer.chat_template().is_some_and(|t| t.source().contains("<think>")),
        before_calls: kwargs.get("enable_thinking") == Some(&Value::Bool(true)),
    };
    let compiled = match &tools {
        Some(t) => {
            let c = crate::structured::compiler(s).await?;
            let t = t.clone();
            let model = s.model.clone();
            let conversation = conversation_key(&messages, &t);
            Some(
                crate::api::off_runtime(move || {
                    format::compile(&c, family, think, &t, &|m| special_id(&model.tokenizer, m), &conversation)
                })
                .await?,
            )
        }
        None => None,
    };
    let has_tool_turns = messages.iter().any(|m| m.role == "tool" || m.fields.contains_key("tool_calls"));
    let mut messages =
        if tools.is_some() || has_tool_turns { prompt::prepare(family, tools.as_ref(), messages, &mut kwargs) } else { messages };
    if family == Family::Harmony {
        // Harmony templates read an assistant's reasoning as `thinking`.
        for m in &mut messages {
            if let Some(r) = m.fields.get("reasoning_content").cloned() {
                m.fields.entry("thinking".to_string()).or_insert(r);
            }
        }
    }
    // The generic family's answer is always JSON to split (with `none`, a text answer).
    let calls = tools.as_ref().filter(|t| t.choice != Choice::None || family == Family::Generic).map(|_| family);
    let (grammar, args, ids) = compiled.map(|c| (c.grammar, c.args, c.ids)).unwrap_or_default();
    Ok(Prepared { messages, kwargs, grammar, calls, args, ids })
}

/// A hash of a request's conversation and tools, from which what the grammar writes of its
/// own (Mistral's call ids) is drawn.
fn conversation_key(messages: &[ChatMessage], tools: &Tools) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&serde_json::to_vec(messages).unwrap_or_default());
    for t in &tools.list {
        h.update(t.openai_json().to_string().as_bytes());
    }
    *h.finalize().as_bytes()
}

impl Prepared {
    /// Puts the tools' grammar into `sampling`; a request that set its own grammar too
    /// (structured output) is a 400 naming `field`, saying `why`.
    pub fn bind_grammar(&self, sampling: &mut crate::api::Sampling, field: &str, why: &str) -> Result<(), ApiError> {
        let Some(g) = self.grammar.clone() else { return Ok(()) };
        if sampling.grammar.is_some() {
            return Err(ApiError::bad_param(field, why));
        }
        sampling.grammar = Some(g);
        Ok(())
    }

    /// The splitter for the answer to `prompt` (the rendered text).
    pub fn splitter(&self, s: &AppState, prompt: Option<&str>) -> Splitter {
        let template = s.model.tokenizer.chat_template().map(|t| t.source()).unwrap_or("");
        let think = match prompt {
            Some(p) => Think::of(template, p),
            None => Think::No,
        };
        let check = ArgsCheck { args: self.args.clone(), model: s.model.clone() };
        Splitter::new(think, self.calls, Box::new(check)).with_ids(self.ids.clone())
    }
}

/// Checks a call against its tool's arguments grammar.
struct ArgsCheck {
    args: Vec<format::ArgsGrammar>,
    model: Arc<engram_model::Model>,
}

impl Check for ArgsCheck {
    fn knows(&self, name: &str) -> bool {
        self.args.iter().any(|a| a.name == name)
    }

    /// The arguments as written, or with their keys in the schema's order (the grammar
    /// writes keys in that order; a model writing freely may not).
    fn accepts(&self, name: &str, arguments: &str) -> bool {
        let Some(a) = self.args.iter().find(|a| a.name == name) else { return false };
        let tok = &self.model.tokenizer;
        a.grammar.accepts(tok, arguments)
            || serde_json::from_str::<Value>(arguments)
                .map(|v| key_order::in_schema_order(&v, &a.schema).to_string())
                .is_ok_and(|ordered| ordered != arguments && a.grammar.accepts(tok, &ordered))
    }
}
