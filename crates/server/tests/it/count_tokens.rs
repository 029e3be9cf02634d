//! Anthropic's `POST /v1/messages/count_tokens`: the tokens of the prompt `/v1/messages`
//! renders for the same request, validated as `/v1/messages` validates it.

use crate::common;

use common::*;
use serde_json::json;

#[test]
fn count_tokens_is_the_rendered_prompt_of_messages() {
    let addr = shared();
    let msgs = json!([{"role": "user", "content": "count my tokens, please"}]);
    let r = post(addr, "/v1/messages/count_tokens", &json!({"model": "tiny", "system": "Be terse.", "messages": msgs}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v.as_object().unwrap().len(), 1, "only input_tokens: {v}");
    let n = v["input_tokens"].as_u64().unwrap();
    // The same conversation through /v1/messages: its prompt, cached or computed, is n tokens.
    let m = post(addr, "/v1/messages", &json!({"model": "tiny", "max_tokens": 2, "system": "Be terse.", "messages": msgs}));
    assert_eq!(m.status, 200, "{}", m.body);
    let u = &m.json()["usage"];
    assert_eq!(u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap(), n);
    // Content blocks count as their text.
    let blocks = json!([{"role": "user", "content": [{"type": "text", "text": "count my tokens, please"}]}]);
    let b = post(addr, "/v1/messages/count_tokens", &json!({"system": [{"type": "text", "text": "Be terse."}], "messages": blocks}));
    assert_eq!(b.json()["input_tokens"].as_u64().unwrap(), n, "{}", b.body);
}

#[test]
fn count_tokens_rejects_what_messages_rejects() {
    let addr = shared();
    let user = json!([{"role": "user", "content": "hi"}]);
    for (name, body, status) in [
        ("malformed", "{\"messages\": [".to_string(), 400),
        ("no messages", json!({"model": "tiny"}).to_string(), 400),
        ("empty messages", json!({"messages": []}).to_string(), 400),
        ("bad role", json!({"messages": [{"role": "system", "content": "x"}]}).to_string(), 400),
        ("image block", json!({"messages": [{"role": "user", "content": [{"type": "image"}]}]}).to_string(), 400),
        ("unknown model", json!({"model": "claude-9", "messages": user}).to_string(), 404),
        ("tools", json!({"messages": user, "tools": [{"name": "f", "input_schema": {"type": "nonsense"}}]}).to_string(), 400),
    ] {
        let r = request(addr, "POST", "/v1/messages/count_tokens", &[], &body);
        assert_eq!(r.status, status, "{name}: {}", r.body);
        let v = r.json();
        assert_eq!(v["type"], "error", "{name}: Anthropic's error shape: {v}");
        assert!(v["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{name}: {v}");
    }
}
