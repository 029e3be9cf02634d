//! The prompt side of tool calling: the template's `tools` variable for the families whose
//! templates render tools; for the generic family (templates without tool support), a
//! system message describing the tools and the JSON answer, and the history's tool turns
//! written as the JSON the model answers in.
//!
//! Invariant: an assistant turn's calls render in the history as the model's grammar
//! wrote them (`format.rs`), so a tool loop's prompts extend one another.

use engram_tokenizer::ChatMessage;
use serde_json::{json, Map, Value};

use super::format::Family;
use super::Tools;

/// What the generic family's system message says about `tools`: the same whatever the
/// choice and `parallel_tool_calls` (the grammar enforces those), so a tool loop's prompts
/// extend one another.
pub(crate) fn generic_system_text(tools: &Tools) -> String {
    let list: Vec<String> =
        tools.list.iter().map(|t| json!({"name": t.name, "description": t.description, "parameters": t.parameters}).to_string()).collect();
    let one = "{\"name\":\"<tool name>\",\"arguments\":{<its arguments>}}";
    format!(
        "You can call these tools (each with its name, description and the JSON schema of its arguments):\n{}\n\n\
         Answer with one JSON object: {{\"tool_call\":{one}}} to call a tool, {{\"tool_calls\":[{one}, ...]}} to call several, \
         or {{\"response\":\"<your answer>\"}} to answer the user directly.\n\
         A tool's result comes back as {{\"tool_response\":{{...}}}}.",
        list.join("\n")
    )
}

/// The conversation and template variables for a request's tools under `family`:
/// `kwargs["tools"]` set for the families whose templates render them; for the generic one
/// the tools' system text and the history's tool turns as JSON.
pub(crate) fn prepare(
    family: Family,
    tools: Option<&Tools>,
    messages: Vec<ChatMessage>,
    kwargs: &mut Map<String, Value>,
) -> Vec<ChatMessage> {
    if family.template_renders_tools() {
        if let Some(t) = tools {
            kwargs.insert("tools".into(), Value::Array(t.list.iter().map(|t| t.openai_json()).collect()));
        }
        if family == Family::Hermes {
            return messages;
        }
        // Llama and Mistral templates write arguments with `tojson`: they want objects.
        return messages.into_iter().map(arguments_as_objects).collect();
    }
    let mut out: Vec<ChatMessage> = messages.into_iter().map(generic_turn).collect();
    // Whatever the choice (`none` too), so that a tool loop's prompts extend one another.
    if let Some(t) = tools {
        let text = generic_system_text(t);
        match out.first_mut() {
            Some(m) if m.role == "system" => m.content = format!("{}\n\n{text}", m.content),
            _ => out.insert(0, ChatMessage::new("system", text)),
        }
    }
    out
}

fn arguments_as_objects(mut m: ChatMessage) -> ChatMessage {
    if let Some(Value::Array(calls)) = m.fields.get_mut("tool_calls") {
        for c in calls {
            if let Some(a) = c.pointer_mut("/function/arguments") {
                if let Some(v) = a.as_str().and_then(|s| serde_json::from_str::<Value>(s).ok()) {
                    *a = v;
                }
            }
        }
    }
    m
}

