//! The call syntax of a chat template's family, detected from the template's source, and
//! the grammar (llguidance's Lark, each tool's arguments a `%json` of its schema) that
//! binds a call to it:
//!
//! | family | detected by | a call | with `auto` |
//! |---|---|---|---|
//! | Hermes / Qwen | `<tool_call>` | `<tool_call>\n{"name": "f", "arguments": {..}}\n</tool_call>` | lazy, from `<tool_call>` |
//! | Llama 3.x | `<\|python_tag\|>` or `ipython` | `{"name": "f", "parameters": {..}}`, or after `<\|python_tag\|>` that or a built-in's `brave_search.call(query="..")` | lazy, from `{"name"` or `<\|python_tag\|>` |
//! | Mistral | `[TOOL_CALLS]` | `[TOOL_CALLS][{"name": "f", "arguments": {..}}]` | lazy, from `[TOOL_CALLS]` |
//! | GPT-OSS harmony | `<\|channel\|>` | ` to=functions.f<\|channel\|>commentary json<\|message\|>{..}` | lazy, from `to=functions.` |
//! | generic | anything else | `{"tool_call":{"name":"f","arguments":{..}}}` (`tool_calls`: a list) | bound: that or `{"response":".."}` |
//!
//! A family's markers that are special tokens of the vocabulary (harmony's `<|channel|>`,
//! `<|message|>`) are written in the grammar as those tokens (`<[id]>`), as the template
//! renders them in a later turn; the decoder shows them in the answer's text.
//!
//! The template families render the tools themselves (their `tools` variable); the
//! generic one gets them described in a system message ([`super::prompt`]) whatever the
//! choice, and with `none` its answer is bound to `{"response":".."}`.
//!
//! Invariant: the grammar's calls are byte for byte what the family's template renders
//! for the same call in a later turn's history, so a tool loop's next prompt extends this
//! one's cached tokens: the arguments as compact JSON where the template writes the
//! arguments' string as is (Hermes/Qwen, generic), as `tojson` writes them where the
//! template re-encodes them (Llama, Mistral, harmony: Python's `", "` and `": "`), and
//! Mistral's call ids, which its template writes after each call, chosen before decoding
//! and written by the grammar.

use std::sync::Arc;

use engram_engine::{Grammar, GrammarCompiler};
use serde_json::Value;

use super::{Choice, Tools};
use crate::error::ApiError;

/// The largest grammar a request may build, in bytes of Lark source.
pub(crate) const MAX_GRAMMAR_BYTES: usize = 256 << 10;

/// How a chat template's model writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    Hermes,
    Llama3,
    Mistral,
    Harmony,
    Generic,
}

impl Family {
    /// The family of a chat template, from its source.
    pub fn detect(template: &str) -> Family {
        if template.contains("<|channel|>") && template.contains("<|message|>") {
            Family::Harmony
        } else if template.contains("<tool_call>") {
            Family::Hermes
        } else if template.contains("[TOOL_CALLS]") {
            Family::Mistral
        } else if template.contains("<|python_tag|>") || (template.contains("<|start_header_id|>") && template.contains("ipython")) {
            Family::Llama3
        } else {
            Family::Generic
        }
    }

