//! Tool calling on the chat routes: the request's tools and choice ([`request`], in each
//! API's spelling), the call syntax of the served model's chat template and the grammar
//! that binds a call to it ([`format`]), the prompt changes a template without tool
//! support needs ([`prompt`]), a request's job side ([`job`]), the split of the generated
//! text into reasoning, content and calls, whole or streamed ([`split`]), and the APIs'
//! shapes ([`openai_out`], [`anthropic_io`]).
//!
//! Invariant: a call reported to a client names one of the request's tools and its
//! arguments are a JSON object valid against that tool's schema (decoded under the
//! schema's grammar, and checked again against it when parsed); text that is not such a
//! call stays content.

pub(crate) mod anthropic_io;
mod call_block;
pub(crate) mod format;
pub(crate) mod job;
mod key_order;
pub(crate) mod openai_out;
pub(crate) mod prompt;
pub(crate) mod request;
pub(crate) mod split;
pub(crate) mod stream_call;

use serde_json::Value;

/// One function the model may call. Invariant: `name` is 1 to 64 characters of
/// `[A-Za-z0-9_.-]`, unique in its request; `parameters` is a JSON schema object.
#[derive(Clone, Debug)]
pub(crate) struct Tool {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Value,
}

impl Tool {
    /// The tool as OpenAI's `tools` entry (what chat templates read from their `tools`).
    pub fn openai_json(&self) -> Value {
        let mut f = serde_json::json!({"name": self.name, "parameters": self.parameters});
        if let Some(d) = &self.description {
            f["description"] = Value::from(d.as_str());
        }
        serde_json::json!({"type": "function", "function": f})
    }
}

/// Whether and which tool the model must call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    /// Text or calls, as the model chooses (calls are bound by the grammar once opened).
    Auto,
    /// Text only: no call grammar (templates that render tools still see them).
    None,
    /// At least one call, bound from the first token.
    Required,
    /// A call of this tool, bound from the first token.
    Named(String),
}

/// A request's tools. Invariant: `list` is not empty and a `Named` choice names one of it.
#[derive(Clone, Debug)]
pub(crate) struct Tools {
    pub list: Vec<Tool>,
    pub choice: Choice,
    /// Whether the model may make several calls in one answer.
    pub parallel: bool,
    /// The field the request named its tools in (`tools`), for errors.
    pub field: &'static str,
    /// How each tool's schema is named in errors: `tools[{i}]` then this suffix.
    pub schema_suffix: &'static str,
}

impl Tools {
    /// The tools the grammar offers: the named one alone, or all.
    pub fn offered(&self) -> Vec<&Tool> {
        match &self.choice {
            Choice::Named(n) => self.list.iter().filter(|t| &t.name == n).collect(),
            _ => self.list.iter().collect(),
        }
    }
}

/// One call the model made. Invariant: `arguments` is a compact JSON object valid against
/// the named tool's schema.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Call {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A fresh call id: `call_` and 24 random hex digits.
pub(crate) fn call_id() -> String {
    crate::api::new_id("call").replacen('-', "_", 1)
}

/// A fresh Mistral call id: the 9 alphanumerics its templates require.
pub(crate) fn mistral_call_id() -> String {
    call_id().chars().rev().take(9).collect()
}

/// A generated answer split apart.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Reply {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<Call>,
    /// The last call was streamed but not completed (cut short, or its arguments failed
    /// the schema): its arguments are as far as they went, and the answer did not end on
    /// its calls.
    pub incomplete: bool,
}

impl Reply {
    /// Whether the answer ended on complete calls (given the engine stopped it, not the
    /// length limit).
    pub fn ended_on_calls(&self, finish: engram_engine::FinishReason) -> bool {
        !self.calls.is_empty() && !self.incomplete && finish == engram_engine::FinishReason::Stop
    }
}
