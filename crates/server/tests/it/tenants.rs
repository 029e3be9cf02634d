//! Tenant isolation end to end: a tenant's `cached_tokens` never count blocks another
//! tenant computed (they would reveal that the other tenant sent the same text),
//! unless the server opts into sharing prefixes across tenants.

use crate::common;
use common::*;
use engram_server::ServerConfig;
use serde_json::json;

/// Alice, then Bob, send the same long chat (several whole blocks); Bob's `cached_tokens`.
fn bobs_cached_tokens(share: bool) -> u64 {
    let mut config = ServerConfig::new("tiny");
    config.api_keys = vec![("k1".into(), "alice".into()), ("k2".into(), "bob".into())];
    config.sessions.share_prefixes_across_tenants = share;
    let addr = start(64 << 20, config);
    let system = "You are the private assistant of one patient; their whole history follows. ".repeat(4);
    let body = json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "what now?"}],
        "max_tokens": 3,
        "temperature": 0
    })
    .to_string();
    let cached = |key: &str| {
        let r = request(addr, "POST", "/v1/chat/completions", &[("Authorization", &format!("Bearer {key}"))], &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap()
    };
    assert_eq!(cached("k1"), 0);
    let bob = cached("k2");
    // Alice's own repeat is served from her cache either way.
    assert!(cached("k1") >= 64);
    bob
}

#[test]
fn a_tenant_sees_no_cached_tokens_from_another_tenants_prompt() {
    assert_eq!(bobs_cached_tokens(false), 0);
}

#[test]
fn sharing_prefixes_across_tenants_is_opt_in() {
    let bob = bobs_cached_tokens(true);
    assert!(bob >= 64 && bob % 32 == 0, "bob reuses alice's whole blocks: {bob}");
}

/// With API keys set, `/metrics` (every tenant's activity summed) wants a
/// valid key too; ids handed out (sessions, completions, agents) are random, not counters
/// or clocks that tell a tenant how busy the others are; an unknown model's error does not
/// name the model's file.
#[test]
fn metrics_need_a_key_ids_are_random_and_errors_name_no_paths() {
    let mut config = ServerConfig::new("tiny");
    config.api_keys = vec![("k1".into(), "alice".into()), ("k2".into(), "bob".into())];
    let addr = start(64 << 20, config);
    let auth = |key: &str| format!("Bearer {key}");
    assert_eq!(request(addr, "GET", "/metrics", &[], "").status, 401);
    assert_eq!(request(addr, "GET", "/metrics", &[("Authorization", &auth("nope"))], "").status, 401);
    assert_eq!(request(addr, "GET", "/metrics", &[("Authorization", &auth("k2"))], "").status, 200);

    let random_hex = |id: &str, prefix: &str| {
        let tail = id.strip_prefix(prefix).unwrap_or_else(|| panic!("{id:?} does not start with {prefix:?}"));
        assert!(tail.len() == 24 && tail.bytes().all(|b| b.is_ascii_hexdigit()), "{id:?} is not {prefix}<24 random hex digits>");
    };
    let body = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).to_string();
    for key in ["k1", "k2"] {
        let r = request(addr, "POST", "/v1/chat/completions", &[("Authorization", &auth(key))], &body);
        assert_eq!(r.status, 200, "{}", r.body);
        random_hex(r.header("x-session-id").unwrap(), "sess-");
        random_hex(r.json()["id"].as_str().unwrap(), "chatcmpl-");
        let a = request(addr, "POST", "/v1/agents", &[("Authorization", &auth(key))], "{}");
        assert_eq!(a.status, 201, "{}", a.body);
        random_hex(a.json()["id"].as_str().unwrap(), "agent-");
    }

    let bad = json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let r = request(addr, "POST", "/v1/chat/completions", &[("Authorization", &auth("k1"))], &bad);
    assert_eq!(r.status, 404, "{}", r.body);
    let dir = fixture().1.display().to_string();
    assert!(!r.body.contains(&dir) && !r.body.contains("hf:") && !r.body.contains("gguf:"), "a path in {}", r.body);
}
