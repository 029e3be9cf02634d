//! A request's `tools` and `tool_choice`, in OpenAI's, Anthropic's and Ollama's
//! spellings, checked into [`Tools`]; and the tool turns of a conversation's history
//! checked (each tool result answers a call made earlier).
//!
//! Invariant: whatever is wrong is a 400 naming the field (`tools[1].function.name`,
//! `tool_choice.function.name`, `messages[3].tool_call_id`), found before anything is
//! rendered or queued.

use std::collections::HashSet;

use engram_tokenizer::ChatMessage;
use serde_json::{Map, Value};

use super::{Choice, Tool, Tools};
use crate::error::ApiError;

/// At most this many tools in one request.
pub(crate) const MAX_TOOLS: usize = 128;

/// Whether `v` asks for nothing (absent, `null`, `[]`): clients often send those.
fn empty(v: &Option<Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Array(a)) => a.is_empty(),
        _ => false,
    }
}

fn check_name(field: &str, name: Option<&Value>, seen: &mut HashSet<String>) -> Result<String, ApiError> {
    let Some(name) = name.and_then(Value::as_str) else {
        return Err(ApiError::bad_param(field, format!("{field}: a string is required")));
    };
    let ok = !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if !ok {
        return Err(ApiError::bad_param(field, format!("{field}: {name:?} is not 1 to 64 characters of A-Z a-z 0-9 _ - .")));
    }
    if !seen.insert(name.to_string()) {
        return Err(ApiError::bad_param(field, format!("{field}: the tool name {name:?} appears twice")));
    }
    Ok(name.to_string())
}

fn description(field: &str, v: Option<&Value>) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_param(field, format!("{field} must be a string"))),
    }
}

fn schema(field: &str, v: Option<&Value>) -> Result<Value, ApiError> {
    match v {
        // OpenAI's default: a function without parameters takes an empty object.
        None | Some(Value::Null) => Ok(serde_json::json!({"type": "object", "properties": {}})),
        Some(v @ Value::Object(_)) => Ok(v.clone()),
        Some(_) => Err(ApiError::bad_param(field, format!("{field} must be a JSON schema object"))),
    }
}

fn list<'a>(field: &str, v: &'a Value) -> Result<&'a Vec<Value>, ApiError> {
    let Some(a) = v.as_array() else { return Err(ApiError::bad_param(field, format!("{field} must be a list of tools"))) };
    if a.len() > MAX_TOOLS {
        return Err(ApiError::bad_param(field, format!("{field}: at most {MAX_TOOLS} tools, got {}", a.len())));
    }
    Ok(a)
}

fn object<'a>(field: &str, v: &'a Value) -> Result<&'a Map<String, Value>, ApiError> {
    v.as_object().ok_or_else(|| ApiError::bad_param(field, format!("{field} must be an object")))
}

/// OpenAI's `tools` (`[{"type":"function","function":{name, description, parameters}}]`),
/// `tool_choice` (`auto`, `none`, `required`, `{"type":"function","function":{"name"}}`)
/// and `parallel_tool_calls`. `None`: no tools (a `tool_choice` that needs one is a 400).
pub(crate) fn openai(tools: Option<Value>, choice: Option<Value>, parallel: Option<Value>) -> Result<Option<Tools>, ApiError> {
    let choice = match &choice {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => Choice::Auto,
            "none" => Choice::None,
            "required" => Choice::Required,
            other => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    format!("tool_choice must be \"auto\", \"none\", \"required\" or a named function, got {other:?}"),
                ))
            }
        }),
        Some(v @ Value::Object(o)) => {
            if o.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::bad_param("tool_choice.type", "tool_choice.type must be \"function\""));
            }
            let name = v
                .pointer("/function/name")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::bad_param("tool_choice.function.name", "tool_choice.function.name: a string is required"))?;
            Some(Choice::Named(name.to_string()))
        }
        Some(_) => return Err(ApiError::bad_param("tool_choice", "tool_choice must be a string or an object")),
    };
    let parallel = match parallel {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => b,
        Some(_) => return Err(ApiError::bad_param("parallel_tool_calls", "parallel_tool_calls must be a boolean")),
    };
    if empty(&tools) {
        return no_tools(choice, "tool_choice.function.name");
    }
    let tools = tools.unwrap_or_default();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, t) in list("tools", &tools)?.iter().enumerate() {
        let t = object(&format!("tools[{i}]"), t)?;
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(ApiError::bad_param(&format!("tools[{i}].type"), format!("tools[{i}].type must be \"function\"")));
        }
        let f = object(&format!("tools[{i}].function"), t.get("function").unwrap_or(&Value::Null))?;
        out.push(Tool {
            name: check_name(&format!("tools[{i}].function.name"), f.get("name"), &mut seen)?,
            description: description(&format!("tools[{i}].function.description"), f.get("description"))?,
            parameters: schema(&format!("tools[{i}].function.parameters"), f.get("parameters"))?,
        });
    }
    finish(out, choice.unwrap_or(Choice::Auto), parallel, "tool_choice.function.name", ".function.parameters")
}

