//! Bad input: generated bodies for every endpoint that takes one — arbitrary JSON,
//! and valid requests with one field replaced by an arbitrary value, or cut short — never
//! crash the server or make it answer 5xx: each is a success or a 4xx in the API's error
//! shape (Anthropic's under `/v1/messages`), and the server answers `/health` afterwards.
//! (Entry-file and GGUF headers have their own fuzzing: `crates/kv/tests/it/persist.rs`,
//! `crates/gguf/tests/it/fuzz.rs`.)

use crate::common;
use common::*;
use proptest::prelude::*;
use serde_json::{json, Value};

/// Arbitrary JSON, a few levels deep.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        "[ -~]{0,12}".prop_map(Value::String),
        "\\PC{0,6}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,10}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid request for each route.
fn valid(route: &str) -> Value {
    let user = json!([{"role": "user", "content": "hi"}]);
    match route {
        "/v1/chat/completions" => json!({"model": "tiny", "messages": user, "max_tokens": 2, "temperature": 0}),
        "/v1/completions" => json!({"model": "tiny", "prompt": "hi", "max_tokens": 2}),
        "/v1/messages" => json!({"model": "tiny", "messages": user, "max_tokens": 2}),
        "/v1/embeddings" => json!({"model": "tiny", "input": "hi"}),
        "/v1/agents" => json!({"name": "a", "system": "terse"}),
        _ => unreachable!(),
    }
}

const ROUTES: [&str; 5] = ["/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/embeddings", "/v1/agents"];
const FIELDS: [&str; 14] = [
    "model",
    "messages",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stream",
    "seed",
    "input",
    "system",
    "session_id",
    "n",
];

fn check(route: &str, body: &str) {
    let addr = shared();
    let r = request(addr, "POST", route, &[], body);
    // The shared server has no text encoder: its embeddings route answers 501 by design.
    let not_configured = route == "/v1/embeddings" && r.status == 501;
    assert!(r.status < 500 || not_configured, "{route} answered {} to {body:?}: {}", r.status, r.body);
    if r.status >= 400 {
        let v: Value = serde_json::from_str(&r.body).unwrap_or_else(|e| panic!("{route}: error not JSON ({e}): {}", r.body));
        if route == "/v1/messages" {
            assert_eq!(v["type"], "error", "{}", r.body);
        } else {
            assert!(v["error"]["message"].is_string(), "{}", r.body);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_json_is_a_4xx_or_a_success(route in 0..ROUTES.len(), body in any_json()) {
        check(ROUTES[route], &body.to_string());
    }

    #[test]
    fn a_valid_request_with_one_field_replaced_is_a_4xx_or_a_success(
        route in 0..ROUTES.len(), field in 0..FIELDS.len(), value in any_json()
    ) {
        let mut body = valid(ROUTES[route]);
        body[FIELDS[field]] = value;
        // A replaced max_tokens could ask for a long answer: keep each case short.
        if body.get("max_tokens").and_then(Value::as_i64).is_some_and(|n| n > 8) {
            body["max_tokens"] = json!(8);
        }
        check(ROUTES[route], &body.to_string());
    }

    #[test]
    fn a_valid_request_cut_short_or_with_bytes_flipped_is_a_4xx(route in 0..ROUTES.len(), cut in 0usize..200, flip in any::<u8>()) {
        let body = valid(ROUTES[route]).to_string().into_bytes();
        let mut cut_body = body[..cut.min(body.len().saturating_sub(1))].to_vec();
        if let Some(b) = cut_body.last_mut() {
            *b ^= flip;
        }
        check(ROUTES[route], &String::from_utf8_lossy(&cut_body));
    }
}

#[test]
fn the_server_is_alive_after_the_fuzzing() {
    assert_eq!(request(shared(), "GET", "/health", &[], "").status, 200);
}
