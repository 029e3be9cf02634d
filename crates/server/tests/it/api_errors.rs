//! Rejections a client can act on. A body over the limit
//! is the API's JSON error (not axum's plain-text 413), and request fields
//! the server does not implement are a 400 naming the field instead of
//! being silently ignored.

use crate::common;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use engram_server::MAX_BODY_BYTES;
use serde_json::{json, Value};

/// POSTs a JSON body of `len` bytes (a valid request padded with a long
/// user message) to `path`; returns the status, content type and body.
/// NOTE: writes and reads on separate threads, since the server answers the
/// 413 as soon as it has read the headers, while the client is still writing.
fn post_sized(addr: SocketAddr, path: &str, len: usize) -> (u16, String, String) {
    let head = r#"{"model":"tiny","max_tokens":4,"input":"x","prompt":"x","messages":[{"role":"user","content":""#;
    let tail = r#""}]}"#;
    let body = format!("{head}{}{tail}", "a".repeat(len - head.len() - tail.len()));
    assert_eq!(body.len(), len);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n{body}"
    );
    let mut w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        // The server may close before taking it all; that is its right.
        let _ = w.write_all(req.as_bytes());
    });
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    writer.join().unwrap();
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no response head: {text:?}"));
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let ctype = head
        .lines()
        .find_map(|l| l.split_once(": ").filter(|(k, _)| k.eq_ignore_ascii_case("content-type")).map(|(_, v)| v.to_string()))
        .unwrap_or_default();
    (status, ctype, body.to_string())
}

#[test]
fn a_body_over_the_limit_is_a_json_413_in_the_route_api_shape() {
    let addr = shared();
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/agents", "/v1/messages"] {
        let (status, ctype, body) = post_sized(addr, path, MAX_BODY_BYTES + 1);
        assert_eq!(status, 413, "{path}: {body}");
        assert!(ctype.starts_with("application/json"), "{path}: content-type {ctype:?}, body {body:?}");
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body:?}"));
        let message = if path == "/v1/messages" {
            assert_eq!(v["type"], "error", "{path}: {v}");
            assert_eq!(v["error"]["type"], "request_too_large", "{path}: {v}");
            &v["error"]["message"]
        } else {
            assert_eq!(v["error"]["type"], "invalid_request_error", "{path}: {v}");
            assert_eq!(v["error"]["code"], "request_too_large", "{path}: {v}");
            assert!(v["error"].get("param").is_some(), "{path}: {v}");
            &v["error"]["message"]
        };
        assert!(message.as_str().unwrap().contains(&MAX_BODY_BYTES.to_string()), "{path}: {v}");
    }
    // At the limit the body is read: the request is answered on its merits.
    let (status, _, body) = post_sized(addr, "/v1/chat/completions", MAX_BODY_BYTES);
    assert_ne!(status, 413, "{body}");
}

