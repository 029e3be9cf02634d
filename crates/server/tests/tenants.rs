//! Issue 19 item 1 end to end: a tenant's `cached_tokens` never count blocks another
//! tenant computed (they would reveal that the other tenant sent the same text),
//! unless the server opts into sharing prefixes across tenants.

mod common;

use common::*;
use engram_server::ServerConfig;
use serde_json::json;

/// Alice, then Bob, send the same long chat (several whole blocks); Bob's `cached_tokens`.
fn bobs_cached_tokens(share: bool) -> u64 {
    let mut config = ServerConfig::new("tiny");
    config.api_keys = vec![("k1".into(), "alice".into()), ("k2".into(), "bob".into())];
    config.scheduler.share_prefixes_across_tenants = share;
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