    /// The texts that open a call in the answer's text, as the splitter reads it (with
    /// their special tokens shown).
    pub fn text_triggers(self) -> &'static [&'static str] {
        match self {
            Family::Hermes => &["<tool_call>"],
            Family::Llama3 => &["{\"name\"", "<|python_tag|>"],
            Family::Mistral => &["[TOOL_CALLS]"],
            Family::Harmony => &["to=functions."],
            Family::Generic => &[],
        }
    }

    /// The family's marker that is a special token in some vocabularies (Mistral's
    /// `[TOOL_CALLS]`, Llama's `<|python_tag|>`): with such a vocabulary it arms a lazy
    /// grammar by its id and the answer's text shows it.
    pub fn marker_token(self) -> Option<&'static str> {
        match self {
            Family::Mistral => Some("[TOOL_CALLS]"),
            Family::Llama3 => Some("<|python_tag|>"),
            _ => None,
        }
    }

    /// The text that opens a call in free text (`None`: the generic family's answer is
    /// always bound to JSON).
    pub fn trigger(self) -> Option<&'static str> {
        match self {
            Family::Hermes => Some("<tool_call>"),
            Family::Llama3 => Some("{\"name\""),
            Family::Mistral => Some("[TOOL_CALLS]"),
            Family::Harmony => Some("to=functions."),
            Family::Generic => None,
        }
    }

    /// Whether the family's template renders the request's tools itself.
    pub fn template_renders_tools(self) -> bool {
        self != Family::Generic
    }

    /// How the family's template writes a call's arguments in the history: with `tojson`
    /// (Llama, Mistral, harmony: the server hands them the arguments as an object) or as
    /// the string the model wrote.
    fn args_text(self) -> JsonText {
        match self {
            Family::Llama3 | Family::Mistral | Family::Harmony => JsonText::ToJson,
            Family::Hermes | Family::Generic => JsonText::Compact,
        }
    }

    /// Whether this family's syntax lets one answer hold several calls (a harmony call ends
    /// the answer with `<|call|>`).
    fn parallel(self) -> bool {
        !matches!(self, Family::Llama3 | Family::Harmony)
    }

    /// The section of an answer a lazy trigger is not watched in (reasoning), given whether
    /// the template has a `<think>` section.
    pub fn quiet(self, think: bool) -> Option<(&'static str, &'static str)> {
        match self {
            Family::Harmony => Some(("<|channel|>analysis", "<|end|>")),
            _ if think => Some(("<think>", "</think>")),
            _ => None,
        }
    }
}

/// A Lark string literal of `s`.
fn lit(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_default()
}

/// How the grammar writes JSON.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum JsonText {
    /// No whitespace between tokens.
    Compact,
    /// As the chat templates' `tojson` (Python's `json.dumps` with `ensure_ascii=False`)
    /// writes it: `", "` between items, `": "` after keys, no `\u` escapes.
    ToJson,
}

/// `schema` as a `%json` literal written as `text` says (an `x-guidance` of the schema's
/// own wins).
fn json_of(schema: &Value, text: JsonText) -> String {
    let mut schema = schema.clone();
    if schema.is_object() && schema.get("x-guidance").is_none() {
        schema["x-guidance"] = match text {
            JsonText::Compact => serde_json::json!({"whitespace_flexible": false}),
            JsonText::ToJson => serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ",
                                                    "json_allowed_escapes": "nrbtf\"\\"}),
        };
    }
    format!("%json {schema}")
}

/// How many calls one Mistral answer may hold: each has its own id in the grammar.
pub(crate) const MAX_MISTRAL_CALLS: usize = 8;

/// Ids for a Mistral answer's calls, in order (`parallel` gives room for several), drawn
/// from `conversation` (a hash of the request's messages and tools): the same request
/// decodes the same (a seeded answer repeats, a retry reuses its cache), a later turn gets
/// other ids.
fn mistral_ids(parallel: bool, conversation: &[u8; 32]) -> Vec<String> {
    const ALNUM: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut bytes = blake3::Hasher::new_derive_key("engram mistral call ids");
    bytes.update(conversation);
    let mut reader = bytes.finalize_xof();
    (0..if parallel { MAX_MISTRAL_CALLS } else { 1 })
        .map(|_| {
            let mut b = [0u8; 9];
            reader.fill(&mut b);
            b.iter().map(|&x| ALNUM[x as usize % ALNUM.len()] as char).collect()
        })
        .collect()
}

/// Which of a family's markers are special tokens: the marker's text → its id.
pub(crate) type Specials<'a> = &'a dyn Fn(&str) -> Option<u32>;

/// Marker `m` in Lark: its special token (`<[id]>`) or its text.
fn marker(special: Specials, m: &str) -> String {
    match special(m) {
        Some(id) => format!("<[{id}]>"),
        None => lit(m),
    }
}

