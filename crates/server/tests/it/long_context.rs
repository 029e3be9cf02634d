//! `--long-context-after`: a conversation past the threshold is served sparse (DynaKV over KV
//! offloaded to disk) over HTTP, and its next turns extend the kept sparse cache (they report
//! the history as cached tokens and compute only what is new).

use serde_json::{json, Value};

use crate::common::{chat, content, metric, start};
use engram_server::{LongContextConfig, ServerConfig};

#[test]
fn a_long_conversation_goes_sparse_and_its_next_turn_reuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let long = LongContextConfig { ram_budget: 8 << 10, cache_bytes: 4 << 10, ..LongContextConfig::new(96, dir.path().to_path_buf()) };
    let addr = start(64 << 20, ServerConfig { long_context: Some(long), ..ServerConfig::new("tiny") });
    let history = "The KV cache keeps every turn's keys and values in blocks of 32 tokens. ".repeat(10);
    let mut messages = vec![json!({"role": "system", "content": history}), json!({"role": "user", "content": "What is kept?"})];
    let mut prompt_before = 0;
    for turn in 0..3 {
        let r = chat(addr, &Value::Array(messages.clone()), json!({"max_tokens": 8}));
        let answer = content(&r);
        let usage = &r.json()["usage"];
        let prompt = usage["prompt_tokens"].as_u64().unwrap();
        let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert!(prompt > 96, "past the threshold: {usage}");
        if turn > 0 {
            assert!(
                cached >= prompt_before,
                "turn {turn} reuses the sparse cache: {cached} cached, the previous prompt was {prompt_before}"
            );
        }
        prompt_before = prompt;
        messages.push(json!({"role": "assistant", "content": answer}));
        messages.push(json!({"role": "user", "content": format!("Question {turn}: and then?")}));
    }
    assert_eq!(metric(addr, "engram_long_context_switches_total"), 1.0, "switched once");
    assert_eq!(metric(addr, "engram_long_context_resumes_total"), 2.0, "both later turns extended it");
    assert_eq!(metric(addr, "engram_long_context_sessions"), 1.0);
    assert!(metric(addr, "engram_long_context_ram_bytes") > 0.0, "its RAM is charged to the KV pool");
    assert!(metric(addr, "engram_long_context_offload_bytes") > 0.0, "its older KV is in its file");
}
