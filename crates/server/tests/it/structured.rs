//! Structured output over HTTP on the tiny random-weight fixture (its free text is random, so
//! only the grammar makes the answers JSON): OpenAI's `response_format` on chat (whole and
//! streamed) and completions, Ollama's `format`, and the 400s for formats that do not compile
//! or have the wrong shape, with nothing queued. Full JSON Schema validation of many schemas
//! runs in `tests/python/test_structured_output.py`.

use serde_json::{json, Value};

use engram_server::ServerConfig;

use crate::common::{chat, metric, post, shared, start};

fn point() -> Value {
    json!({"type": "object", "properties": {
        "x": {"type": "integer", "minimum": -9, "maximum": 9},
        "label": {"enum": ["a", "b"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 5}, "maxItems": 2}},
        "required": ["x", "label", "tags"], "additionalProperties": false})
}

fn is_point(v: &Value) -> bool {
    v["x"].as_i64().is_some_and(|x| x.abs() <= 9)
        && ["a", "b"].contains(&v["label"].as_str().unwrap_or(""))
        && v["tags"].as_array().is_some_and(|a| a.len() <= 2 && a.iter().all(|t| t.as_str().is_some_and(|t| t.chars().count() <= 5)))
        && v.as_object().unwrap().len() == 3
}

#[test]
fn chat_and_completions_answer_json_of_the_schema() {
    let addr = shared();
    let format = json!({"type": "json_schema", "json_schema": {"name": "point", "schema": point(), "strict": true}});
    for seed in 0..4 {
        let r = chat(
            addr,
            &json!([{"role": "user", "content": "a point"}]),
            json!({"response_format": format, "max_tokens": 200, "temperature": 1.0, "seed": seed}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let c = &r.json()["choices"][0];
        assert_eq!(c["finish_reason"], "stop", "{c}");
        let v: Value = serde_json::from_str(c["message"]["content"].as_str().unwrap()).unwrap();
        assert!(is_point(&v), "{v}");
    }
    // Streamed: the pieces join into the same kind of answer.
    let r = chat(
        addr,
        &json!([{"role": "user", "content": "a point"}]),
        json!({"response_format": format, "max_tokens": 200, "temperature": 1.0, "seed": 9, "stream": true}),
    );
    let mut text = String::new();
    for (_, data) in r.sse() {
        if let Ok(v) = serde_json::from_str::<Value>(&data) {
            text.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
        }
    }
    assert!(is_point(&serde_json::from_str(&text).unwrap()), "{text}");
    // Completions, and json_object.
    let r = post(
        addr,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "JSON:", "max_tokens": 200, "response_format": format, "temperature": 1.0}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(is_point(&serde_json::from_str(r.json()["choices"][0]["text"].as_str().unwrap()).unwrap()), "{}", r.body);
    let r = chat(
        addr,
        &json!([{"role": "user", "content": "hi"}]),
        json!({"response_format": {"type": "json_object"}, "max_tokens": 300, "temperature": 1.0}),
    );
    let c = &r.json()["choices"][0];
    let text = c["message"]["content"].as_str().unwrap();
    assert!(text.starts_with('{'), "{text:?}");
    if c["finish_reason"] == "stop" {
        assert!(serde_json::from_str::<Value>(text).unwrap().is_object(), "{text:?}");
    }
    // `text` asks for nothing.
    let r = chat(addr, &json!([{"role": "user", "content": "hi"}]), json!({"response_format": {"type": "text"}}));
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn ollama_format_takes_a_schema() {
    let addr = shared();
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "a point"}], "stream": false, "format": point(),
                      "options": {"temperature": 1.0, "seed": 2, "num_predict": 200}});
    let r = post(addr, "/api/chat", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["done_reason"], "stop", "{v}");
    assert!(is_point(&serde_json::from_str(v["message"]["content"].as_str().unwrap()).unwrap()), "{v}");
    let body = json!({"model": "tiny", "prompt": "a point", "stream": false, "format": point(), "options": {"temperature": 1.0, "num_predict": 200}});
    let r = post(addr, "/api/generate", &body);
    assert!(is_point(&serde_json::from_str(r.json()["response"].as_str().unwrap()).unwrap()), "{}", r.body);
}

#[test]
fn a_bad_format_is_a_400_naming_the_field_and_nothing_is_queued() {
    // Its own server: the prompt-token count is this test's alone.
    let addr = start(64 << 20, ServerConfig::new("tiny"));
    let cases = [
        (json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}), "response_format"),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}),
            "response_format",
        ),
        (json!({"type": "yaml"}), "response_format.type"),
        (json!({"json_schema": {}}), "response_format.type"),
        (json!("json"), "response_format"),
        (json!({"type": "json_schema"}), "response_format.json_schema"),
        (json!({"type": "json_schema", "json_schema": {"name": "x", "schema": [1]}}), "response_format.json_schema.schema"),
    ];
    for (format, field) in cases {
        let before = metric(addr, "engram_prompt_tokens_computed_total ");
        let r = chat(addr, &json!([{"role": "user", "content": "hi"}]), json!({"response_format": format}));
        assert_eq!(r.status, 400, "{format}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], field, "{format}: {e}");
        assert!(e["message"].as_str().unwrap().contains(field), "{format}: {e}");
        assert_eq!(metric(addr, "engram_prompt_tokens_computed_total "), before, "{format}: nothing queued");
    }
    for format in [json!("yaml"), json!(3), json!({"type": "nonsense"})] {
        let r = post(addr, "/api/chat", &json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "format": format}));
        assert_eq!(r.status, 400, "{format}: {}", r.body);
        assert!(r.json()["error"].as_str().unwrap().contains("format"), "{}", r.body);
    }
}

/// The `grammar` (Lark) and `regex` extension fields bind the answer as `response_format`
/// does, on chat and completions; two of the three, or one that does not compile, is a 400
/// naming the field.
#[test]
fn grammar_and_regex_extension_fields() {
    let addr = shared();
    for seed in 0..3 {
        let r = chat(
            addr,
            &json!([{"role": "user", "content": "x"}]),
            json!({"regex": "[a-c]{3}-[0-9]", "temperature": 1.0, "seed": seed, "max_tokens": 20}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let c = r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string();
        let b = c.as_bytes();
        assert!(b.len() == 5 && b[..3].iter().all(|x| (b'a'..=b'c').contains(x)) && b[3] == b'-' && b[4].is_ascii_digit(), "{c:?}");
        let r = post(
            addr,
            "/v1/completions",
            &json!({"prompt": "x", "grammar": "start: \"yes\" | \"no\"", "temperature": 1.0, "seed": seed, "max_tokens": 20}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let t = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
        assert!(t == "yes" || t == "no", "{t:?}");
    }
    let bad = [
        (json!({"regex": "(", "max_tokens": 4}), "regex"),
        (json!({"grammar": "start: nope_undefined", "max_tokens": 4}), "grammar"),
        (json!({"grammar": 3, "max_tokens": 4}), "grammar"),
        (json!({"response_format": {"type": "json_object"}, "regex": "a", "max_tokens": 4}), "regex"),
        (json!({"response_format": {"type": "json_object"}, "grammar": "start: \"a\"", "max_tokens": 4}), "grammar"),
    ];
    for (extra, field) in bad {
        let r = chat(addr, &json!([{"role": "user", "content": "x"}]), extra.clone());
        assert_eq!(r.status, 400, "{extra}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], field, "{extra}: {}", r.body);
    }
}