/// The Lark grammar of an answer that is calls only (the choice `required` or a named
/// tool; with `auto` the same grammar is made lazy). The generic family's `auto` answer
/// may instead be `{"response": "<text>"}`. `ids`: Mistral's call ids, one per call the
/// answer may hold (see [`mistral_ids`]).
pub(crate) fn lark(family: Family, tools: &Tools, special: Specials, ids: &[String]) -> String {
    let offered = tools.offered();
    let parallel = tools.parallel && family.parallel();
    let args = family.args_text();
    let mut g = String::new();
    // One rule per tool: the call's text after the family's opening.
    for (i, t) in offered.iter().enumerate() {
        let (head, sep) = match family {
            Family::Hermes => (format!("{{\"name\": \"{}\", \"arguments\": ", t.name), "}"),
            // The call's end, with its id, comes in its place in the list (`c0`, `c1`, ..).
            Family::Mistral => {
                g.push_str(&format!(
                    "t{i}: {} {}\n",
                    lit(&format!("{{\"name\": \"{}\", \"arguments\": ", t.name)),
                    json_of(&t.parameters, args)
                ));
                continue;
            }
            Family::Llama3 => (format!("{{\"name\": \"{}\", \"parameters\": ", t.name), "}"),
            Family::Generic => (format!("{{\"name\":\"{}\",\"arguments\":", t.name), "}"),
            Family::Harmony => {
                // The header after the name: the template's own (`<|channel|>commentary
                // json<|message|>`) when bound from the start; what else GPT-OSS writes once
                // it opened a call itself (the channel before the recipient, `<|constrain|>`).
                let (channel, message) = (marker(special, "<|channel|>"), marker(special, "<|message|>"));
                let header = if tools.choice == Choice::Auto {
                    let constrain = marker(special, "<|constrain|>");
                    format!("({channel} \"commentary\")? (\" json\" | \" \" {constrain} \"json\")? {message}")
                } else {
                    format!("{channel} \"commentary json\" {message}")
                };
                g.push_str(&format!("t{i}: {} {header} {}\n", lit(&t.name), json_of(&t.parameters, args)));
                continue;
            }
        };
        g.push_str(&format!("t{i}: {} {} {}\n", lit(&head), json_of(&t.parameters, args), lit(sep)));
    }
    let alts: Vec<String> = (0..offered.len()).map(|i| format!("t{i}")).collect();
    g.push_str(&format!("one: {}\n", alts.join(" | ")));
    let start = match family {
        Family::Hermes => {
            g.push_str(&format!("call: {} one {}\n", lit("<tool_call>\n"), lit("\n</tool_call>")));
            if parallel { "call (\"\\n\" call)*" } else { "call" }.to_string()
        }
        // `<|python_tag|>` before the call when it is a special token (Llama 3.2 writes it),
        // and after it a built-in tool's `name.call(key=value, ..)`.
        Family::Llama3 => match special("<|python_tag|>") {
            Some(id) => {
                let builtins = builtin_rules(&offered, args);
                g.push_str(&builtins.join(""));
                let alts: Vec<String> = (0..builtins.len()).map(|i| format!(" | <[{id}]> b{i}")).collect();
                format!("one | <[{id}]> one{}", alts.concat())
            }
            None => "one".to_string(),
        },
        // Bound from the start the answer follows the prompt's `<|start|>assistant`; lazy, the
        // grammar's text starts at its trigger.
        Family::Harmony if tools.choice == Choice::Auto => format!("{} one", lit("to=functions.")),
        Family::Harmony => format!("{} one", lit(" to=functions.")),
        // Each call in the list ends with its own id, as the template writes it back:
        // `c0 (", " c1 (", " c2 ..)?)?`.
        Family::Mistral => {
            let n = if parallel { ids.len().max(1) } else { 1 };
            let mut list = String::new();
            for k in (0..n).rev() {
                let end = match ids.get(k) {
                    Some(id) => format!(", \"id\": \"{id}\"}}"),
                    None => "}".to_string(),
                };
                g.push_str(&format!("c{k}: one {}\n", lit(&end)));
                list = if list.is_empty() { format!("c{k}") } else { format!("c{k} ({} {list})?", lit(", ")) };
            }
            format!("{} {} {list} {}", marker(special, "[TOOL_CALLS]"), lit("["), lit("]"))
        }
        Family::Generic => {
            let calls = if parallel {
                format!("{} one (\",\" one)* {}", lit("{\"tool_calls\":["), lit("]}"))
            } else {
                format!("{} one {}", lit("{\"tool_call\":"), lit("}"))
            };
            if tools.choice == Choice::Auto {
                g.push_str(&format!("response: {}\n", json_of(&response_schema(), JsonText::Compact)));
                format!("{calls} | response")
            } else {
                calls
            }
        }
    };
    format!("start: {start}\n{g}")
}