/// Anthropic's `tools` (`[{name, description, input_schema}]`) and `tool_choice`
/// (`{"type": "auto" | "any" | "tool" | "none", "name", "disable_parallel_tool_use"}`).
pub(crate) fn anthropic(tools: Option<Value>, choice: Option<Value>) -> Result<Option<Tools>, ApiError> {
    let (choice, parallel) = match &choice {
        None | Some(Value::Null) => (None, true),
        Some(Value::Object(o)) => {
            let parallel = !o.get("disable_parallel_tool_use").and_then(Value::as_bool).unwrap_or(false);
            let c = match o.get("type").and_then(Value::as_str) {
                Some("auto") => Choice::Auto,
                Some("none") => Choice::None,
                Some("any") => Choice::Required,
                Some("tool") => Choice::Named(
                    o.get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| ApiError::bad_param("tool_choice.name", "tool_choice.name: a string is required"))?
                        .to_string(),
                ),
                _ => {
                    return Err(ApiError::bad_param("tool_choice.type", "tool_choice.type must be \"auto\", \"any\", \"tool\" or \"none\""))
                }
            };
            (Some(c), parallel)
        }
        Some(_) => return Err(ApiError::bad_param("tool_choice", "tool_choice must be an object with a `type`")),
    };
    if empty(&tools) {
        return no_tools(choice, "tool_choice.name");
    }
    let tools = tools.unwrap_or_default();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (i, t) in list("tools", &tools)?.iter().enumerate() {
        let t = object(&format!("tools[{i}]"), t)?;
        if let Some(kind) = t.get("type").and_then(Value::as_str).filter(|k| *k != "custom") {
            return Err(ApiError::bad_param(
                &format!("tools[{i}].type"),
                format!("tools[{i}].type {kind:?}: only client tools (with an input_schema) are supported"),
            ));
        }
        out.push(Tool {
            name: check_name(&format!("tools[{i}].name"), t.get("name"), &mut seen)?,
            description: description(&format!("tools[{i}].description"), t.get("description"))?,
            parameters: schema(&format!("tools[{i}].input_schema"), t.get("input_schema"))?,
        });
    }
    finish(out, choice.unwrap_or(Choice::Auto), parallel, "tool_choice.name", ".input_schema")
}

/// Ollama's `tools` (OpenAI's shape); the model chooses (`auto`).
pub(crate) fn ollama(tools: Option<Value>) -> Result<Option<Tools>, ApiError> {
    openai(tools, None, None)
}

/// Ollama's assistant `tool_calls` (`[{"function": {"name", "arguments": {..}}}]`, ids
/// optional) in OpenAI's shape, each with an id (made up where missing) and its arguments
/// as a JSON string.
pub(crate) fn ollama_calls(i: usize, calls: &Value) -> Result<Vec<Value>, ApiError> {
    let f = format!("messages[{i}].tool_calls");
    let Some(calls) = calls.as_array() else { return Err(ApiError::bad_param(&f, format!("{f} must be a list"))) };
    let mut out = Vec::new();
    for (j, c) in calls.iter().enumerate() {
        let name = c.pointer("/function/name").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_param(&format!("{f}[{j}].function.name"), format!("{f}[{j}].function.name: a string is required"))
        })?;
        let args = match c.pointer("/function/arguments") {
            Some(Value::String(s)) => s.clone(),
            Some(v @ Value::Object(_)) => v.to_string(),
            None | Some(Value::Null) => "{}".into(),
            Some(_) => {
                return Err(ApiError::bad_param(
                    &format!("{f}[{j}].function.arguments"),
                    format!("{f}[{j}].function.arguments must be an object"),
                ))
            }
        };
        let id = c.get("id").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| format!("call_{i}_{j}"));
        out.push(serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}));
    }
    Ok(out)
}

fn no_tools(choice: Option<Choice>, name_field: &str) -> Result<Option<Tools>, ApiError> {
    match choice {
        Some(Choice::Required) => Err(ApiError::bad_param("tool_choice", "tool_choice asks for a call, but the request has no tools")),
        Some(Choice::Named(n)) => {
            Err(ApiError::bad_param(name_field, format!("{name_field}: no tool named {n:?} (the request has no tools)")))
        }
        _ => Ok(None),
    }
}