/// One turn for a template without tool support: an assistant's calls as the JSON answer
/// the generic grammar writes; a tool result as a user turn holding `{"tool_response": ...}`.
fn generic_turn(m: ChatMessage) -> ChatMessage {
    if m.role == "tool" {
        let mut r = Map::new();
        for k in ["name", "tool_call_id"] {
            if let Some(v) = m.fields.get(k) {
                r.insert(k.into(), v.clone());
            }
        }
        r.insert("content".into(), Value::from(m.content.as_str()));
        return ChatMessage::new("user", json!({"tool_response": r}).to_string());
    }
    if m.role != "assistant" {
        return m;
    }
    let Some(Value::Array(calls)) = m.fields.get("tool_calls") else {
        return m;
    };
    let one = |c: &Value| {
        let name = c.pointer("/function/name").and_then(Value::as_str).unwrap_or_default();
        let args = match c.pointer("/function/arguments") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => v.to_string(),
            None => "{}".into(),
        };
        format!("{{\"name\":{},\"arguments\":{args}}}", Value::from(name))
    };
    let text = match calls.as_slice() {
        [c] => format!("{{\"tool_call\":{}}}", one(c)),
        cs => format!("{{\"tool_calls\":[{}]}}", cs.iter().map(one).collect::<Vec<_>>().join(",")),
    };
    ChatMessage::new("assistant", text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::{Choice, Tool};

    /// The text each family's grammar writes for a call of `add` with `{"a": 1, "b": "x"}`,
    /// and the template (llama.cpp's copies, GPT-OSS's own) rendering that call back in the
    /// next turn's history: the rendered history holds the call byte for byte.
    #[test]
    fn templates_render_a_call_back_as_the_grammar_wrote_it() {
        let cases = [
            (
                Family::Llama3,
                include_str!("../../tests/it/templates/llama-3.1.jinja"),
                "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": \"x\"}}",
            ),
            (
                Family::Mistral,
                include_str!("../../tests/it/templates/mistral-nemo.jinja"),
                "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": \"x\"}, \"id\": \"abcDEF123\"}]",
            ),
            (
                Family::Harmony,
                include_str!("../../../fixture/src/templates/gpt-oss.jinja"),
                " to=functions.add<|channel|>commentary json<|message|>{\"a\": 1, \"b\": \"x\"}",
            ),
            (
                Family::Hermes,
                include_str!("../../../fixture/src/templates/qwen3.jinja"),
                "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\":1,\"b\":\"x\"}}\n</tool_call>",
            ),
        ];
        for (family, source, written) in cases {
            assert_eq!(Family::detect(source), family);
            let tools = Tools {
                list: vec![Tool { name: "add".into(), description: Some("adds".into()), parameters: json!({"type": "object"}) }],
                choice: Choice::Required,
                parallel: false,
                field: "tools",
                schema_suffix: ".function.parameters",
            };
            let call = json!([{"id": "abcDEF123", "type": "function", "function": {"name": "add", "arguments": "{\"a\":1,\"b\":\"x\"}"}}]);
            let history = vec![
                ChatMessage::new("user", "q"),
                ChatMessage::new("assistant", "").with("tool_calls", call),
                ChatMessage::new("tool", "42").with("tool_call_id", json!("abcDEF123")),
            ];
            let mut kwargs = Map::new();
            let messages = prepare(family, Some(&tools), history, &mut kwargs);
            let template = engram_tokenizer::ChatTemplate::new(source).unwrap();
            let text = template.render_with(&messages, true, "<s>", "</s>", &kwargs).unwrap();
            assert!(text.contains(written), "{family:?}: {written:?} not in\n{text}");
        }
    }

    #[test]
    fn the_generic_family_describes_the_tools_and_writes_calls_as_json() {
        let tools = Tools {
            list: vec![Tool { name: "f".into(), description: Some("does f".into()), parameters: json!({"type": "object"}) }],
            choice: Choice::Auto,
            parallel: false,
            field: "tools",
            schema_suffix: ".function.parameters",
        };
        let call = json!([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"x\":1}"}}]);
        let history = vec![
            ChatMessage::new("user", "q"),
            ChatMessage::new("assistant", "").with("tool_calls", call),
            ChatMessage::new("tool", "42").with("tool_call_id", json!("call_1")),
        ];
        let mut kwargs = Map::new();
        let out = prepare(Family::Generic, Some(&tools), history, &mut kwargs);
        assert!(kwargs.is_empty());
        assert_eq!(out[0].role, "system");
        assert!(out[0].content.contains("does f") && out[0].content.contains("\"response\""), "{}", out[0].content);
        assert_eq!(out[2].content, "{\"tool_call\":{\"name\":\"f\",\"arguments\":{\"x\":1}}}");
        assert_eq!(out[3].role, "user");
        assert_eq!(out[3].content, "{\"tool_response\":{\"tool_call_id\":\"call_1\",\"content\":\"42\"}}");
    }
}