/// Llama 3.1's built-in tools, called after `<|python_tag|>` as `name.call(key=value, ..)`.
const LLAMA_BUILTINS: [&str; 2] = ["brave_search", "wolfram_alpha"];

/// The Lark rules `b0`, `b1`, .. of the offered built-in tools' `name.call(..)` form: the
/// schema's properties in its order, each `key=` and JSON of its schema; only for a schema
/// whose properties are all required (their order is then fixed) and that refers to no
/// definitions.
fn builtin_rules(offered: &[&super::Tool], text: JsonText) -> Vec<String> {
    let mut rules = Vec::new();
    for t in offered.iter().filter(|t| LLAMA_BUILTINS.contains(&t.name.as_str())) {
        let Some(props) = t.parameters.get("properties").and_then(Value::as_object) else { continue };
        let required: Vec<&str> =
            t.parameters.get("required").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).collect();
        if props.is_empty() || props.keys().any(|k| !required.contains(&k.as_str())) || t.parameters.to_string().contains("$ref") {
            continue;
        }
        let args: Vec<String> = props.iter().map(|(k, v)| format!("{} {}", lit(&format!("{k}=")), json_of(v, text))).collect();
        rules.push(format!("b{}: {} {} {}\n", rules.len(), lit(&format!("{}.call(", t.name)), args.join(" \", \" "), lit(")")));
    }
    rules
}

/// The generic family's text answer: `{"response": "<text>"}`.
fn response_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"], "additionalProperties": false})
}

/// The grammar a request's answer decodes under, compiled: `None` for the choice `none`
/// (the generic family: its text answer's JSON); lazy (from the family's trigger) for `auto`
/// in a template family, the trigger not watched inside the family's reasoning section
/// (`<think>…</think>` when the template has one: `think`); bound from the first token
/// otherwise. `special` names the family's markers that are special tokens. Also each offered tool's arguments grammar, to check calls parsed from
/// text against. A schema that does not compile is a 400 naming it
/// (`tools[1].function.parameters`); so is a grammar over [`MAX_GRAMMAR_BYTES`].
pub(crate) fn compile(
    c: &GrammarCompiler,
    family: Family,
    think: Think,
    tools: &Tools,
    special: Specials,
    conversation: &[u8; 32],
) -> Result<Compiled, ApiError> {
    let Think { section: think, before_calls } = think;
    let mut args = Vec::new();
    for (i, t) in tools.list.iter().enumerate() {
        let field = format!("{}[{i}]{}", tools.field, tools.schema_suffix);
        let g = c
            .json_schema(t.parameters.clone())
            .map_err(|e| ApiError::bad_param(&field, format!("{field}: the schema does not compile: {e}")))?;
        args.push(ArgsGrammar { name: t.name.clone(), schema: t.parameters.clone(), grammar: g });
    }
    let ids = if family == Family::Mistral { mistral_ids(tools.parallel, conversation) } else { Vec::new() };
    // A call the request requires may follow reasoning: an optional `<think>…</think>` leads
    // the calls; a prompt that opened the section starts in it, one that closed it (thinking
    // turned off) with the calls.
    let think_first = think && before_calls && family != Family::Harmony && matches!(tools.choice, Choice::Required | Choice::Named(_));
    let source = match (&tools.choice, family) {
        // `none` with the generic prompt (which still describes the tools, so the prompt and
        // its cache stay the same whatever the choice): the text answer's JSON only.
        (Choice::None, Family::Generic) => format!("start: {}\n", json_of(&response_schema(), JsonText::Compact)),
        (Choice::None, _) => return Ok(Compiled { grammar: None, args, ids: Vec::new() }),
        _ => lark(family, tools, special, &ids),
    };
    if source.len() > MAX_GRAMMAR_BYTES {
        return Err(ApiError::bad_param(
            tools.field,
            format!("{}: the tools' grammar is {} bytes; at most {MAX_GRAMMAR_BYTES}", tools.field, source.len()),
        ));
    }
    let compile = |source: &str| {
        c.lark(source).map_err(|e| ApiError::bad_param(tools.field, format!("{}: the tools' grammar does not compile: {e}", tools.field)))
    };
    let g = if think_first {
        let (open, inside) = reasoning_first(&source, special);
        compile(&open)?.after_prompt(THINK.0, THINK.1, compile(&inside)?.as_ref(), compile(&source)?.as_ref())
    } else {
        compile(&source)?
    };
    let g = match (&tools.choice, family.trigger()) {
        (Choice::Auto, Some(trigger)) => {
            // A marker that is a special token arms the grammar by its id; Mistral's is its
            // only trigger, Llama's comes beside the text `{"name"`.
            let g = match (family, family.marker_token().and_then(special)) {
                (Family::Mistral, Some(id)) => g.lazy_on_tokens(&[id]),
                (_, Some(id)) => g.lazy(trigger).lazy_on_tokens(&[id]),
                (_, None) => g.lazy(trigger),
            };
            match family.quiet(think) {
                Some((open, close)) => g.quiet_between(open, close),
                None => g,
            }
        }
        _ => g,
    };
    Ok(Compiled { grammar: Some(g), args, ids })
}

