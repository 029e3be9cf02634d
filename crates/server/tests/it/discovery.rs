//! Discovery: `/v1/models` lists every served model, the LLM and the text encoder, with
//! its kind and context length, and each listed id is one its route accepts.

use crate::common;

use common::*;
use engram_embed::Encoder;
use engram_server::ServerConfig;
use serde_json::{json, Value};

#[test]
fn models_lists_the_llm_and_the_encoder_and_each_id_is_served() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-minilm");
    engram_embed::fixture::write_tiny(&dir).unwrap();
    let enc = std::sync::Arc::new(Encoder::load(&dir).unwrap());
    let addr = start(64 << 20, ServerConfig { embedder: Some(enc.clone()), ..ServerConfig::new("tiny") });
    let r = request(addr, "GET", "/v1/models", &[], "");
    assert_eq!(r.status, 200, "{}", r.body);
    let data = r.json()["data"].as_array().unwrap().clone();
    assert_eq!(data.len(), 2, "{}", r.body);
    let ctx = model().config.max_positions;
    assert_eq!(data[0]["id"], "tiny");
    assert_eq!((&data[0]["kind"], &data[0]["context_length"], &data[0]["max_model_len"]), (&json!("llm"), &json!(ctx), &json!(ctx)));
    assert_eq!(data[1]["id"], enc.id());
    assert_eq!(data[1]["kind"], "embedding");
    assert_eq!(data[1]["context_length"], enc.max_tokens());
    assert_eq!(data[1]["dimensions"], enc.dim());
    for m in &data {
        assert_eq!(m["object"], "model");
        assert_eq!(m["owned_by"], "engram");
    }
    // Each listed id works on its route; the LLM's aliases still do.
    let id = |i: usize| data[i]["id"].as_str().unwrap().to_string();
    let e = post(addr, "/v1/embeddings", &json!({"model": id(1), "input": "hello", "encoding_format": "float"}));
    assert_eq!(e.status, 200, "{}", e.body);
    assert_eq!(e.json()["model"], id(1).as_str());
    for model in [id(0), "default".into(), "engram".into()] {
        let c = chat(addr, &json!([{"role": "user", "content": "discovery"}]), json!({"model": model, "max_tokens": 2}));
        assert_eq!(c.status, 200, "{model}: {}", c.body);
    }
}

#[test]
fn without_an_encoder_only_the_llm_is_listed() {
    let r = request(shared(), "GET", "/v1/models", &[], "");
    let data: Vec<Value> = r.json()["data"].as_array().unwrap().clone();
    assert_eq!(data.len(), 1, "{}", r.body);
    assert_eq!(data[0]["kind"], "llm");
    let tags = request(shared(), "GET", "/api/tags", &[], "");
    assert_eq!(tags.json()["models"].as_array().unwrap().len(), 1, "{}", tags.body);
}
