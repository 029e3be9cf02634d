//! `chat_template_kwargs`: extra chat-template variables reach the template (Qwen3's
//! `enable_thinking=false` renders the empty thinking block, so the prompt grows), and a
//! variable the renderer sets itself is a 400 naming it, nothing run.

use std::sync::Arc;

use engram_fixture::{GgufFormat, Shape};
use engram_model::Model;
use engram_server::ServerConfig;
use serde_json::json;

use crate::common::{chat, start_model};

#[test]
fn enable_thinking_reaches_the_qwen3_template_and_reserved_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let files =
        engram_fixture::generate(Shape::TinyQwen3, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = Arc::new(Model::load(&files.hf_dir).unwrap());
    let addr = start_model(model, 64 << 20, ServerConfig::new("tiny"));
    let messages = json!([{"role": "user", "content": "Name a prime."}]);
    let prompt_tokens = |extra: serde_json::Value| {
        let r = chat(addr, &messages, extra);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let thinking = prompt_tokens(json!({"max_tokens": 1}));
    let off = prompt_tokens(json!({"max_tokens": 1, "chat_template_kwargs": {"enable_thinking": false}}));
    assert!(off > thinking, "enable_thinking=false adds the empty thinking block: {off} vs {thinking} prompt tokens");
    assert_eq!(prompt_tokens(json!({"max_tokens": 1, "chat_template_kwargs": {}})), thinking, "no variables: the default render");
    for key in ["messages", "add_generation_prompt", "bos_token"] {
        let r = chat(addr, &messages, json!({"max_tokens": 1, "chat_template_kwargs": {key: 1}}));
        assert_eq!(r.status, 400, "{key}: {}", r.body);
        assert_eq!(r.json()["error"]["param"], format!("chat_template_kwargs.{key}"), "{}", r.body);
    }
    let r = chat(addr, &messages, json!({"max_tokens": 1, "chat_template_kwargs": "enable_thinking"}));
    assert_eq!(r.status, 400, "not an object: {}", r.body);
}