/// A template's reasoning section.
const THINK: (&str, &str) = ("<think>", "</think>");

/// What a request's template and request say about reasoning.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Think {
    /// The template has a `<think>` section.
    pub section: bool,
    /// The request turned thinking on (`enable_thinking: true`): a call it requires may
    /// follow reasoning.
    pub before_calls: bool,
}

/// Grammar `source` (`start: ..` first) with an optional reasoning section before its
/// answer, and the same for a sequence already inside the section (its prompt opened it).
fn reasoning_first(source: &str, special: Specials) -> (String, String) {
    let (start, rules) = source.split_once('\n').unwrap_or((source, ""));
    let answer = start.strip_prefix("start: ").unwrap_or(start);
    let rules = format!("{rules}reasoning: reasoning_text /[ \\t\\n]*/\nreasoning_text[suffix={}]: /(?s:.*)/\n", lit(THINK.1));
    (format!("start: ({} reasoning)? ({answer})\n{rules}", marker(special, THINK.0)), format!("start: reasoning ({answer})\n{rules}"))
}

/// A request's compiled tool grammars.
pub(crate) struct Compiled {
    /// What the answer decodes under (`None`: free).
    pub grammar: Option<Arc<Grammar>>,
    /// Each tool's arguments grammar, to check calls parsed from text against.
    pub args: Vec<ArgsGrammar>,
    /// Mistral's call ids, in the order the grammar writes them (empty for the others).
    pub ids: Vec<String>,
}

/// One tool's arguments: its schema and the grammar compiled from it.
#[derive(Clone)]
pub(crate) struct ArgsGrammar {
    pub name: String,
    pub schema: Value,
    pub grammar: Arc<Grammar>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::Tool;

    fn tools(choice: Choice, parallel: bool) -> Tools {
        let t = |n: &str| Tool { name: n.into(), description: None, parameters: serde_json::json!({"type": "object"}) };
        Tools { list: vec![t("a"), t("b")], choice, parallel, field: "tools", schema_suffix: ".function.parameters" }
    }

