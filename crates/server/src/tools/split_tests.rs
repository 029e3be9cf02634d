//! The splitter's tests: every family's reasoning, content and calls, streamed piece by piece
//! and whole, against the same reply.

use super::*;

/// Knows every tool but `unknown`, accepts any arguments but `{"bad":..}`.
struct AnyTool;

impl Check for AnyTool {
    fn knows(&self, name: &str) -> bool {
        name != "unknown"
    }
    fn accepts(&self, _: &str, arguments: &str) -> bool {
        !arguments.starts_with("{\"bad\"")
    }
}

fn any_tool() -> Checker {
    Box::new(AnyTool)
}

/// Splits `text` whole and one character at a time: the same reply.
fn both(think: Think, calls: Option<Family>, text: &str) -> Reply {
    let whole = Splitter::new(think, calls, any_tool()).split(text);
    let mut s = Splitter::new(think, calls, any_tool());
    let mut pieces = Vec::new();
    for c in text.chars() {
        pieces.extend(s.push(&c.to_string()));
    }
    pieces.extend(s.finish());
    let streamed = collect(pieces);
    let strip = |r: &Reply| {
        (
            r.reasoning.clone(),
            r.content.clone(),
            r.calls.iter().map(|c| (c.name.clone(), c.arguments.clone())).collect::<Vec<_>>(),
            r.incomplete,
        )
    };
    assert_eq!(strip(&whole), strip(&streamed), "{text:?}");
    whole
}

#[test]
fn hermes_calls_and_reasoning_split_the_same_whole_or_streamed() {
    let text = "<think>\nhmm\n</think>\n\nLet me look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\":1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>";
    let r = both(Think::May, Some(Family::Hermes), text);
    assert_eq!(r.reasoning, "hmm");
    assert_eq!(r.content, "Let me look.");
    assert_eq!(r.calls.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["f", "g"]);
    assert_eq!(r.calls[0].arguments, "{\"x\":1}");
    assert!(r.calls[0].id.starts_with("call_"));
}

#[test]
fn a_call_that_does_not_parse_or_check_is_content() {
    let cut = "Hi <tool_call>\n{\"name\": \"f\", \"argu";
    let r = both(Think::No, Some(Family::Hermes), cut);
    assert!(r.calls.is_empty());
    assert_eq!(r.content, "Hi <tool_call>\n{\"name\": \"f\", \"argu");
    let unknown = "<tool_call>{\"name\": \"unknown\", \"arguments\": {}}</tool_call>";
    assert!(both(Think::No, Some(Family::Hermes), unknown).calls.is_empty());
    assert_eq!(both(Think::No, None, "plain <tool_call>").content, "plain <tool_call>");
}

#[test]
fn reasoning_opened_by_the_prompt_and_never_closed() {
    let r = both(Think::Inside, None, "\nstill thinking");
    assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("still thinking", ""));
    let r = both(Think::May, None, "<thin");
    assert_eq!(r.content, "<thin");
}

#[test]
fn the_generic_json_answer_is_text_or_calls() {
    assert_eq!(both(Think::No, Some(Family::Generic), "{\"response\":\"hi \\\"x\\\"\"}").content, "hi \"x\"");
    let r = both(
        Think::No,
        Some(Family::Generic),
        "{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{}},{\"name\":\"g\",\"arguments\":{\"a\":[1]}}]}",
    );
    assert_eq!(r.calls.len(), 2);
    assert_eq!(both(Think::No, Some(Family::Generic), "not json").content, "not json");
}