fn finish(
    list: Vec<Tool>,
    choice: Choice,
    parallel: bool,
    name_field: &str,
    schema_suffix: &'static str,
) -> Result<Option<Tools>, ApiError> {
    if let Choice::Named(n) = &choice {
        if !list.iter().any(|t| &t.name == n) {
            let names: Vec<&str> = list.iter().map(|t| t.name.as_str()).collect();
            return Err(ApiError::bad_param(name_field, format!("{name_field}: no tool named {n:?} (the tools: {})", names.join(", "))));
        }
    }
    Ok(Some(Tools { list, choice, parallel, field: "tools", schema_suffix }))
}

/// Checks the tool turns of a conversation: each `tool` message carries a
/// `tool_call_id` that an earlier assistant message's `tool_calls` made, and each of
/// those calls has an `id`, a function `name` and `arguments`.
pub(crate) fn check_history(messages: &[ChatMessage]) -> Result<(), ApiError> {
    let mut made: HashSet<String> = HashSet::new();
    for (i, m) in messages.iter().enumerate() {
        if let Some(calls) = m.fields.get("tool_calls") {
            let Some(calls) = calls.as_array() else {
                return Err(ApiError::bad_param(&format!("messages[{i}].tool_calls"), format!("messages[{i}].tool_calls must be a list")));
            };
            for (j, c) in calls.iter().enumerate() {
                let f = format!("messages[{i}].tool_calls[{j}]");
                let id = c
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| ApiError::bad_param(&format!("{f}.id"), format!("{f}.id: a string is required")))?;
                if c.pointer("/function/name").and_then(Value::as_str).is_none() {
                    return Err(ApiError::bad_param(&format!("{f}.function.name"), format!("{f}.function.name: a string is required")));
                }
                match c.pointer("/function/arguments") {
                    Some(Value::String(_) | Value::Object(_)) => {}
                    _ => {
                        return Err(ApiError::bad_param(
                            &format!("{f}.function.arguments"),
                            format!("{f}.function.arguments must be a JSON string"),
                        ))
                    }
                }
                made.insert(id.to_string());
            }
        }
        if m.role == "tool" {
            let f = format!("messages[{i}].tool_call_id");
            match m.fields.get("tool_call_id").and_then(Value::as_str) {
                None => return Err(ApiError::bad_param(&f, format!("{f}: a tool message answers a call; its id is required"))),
                Some(id) if !made.contains(id) => {
                    return Err(ApiError::bad_param(&f, format!("{f}: no earlier assistant message made a call with id {id:?}")))
                }
                Some(_) => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn param(e: ApiError) -> String {
        e.param.unwrap_or_default()
    }

    #[test]
    fn openai_tools_are_checked_field_by_field() {
        let t = |tools: Value| openai(Some(tools), None, None);
        assert_eq!(param(t(json!({"a": 1})).unwrap_err()), "tools");
        assert_eq!(param(t(json!([{"type": "function", "function": {"name": "a"}}, 3])).unwrap_err()), "tools[1]");
        assert_eq!(param(t(json!([{"type": "x"}])).unwrap_err()), "tools[0].type");
        let two = json!([{"type": "function", "function": {"name": "a"}}, {"type": "function", "function": {"name": "a"}}]);
        assert_eq!(param(t(two).unwrap_err()), "tools[1].function.name");
        let bad = json!([{"type": "function", "function": {"name": "a", "parameters": 3}}]);
        assert_eq!(param(t(bad).unwrap_err()), "tools[0].function.parameters");
        let ok = t(json!([{"type": "function", "function": {"name": "a"}}])).unwrap().unwrap();
        assert_eq!(ok.choice, Choice::Auto);
        assert!(ok.parallel);
        let named = openai(
            Some(json!([{"type": "function", "function": {"name": "a"}}])),
            Some(json!({"type": "function", "function": {"name": "b"}})),
            None,
        );
        assert_eq!(param(named.unwrap_err()), "tool_choice.function.name");
        assert!(openai(None, Some(json!("none")), None).unwrap().is_none());
        assert_eq!(param(openai(None, Some(json!("required")), None).unwrap_err()), "tool_choice");
    }

    #[test]
    fn a_tool_result_must_answer_an_earlier_call() {
        let call = json!([{"id": "call_1", "type": "function", "function": {"name": "a", "arguments": "{}"}}]);
        let ok = [
            ChatMessage::new("user", "q"),
            ChatMessage::new("assistant", "").with("tool_calls", call),
            ChatMessage::new("tool", "r").with("tool_call_id", json!("call_1")),
        ];
        check_history(&ok).unwrap();
        let orphan = [ChatMessage::new("user", "q"), ChatMessage::new("tool", "r").with("tool_call_id", json!("call_1"))];
        assert_eq!(param(check_history(&orphan).unwrap_err()), "messages[1].tool_call_id");
        let bare = [ChatMessage::new("user", "q"), ChatMessage::new("tool", "r")];
        assert_eq!(param(check_history(&bare).unwrap_err()), "messages[1].tool_call_id");
    }
}