    #[test]
    fn families_are_told_apart_by_their_templates() {
        assert_eq!(Family::detect("{%- if tools %}<tools>{{ tool | tojson }}</tools> <tool_call>{%- endif %}"), Family::Hermes);
        let chatml = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}{% endfor %}";
        assert_eq!(Family::detect(chatml), Family::Generic);
        assert_eq!(Family::detect("{{ '<|python_tag|>' }}"), Family::Llama3);
        assert_eq!(Family::detect("[TOOL_CALLS]"), Family::Mistral);
        assert_eq!(Family::detect("{{- \"<|start|>assistant<|channel|>final<|message|>\" + message.content }}"), Family::Harmony);
    }

    #[test]
    fn llama_built_ins_have_their_call_form_after_the_python_tag() {
        let schema = serde_json::json!({"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]});
        let t = |n: &str| Tool { name: n.into(), description: None, parameters: schema.clone() };
        let tools = Tools {
            list: vec![t("brave_search"), t("mine")],
            choice: Choice::Required,
            parallel: false,
            field: "tools",
            schema_suffix: "",
        };
        let g = lark(Family::Llama3, &tools, &|m: &str| (m == "<|python_tag|>").then_some(9), &[]);
        assert!(g.contains("<[9]> b0") && g.contains("brave_search.call(") && !g.contains("mine.call("), "{g}");
        assert!(!lark(Family::Llama3, &tools, &|_| None, &[]).contains(".call("));
    }

    #[test]
    fn harmony_markers_that_are_special_tokens_are_written_as_tokens() {
        let special = |m: &str| (m == "<|message|>").then_some(7);
        let g = lark(Family::Harmony, &tools(Choice::Required, false), &special, &[]);
        assert!(g.contains("<[7]>") && g.contains("\"<|channel|>\"") && g.contains("\" to=functions.\""), "{g}");
    }

    #[test]
    fn templates_that_reencode_arguments_get_them_as_tojson_writes_them() {
        for (family, python) in
            [(Family::Llama3, true), (Family::Mistral, true), (Family::Harmony, true), (Family::Hermes, false), (Family::Generic, false)]
        {
            let g = lark(family, &tools(Choice::Required, false), &|_| None, &["abcdefghi".into()]);
            assert_eq!(g.contains("\"item_separator\":\", \""), python, "{family:?}: {g}");
            assert!(g.contains("\"whitespace_flexible\":false"), "{family:?}: {g}");
        }
    }

    #[test]
    fn mistral_calls_end_with_the_ids_chosen_for_them_in_order() {
        let ids: Vec<String> = (0..3).map(|i| format!("id{i}id{i}id{i}")).collect();
        let g = lark(Family::Mistral, &tools(Choice::Required, true), &|_| None, &ids);
        for (k, id) in ids.iter().enumerate() {
            assert!(g.contains(&format!("c{k}: one \", \\\"id\\\": \\\"{id}\\\"}}\"")), "{g}");
        }
        assert!(g.contains("\"[\" c0 (\", \" c1 (\", \" c2)?)? \"]\""), "{g}");
        let one = lark(Family::Mistral, &tools(Choice::Required, false), &|_| None, &ids);
        assert!(one.contains("\"[\" c0 \"]\"") && !one.contains("c1"), "{one}");
        let (a, b) = ([1u8; 32], [2u8; 32]);
        assert_eq!(mistral_ids(true, &a).len(), MAX_MISTRAL_CALLS);
        assert_eq!(mistral_ids(true, &a), mistral_ids(true, &a), "the same request, the same ids");
        assert_ne!(mistral_ids(false, &a), mistral_ids(false, &b));
        let ids = mistral_ids(true, &b);
        assert!(ids.iter().all(|id| id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric())), "{ids:?}");
        assert_eq!(ids.iter().collect::<std::collections::HashSet<_>>().len(), ids.len(), "{ids:?}");
    }

    #[test]
    fn reasoning_may_lead_a_bound_answer() {
        let (open, inside) = reasoning_first("start: call\ncall: \"x\"\n", &|_| None);
        assert!(open.starts_with("start: (\"<think>\" reasoning)? (call)\n"), "{open}");
        assert!(inside.starts_with("start: reasoning (call)\n"), "{inside}");
        assert!(open.contains("call: \"x\"") && open.contains("suffix=\"</think>\""), "{open}");
    }

    #[test]
    fn the_grammar_offers_the_named_tool_alone() {
        let g = lark(Family::Hermes, &tools(Choice::Named("b".into()), true), &|_| None, &[]);
        assert!(g.contains("\\\"b\\\"") && !g.contains("\\\"a\\\""), "{g}");
        let auto = lark(Family::Generic, &tools(Choice::Auto, false), &|_| None, &[]);
        assert!(auto.contains("response") && auto.contains("tool_call\\\""), "{auto}");
        assert!(!lark(Family::Generic, &tools(Choice::Required, false), &|_| None, &[]).contains("response"));
    }
}