#[test]
fn the_generic_answer_streams_its_text_and_its_calls() {
    // A text answer's string comes out decoded as it is written, escapes whole.
    let text = "{\"response\":\"Ol\\u00e9 \\ud83d\\ude00 \\\"q\\\"\\nend\"}";
    let pieces = streamed(Family::Generic, text);
    let contents: Vec<&str> = pieces.iter().filter_map(|p| if let Piece::Content(t) = p { Some(t.as_str()) } else { None }).collect();
    assert!(contents.len() > 5, "{contents:?}");
    assert_eq!(contents.concat(), "Olé 😀 \"q\"\nend");
    assert_eq!(both(Think::No, Some(Family::Generic), text).content, "Olé 😀 \"q\"\nend");
    // One call: its arguments stream; a list of calls: call by call.
    let one = "{\"tool_call\":{\"name\":\"f\",\"arguments\":{\"city\":\"Oslo\"}}}";
    let pieces = streamed(Family::Generic, one);
    let fragments = pieces.iter().filter(|p| matches!(p, Piece::CallArgs(_))).count();
    assert!(fragments > 5 && pieces.last() == Some(&Piece::CallEnd), "{pieces:?}");
    let r = both(Think::No, Some(Family::Generic), one);
    assert_eq!((r.calls[0].arguments.as_str(), r.content.as_str(), r.incomplete), ("{\"city\":\"Oslo\"}", "", false));
    let list = "{\"tool_calls\":[{\"name\":\"f\",\"arguments\":{}},{\"name\":\"g\",\"arguments\":{\"a\":1}}]}";
    let p = streamed(Family::Generic, list);
    assert_eq!(p.iter().filter(|p| matches!(p, Piece::CallStart { .. })).count(), 2, "{p:?}");
    let r = both(Think::No, Some(Family::Generic), list);
    assert_eq!(r.calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect::<Vec<_>>(), [("f", "{}"), ("g", "{\"a\":1}")]);
    // With whole calls (Ollama), a generic answer cut inside a call stays its text.
    let cut = "{\"tool_call\":{\"name\":\"f\",\"arguments\":{\"ci";
    let r = Splitter::new(Think::No, Some(Family::Generic), any_tool()).whole_calls().split(cut);
    assert_eq!((r.content.as_str(), r.calls.len()), (cut, 0));
    let r = Splitter::new(Think::No, Some(Family::Generic), any_tool()).whole_calls().split(one);
    assert_eq!(r.calls.len(), 1);
    // Cut short inside the string: what was written, decoded.
    assert_eq!(both(Think::No, Some(Family::Generic), "{\"response\":\"half a sen").content, "half a sen");
    // Another shape is split whole: a call of an unknown tool stays text.
    let unknown = "{\"tool_call\":{\"name\":\"unknown\",\"arguments\":{}}}";
    assert_eq!(both(Think::No, Some(Family::Generic), unknown).content, unknown);
}

#[test]
fn mistral_calls_take_the_ids_the_grammar_wrote() {
    let text = "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"a\": 1}, \"id\": \"abcDEF123\"}, {\"name\": \"g\", \"arguments\": {}, \"id\": \"zzzzzzzz9\"}]";
    let ids = vec!["abcDEF123".to_string(), "zzzzzzzz9".to_string(), "unused000".to_string()];
    for whole in [false, true] {
        let mut s = Splitter::new(Think::No, Some(Family::Mistral), any_tool()).with_ids(ids.clone());
        if whole {
            s = s.whole_calls();
        }
        let mut pieces: Vec<Piece> = text.chars().flat_map(|c| s.push(&c.to_string())).collect();
        pieces.extend(s.finish());
        let r = collect(pieces);
        let got: Vec<(&str, &str, &str)> = r.calls.iter().map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str())).collect();
        assert_eq!(got, [("abcDEF123", "f", "{\"a\":1}"), ("zzzzzzzz9", "g", "{}")]);
        assert!(!r.incomplete && r.content.is_empty(), "{r:?}");
    }
    // Parsed whole (a shape the streaming head does not take), the written id is kept.
    let r = Splitter::new(Think::No, Some(Family::Mistral), any_tool())
        .with_ids(ids)
        .split("[TOOL_CALLS][{\"arguments\": {}, \"name\": \"f\", \"id\": \"unused000\"}]");
    assert_eq!(r.calls.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["unused000"]);
}

/// The pieces of `text` fed a character at a time.
fn streamed(calls: Family, text: &str) -> Vec<Piece> {
    let mut s = Splitter::new(Think::No, Some(calls), any_tool());
    let mut pieces: Vec<Piece> = text.chars().flat_map(|c| s.push(&c.to_string())).collect();
    pieces.extend(s.finish());
    pieces
}

#[test]
fn call_arguments_stream_as_they_are_written() {
    let text = "Hi\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Oslo\", \"n\": [1, 2]}}\n</tool_call>";
    let pieces = streamed(Family::Hermes, text);
    let start = pieces.iter().position(|p| matches!(p, Piece::CallStart { name, .. } if name == "f")).expect("a call");
    assert_eq!(collect(pieces[..start].to_vec()).content, "Hi");
    let fragments: Vec<&str> = pieces.iter().filter_map(|p| if let Piece::CallArgs(t) = p { Some(t.as_str()) } else { None }).collect();
    assert!(fragments.len() > 10, "one fragment per character: {fragments:?}");
    assert_eq!(fragments.concat(), "{\"city\":\"Oslo\",\"n\":[1,2]}");
    assert_eq!(pieces.last(), Some(&Piece::CallEnd));
    let r = both(Think::No, Some(Family::Hermes), text);
    assert_eq!((r.calls[0].arguments.as_str(), r.incomplete), ("{\"city\":\"Oslo\",\"n\":[1,2]}", false));
    // Mistral's list streams call by call.
    let r = both(
        Think::No,
        Some(Family::Mistral),
        "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {\"a\": 1}}]",
    );
    assert_eq!(r.calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect::<Vec<_>>(), [("f", "{}"), ("g", "{\"a\":1}")]);
    assert!(!r.incomplete);
    let p = streamed(Family::Mistral, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {}}]");
    assert_eq!(p.iter().filter(|p| matches!(p, Piece::CallStart { .. })).count(), 2, "{p:?}");
}