#[test]
fn unsupported_fields_are_a_400_naming_the_field() {
    let addr = shared();
    let user = json!([{"role": "user", "content": "hi"}]);
    let chat_cases = [
        ("functions", json!([{"name": "f", "parameters": {}}])),
        ("function_call", json!({"name": "f"})),
        ("logit_bias", json!({"5": 10})),
    ];
    for (field, value) in chat_cases {
        let r = chat(addr, &user, json!({ field: value }));
        assert_eq!(r.status, 400, "{field}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], field, "{}", r.body);
        assert_eq!(e["type"], "invalid_request_error", "{}", r.body);
        assert!(e["message"].as_str().unwrap().contains(&format!("`{field}`")), "{}", r.body);
    }
    // Tools are taken (`tools.rs`); malformed ones are a 400 naming the field.
    for (field, value) in [("tools", json!({"f": 1})), ("tool_choice", json!("sometimes"))] {
        let r = chat(addr, &user, json!({ field: value }));
        assert_eq!(r.status, 400, "{field}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], field, "{}", r.body);
        assert!(e["message"].as_str().unwrap().contains(field), "{}", r.body);
    }
    for (field, value) in [("logit_bias", json!({"5": -100})), ("tools", json!([{"type": "function", "function": {"name": "f"}}]))] {
        let r = post(addr, "/v1/completions", &json!({"model": "tiny", "prompt": "hi", "max_tokens": 2, field: value}));
        assert_eq!(r.status, 400, "completions {field}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], field, "{}", r.body);
    }
    for (field, value) in [("tools", json!([{"name": "f", "input_schema": 3}])), ("tool_choice", json!({"type": "any"}))] {
        let r = post(addr, "/v1/messages", &json!({"model": "tiny", "max_tokens": 2, "messages": user, field: value}));
        assert_eq!(r.status, 400, "messages {field}: {}", r.body);
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(field), "{v}");
    }
    for (field, value) in [("logprobs", json!(true))] {
        let r = post(addr, "/v1/messages", &json!({"model": "tiny", "max_tokens": 2, "messages": user, field: value}));
        assert_eq!(r.status, 400, "messages {field}: {}", r.body);
        let v = r.json();
        assert_eq!(v["type"], "error", "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains(&format!("`{field}`")), "{v}");
    }
    // Values that ask for nothing are what some clients always send: accepted.
    let r = chat(
        addr,
        &user,
        json!({"logprobs": false, "top_logprobs": null, "tools": [], "tool_choice": "none", "logit_bias": {}, "functions": null}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = post(addr, "/v1/completions", &json!({"model": "tiny", "prompt": "hi", "max_tokens": 2, "logprobs": null}));
    assert_eq!(r.status, 200, "{}", r.body);
}

/// `logprobs`: one entry per generated token in OpenAI's shapes; values
/// out of range, `top_logprobs` without `logprobs`, or the wrong type are 400s naming the field.
#[test]
fn logprobs_are_served_and_bad_values_are_400s() {
    let addr = shared();
    let user = json!([{"role": "user", "content": "hi"}]);
    let r = chat(addr, &user, json!({"logprobs": true, "top_logprobs": 2, "max_tokens": 5, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().expect("logprobs.content").clone();
    assert_eq!(content.len() as u64, v["usage"]["completion_tokens"].as_u64().unwrap());
    for e in &content {
        assert!(e["logprob"].as_f64().unwrap() <= 0.0 && e["token"].is_string() && e["bytes"].is_array(), "{e}");
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2, "{e}");
    }
    let r = post(addr, "/v1/completions", &json!({"model": "tiny", "prompt": "hi", "max_tokens": 3, "logprobs": 1, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    let lp = &r.json()["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), lp["token_logprobs"].as_array().unwrap().len(), "{lp}");
    for (body, param) in [
        (json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        (json!({"top_logprobs": 2}), "top_logprobs"),
        (json!({"logprobs": "yes"}), "logprobs"),
        (json!({"logprobs": true, "top_logprobs": -1}), "top_logprobs"),
    ] {
        let r = chat(addr, &user, body.clone());
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{}", r.body);
    }
    for (body, param) in
        [(json!({"logprobs": 21}), "logprobs"), (json!({"logprobs": true}), "logprobs"), (json!({"top_logprobs": 2}), "top_logprobs")]
    {
        let mut b = json!({"model": "tiny", "prompt": "hi", "max_tokens": 2});
        b.as_object_mut().unwrap().extend(body.as_object().unwrap().clone());
        let r = post(addr, "/v1/completions", &b);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], param, "{}", r.body);
    }
}

/// The `draft` field turns speculative decoding on or off per request; it
/// never changes the answer, and a value the server does not know is a 400 naming it.
#[test]
fn the_draft_field_speeds_up_without_changing_the_answer() {
    // Trees sized by acceptance alone, so drafts are offered whatever this machine's steps cost.
    let scheduler = engram_engine::SchedulerConfig { draft_budget: engram_engine::DraftBudget::Acceptance, ..Default::default() };
    let addr = start(256 << 20, engram_server::ServerConfig { scheduler, ..engram_server::ServerConfig::new("tiny") });
    // 64 greedy tokens of the random-weight fixture fall into a loop, which prompt lookup drafts.
    let user = json!([{"role": "user", "content": "a b c d a b c d a b c d a b c d a b"}]);
    let extra = |draft: &str| json!({"max_tokens": 64, "temperature": 0, "ignore_eos": true, "draft": draft});
    let plain = chat(addr, &user, extra("none"));
    let before = metric(addr, "engram_draft_tokens_total");
    let fast = chat(addr, &user, extra("prompt-lookup"));
    assert_eq!((plain.status, fast.status), (200, 200), "{} {}", plain.body, fast.body);
    assert_eq!(content(&plain), content(&fast));
    assert!(metric(addr, "engram_draft_tokens_total") > before, "the request's drafts were verified");
    let bad = chat(addr, &user, extra("eagle"));
    assert_eq!(bad.status, 400, "{}", bad.body);
    assert_eq!(bad.json()["error"]["param"], "draft", "{}", bad.body);
}