#[test]
fn a_streamed_call_cut_short_or_refused_is_incomplete() {
    let cut = both(Think::No, Some(Family::Hermes), "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1,");
    assert_eq!((cut.calls.len(), cut.calls[0].arguments.as_str(), cut.incomplete), (1, "{\"a\":[1,", true));
    assert!(!cut.ended_on_calls(engram_engine::FinishReason::Stop));
    let bad = both(Think::No, Some(Family::Hermes), "<tool_call>{\"name\": \"f\", \"arguments\": {\"bad\": 1}}</tool_call> then");
    assert!(bad.incomplete, "{bad:?}");
    assert_eq!(bad.content, "}</tool_call> then");
    // Whole calls only: the cut call is left out, a complete one comes out whole.
    let mut s = Splitter::new(Think::No, Some(Family::Hermes), any_tool()).whole_calls();
    let mut p = s.push("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call><tool_call>{\"name\": \"g\", \"arguments\": {");
    p.extend(s.finish());
    assert!(matches!(&p[..], [Piece::Call(c)] if c.name == "f" && c.arguments == "{\"a\":1}"), "{p:?}");
}

#[test]
fn harmony_channels_are_reasoning_content_and_calls() {
    let text = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|>";
    let r = both(Think::Harmony, Some(Family::Harmony), text);
    assert_eq!(r.reasoning, "Need the weather.");
    assert_eq!(r.content, "");
    assert_eq!(
        r.calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect::<Vec<_>>(),
        [("get_weather", "{\"city\":\"Oslo\"}")]
    );
    assert!(!r.incomplete);
    // The template's own form (recipient first), and a final answer.
    let r = both(Think::Harmony, Some(Family::Harmony), " to=functions.f<|channel|>commentary json<|message|>{}");
    assert_eq!((r.calls.len(), r.calls[0].arguments.as_str()), (1, "{}"));
    let r = both(
        Think::Harmony,
        None,
        "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>final<|message|>Hello there<|return|>",
    );
    assert_eq!((r.reasoning.as_str(), r.content.as_str(), r.calls.len()), ("hm", "Hello there", 0));
    // Without tools a call's message is content; text that is not harmony is content.
    let r = both(Think::Harmony, None, "<|channel|>commentary to=functions.f<|message|>{}");
    assert_eq!((r.content.as_str(), r.calls.len()), ("{}", 0));
    assert_eq!(both(Think::Harmony, Some(Family::Harmony), "just text").content, "just text");
}

#[test]
fn llama_built_in_calls_after_the_python_tag() {
    let r = both(Think::No, Some(Family::Llama3), "<|python_tag|>brave_search.call(query=\"weather in Oslo\", n=3)");
    assert_eq!(
        r.calls.iter().map(|c| (c.name.as_str(), c.arguments.as_str())).collect::<Vec<_>>(),
        [("brave_search", "{\"query\":\"weather in Oslo\",\"n\":3}")]
    );
    assert_eq!(r.content, "");
    let r = both(Think::No, Some(Family::Llama3), "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}");
    assert_eq!((r.calls[0].name.as_str(), r.calls[0].arguments.as_str()), ("f", "{}"));
    // Not a call: content.
    assert!(both(Think::No, Some(Family::Llama3), "<|python_tag|>print(1)").calls.is_empty());
    assert!(both(Think::No, Some(Family::Llama3), "<|python_tag|>f.call(q=\"x\"").calls.is_empty());
}

#[test]
fn llama_and_mistral_calls() {
    let r = both(Think::No, Some(Family::Llama3), "{\"name\": \"f\", \"parameters\": {\"q\": \"x\"}}");
    assert_eq!((r.calls[0].name.as_str(), r.calls[0].arguments.as_str()), ("f", "{\"q\":\"x\"}"));
    let r =
        both(Think::No, Some(Family::Mistral), "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"g\", \"arguments\": {}}]");
    assert_eq!(r.calls.len(), 2);
}
