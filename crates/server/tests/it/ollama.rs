//! Ollama's API (`/api/chat`, `/api/generate`, `/api/tags`, `/api/show`, `/api/ps`,
//! `/api/embed`, `/api/embeddings`, `/api/version`) end to end on a real server on
//! 127.0.0.1:0: Ollama's field names and NDJSON streaming, a stream equal to the whole
//! answer, a second chat turn computing only its new tokens (the first turn's cached),
//! and bad input answered `{"error": ...}` naming the field, with nothing stored.

use crate::common;
use std::net::SocketAddr;
use std::sync::Arc;

use common::*;
use engram_embed::Encoder;
use engram_server::ServerConfig;
use serde_json::{json, Value};

/// A server with the tiny sentence encoder beside the tiny LLM (the embeddings tests' one).
fn with_encoder() -> &'static (tempfile::TempDir, Arc<Encoder>, SocketAddr) {
    crate::embeddings::tiny()
}

/// The JSON objects of an NDJSON body, one per line.
fn lines(r: &Resp) -> Vec<Value> {
    r.body.lines().filter(|l| !l.is_empty()).map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
}

fn metric(addr: SocketAddr, name: &str) -> u64 {
    let text = request(addr, "GET", "/metrics", &[], "").body;
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse::<f64>().ok())).map(|v| v as u64).unwrap_or(0)
}

/// Ollama's last object: `done`, `done_reason`, counts and durations in nanoseconds.
fn assert_last(v: &Value, done_reason: &str) {
    assert_eq!(v["model"], "tiny", "{v}");
    assert_eq!(v["done"], true, "{v}");
    assert_eq!(v["done_reason"], done_reason, "{v}");
    let created = v["created_at"].as_str().unwrap();
    assert!(created.len() > 20 && created.as_bytes()[10] == b'T' && created.ends_with('Z'), "RFC 3339: {created}");
    for f in ["total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count", "eval_duration"] {
        assert!(v[f].is_u64(), "{f}: {v}");
    }
    let ns = |f: &str| v[f].as_u64().unwrap();
    assert!(ns("total_duration") >= ns("load_duration") + ns("prompt_eval_duration") + ns("eval_duration"), "{v}");
    assert!(ns("total_duration") > 0 && ns("prompt_eval_count") > 0, "{v}");
}

#[test]
fn chat_answers_in_ollamas_shape_and_streams_the_same_text() {
    let addr = shared();
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": "Ollama chat: what is a cache?"}],
                      "options": {"temperature": 0, "num_predict": 8}, "keep_alive": "5m"});
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    let r = post(addr, "/api/chat", &whole);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.header("content-type").unwrap().starts_with("application/json"));
    let v = r.json();
    assert_last(&v, "length");
    assert_eq!(v["eval_count"], 8);
    assert_eq!(v["message"]["role"], "assistant");
    let text = v["message"]["content"].as_str().unwrap().to_string();
    assert!(!text.is_empty());

    // Streamed by default, as Ollama does; `:latest` names the same model.
    let mut streamed = body.clone();
    streamed["model"] = json!("tiny:latest");
    let r = post(addr, "/api/chat", &streamed);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("application/x-ndjson"));
    let objs = lines(&r);
    let (last, pieces) = objs.split_last().unwrap();
    assert!(pieces.len() >= 2, "{}", r.body);
    for p in pieces {
        assert_eq!(p["done"], false, "{p}");
        assert_eq!(p["message"]["role"], "assistant");
        assert!(p["created_at"].is_string() && p.get("done_reason").is_none(), "{p}");
    }
    let joined: String = pieces.iter().map(|p| p["message"]["content"].as_str().unwrap()).collect();
    assert_eq!(joined, text);
    assert_last(last, "length");
    assert_eq!(last["message"]["content"], "");
    assert_eq!(last["eval_count"], 8);
}

#[test]
fn generate_answers_a_prompt_through_the_template_or_raw() {
    let addr = shared();
    let opts = json!({"temperature": 0, "num_predict": 6});
    let r = post(
        addr,
        "/api/generate",
        &json!({"model": "tiny", "prompt": "Why is the sky blue?", "system": "Be brief.", "stream": false, "options": opts}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_last(&v, "length");
    assert_eq!(v["eval_count"], 6);
    let text = v["response"].as_str().unwrap().to_string();
    assert!(v.get("message").is_none());
    // The same as /api/chat with the same two messages: one template, one path.
    let c = post(
        addr,
        "/api/chat",
        &json!({"model": "tiny", "stream": false, "options": opts,
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Why is the sky blue?"}]}),
    );
    assert_eq!(c.json()["message"]["content"], text.as_str());

    let r =
        post(addr, "/api/generate", &json!({"model": "tiny", "prompt": "Why is the sky blue?", "system": "Be brief.", "options": opts}));
    let objs = lines(&r);
    let (last, pieces) = objs.split_last().unwrap();
    assert_eq!(pieces.iter().map(|p| p["response"].as_str().unwrap()).collect::<String>(), text);
    assert_last(last, "length");

    // raw: the prompt as it is, as /v1/completions takes it.
    let raw =
        post(addr, "/api/generate", &json!({"model": "tiny", "prompt": "Once upon a time", "raw": true, "stream": false, "options": opts}));
    assert_eq!(raw.status, 200, "{}", raw.body);
    let c = post(addr, "/v1/completions", &json!({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}));
    assert_eq!(raw.json()["response"], c.json()["choices"][0]["text"]);
    let computed = raw.json()["prompt_eval_count"].as_u64().unwrap();
    assert!((1..=c.json()["usage"]["prompt_tokens"].as_u64().unwrap()).contains(&computed), "{}", raw.body);

    // No prompt (or no messages): Ollama's "load the model", which is always loaded.
    for (path, body) in [("/api/generate", json!({"model": "tiny"})), ("/api/chat", json!({"model": "tiny", "messages": []}))] {
        let r = post(addr, path, &body);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        assert_eq!(r.json()["done_reason"], "load", "{path}");
        assert_eq!(r.json()["done"], true, "{path}");
    }
}

#[test]
fn a_second_chat_turn_computes_only_its_new_tokens() {
    // Its own server: the metrics count this test's requests alone.
    let addr = start(64 << 20, ServerConfig::new("tiny"));
    let system = "You are a terse assistant who answers questions about caches. ".repeat(6);
    let mut msgs = vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": "What is a KV cache?"})];
    let opts = json!({"temperature": 0, "num_predict": 8});
    let r1 = post(addr, "/api/chat", &json!({"model": "tiny", "messages": msgs, "stream": false, "options": opts}));
    assert_eq!(r1.status, 200, "{}", r1.body);
    let p1 = r1.json()["prompt_eval_count"].as_u64().unwrap();
    let reused_before = metric(addr, "engram_prompt_tokens_reused_total");
    msgs.push(json!({"role": "assistant", "content": r1.json()["message"]["content"]}));
    msgs.push(json!({"role": "user", "content": "Why reuse it?"}));
    let r2 = post(addr, "/api/chat", &json!({"model": "tiny", "messages": msgs, "options": opts}));
    assert_eq!(r2.status, 200, "{}", r2.body);
    let last = lines(&r2).pop().unwrap();
    assert_last(&last, "length");
    let computed = last["prompt_eval_count"].as_u64().unwrap();
    let reused = metric(addr, "engram_prompt_tokens_reused_total") - reused_before;
    assert!(reused >= p1, "turn 2 reused {reused} tokens; turn 1's prompt alone was {p1}");
    // The whole second prompt, as Anthropic's count_tokens renders the same conversation.
    let total = post(addr, "/v1/messages/count_tokens", &json!({"model": "tiny", "system": system, "messages": msgs[1..]}));
    assert_eq!(total.status, 200, "{}", total.body);
    assert_eq!(computed + reused, total.json()["input_tokens"].as_u64().unwrap());
    assert!(computed < p1, "turn 2 computed {computed} tokens, more than turn 1's {p1}");

    // A named session through the header: the same request again computes one token.
    let named =
        json!({"model": "tiny", "messages": [{"role": "user", "content": "named ollama session"}], "stream": false, "options": opts});
    let a = request(addr, "POST", "/api/chat", &[("X-Session-Id", "olla-1")], &named.to_string());
    assert_eq!(a.header("x-session-id"), Some("olla-1"));
    let b = request(addr, "POST", "/api/chat", &[("X-Session-Id", "olla-1")], &named.to_string());
    assert_eq!(b.json()["prompt_eval_count"], 1, "{}", b.body);
}

#[test]
fn bad_input_is_a_4xx_naming_the_field_and_stores_nothing() {
    let addr = start(64 << 20, ServerConfig::new("tiny"));
    let user = json!([{"role": "user", "content": "hi"}]);
    let chat = |extra: Value| {
        let mut b = json!({"model": "tiny", "messages": user, "stream": false, "session_id": "bad-1"});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let long = "word ".repeat(5000);
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("malformed json", "/api/chat", "{\"messages\": [".into(), 400, "invalid JSON"),
        ("empty body", "/api/chat", "".into(), 400, "empty"),
        ("unknown model", "/api/chat", chat(json!({"model": "llama3.2"})), 404, "llama3.2"),
        ("unknown model (generate)", "/api/generate", json!({"model": "llama3.2", "prompt": "x"}).to_string(), 404, "llama3.2"),
        ("wrong type: stream", "/api/chat", chat(json!({"stream": "yes"})), 400, "stream"),
        ("wrong type: content", "/api/chat", chat(json!({"messages": [{"role": "user", "content": ["hi"]}]})), 400, "messages[0].content"),
        ("wrong type: options", "/api/chat", chat(json!({"options": "hot"})), 400, "options"),
        ("option type: temperature", "/api/chat", chat(json!({"options": {"temperature": "hot"}})), 400, "options.temperature"),
        ("option type: num_predict", "/api/chat", chat(json!({"options": {"num_predict": "many"}})), 400, "options.num_predict"),
        (
            "option type: seed",
            "/api/generate",
            json!({"model": "tiny", "prompt": "x", "options": {"seed": 1.5}}).to_string(),
            400,
            "options.seed",
        ),
        ("option type: stop", "/api/chat", chat(json!({"options": {"stop": 7}})), 400, "options.stop"),
        ("option value: temperature", "/api/chat", chat(json!({"options": {"temperature": 9}})), 400, "options.temperature"),
        ("option value: top_p", "/api/chat", chat(json!({"options": {"top_p": 0}})), 400, "options.top_p"),
        ("format not json", "/api/chat", chat(json!({"format": "yaml"})), 400, "format"),
        (
            "format schema that does not compile",
            "/api/generate",
            json!({"model": "tiny", "prompt": "x", "format": {"type": "nonsense"}}).to_string(),
            400,
            "format",
        ),
        ("tools not a list", "/api/chat", chat(json!({"tools": {"f": 1}})), 400, "tools"),
        (
            "tools on generate",
            "/api/generate",
            json!({"model": "tiny", "prompt": "x", "tools": [{"type": "function", "function": {"name": "f"}}]}).to_string(),
            400,
            "tools",
        ),
        ("think not a boolean", "/api/chat", chat(json!({"think": 3})), 400, "think"),
        (
            "images",
            "/api/chat",
            chat(json!({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]})),
            400,
            "messages[0].images",
        ),
        ("tool message answering no call", "/api/chat", chat(json!({"messages": [{"role": "tool", "content": "42"}]})), 400, "messages[0]"),
        ("suffix", "/api/generate", json!({"model": "tiny", "prompt": "x", "suffix": "y"}).to_string(), 400, "suffix"),
        ("context", "/api/generate", json!({"model": "tiny", "prompt": "x", "context": [1, 2]}).to_string(), 400, "context"),
        ("logprobs", "/api/chat", chat(json!({"logprobs": true})), 400, "logprobs"),
        ("bad session", "/api/chat", chat(json!({"session_id": "a/b"})), 400, "session_id"),
        ("prompt over context", "/api/generate", json!({"model": "tiny", "prompt": long}).to_string(), 400, "prompt"),
        ("messages over context", "/api/chat", chat(json!({"messages": [{"role": "user", "content": long}]})), 400, "messages"),
        ("embed without input", "/api/embed", json!({"model": "tiny"}).to_string(), 501, "embedder"),
        ("show unknown", "/api/show", json!({"model": "llama3.2"}).to_string(), 404, "llama3.2"),
    ];
    for (name, path, body, status, says) in cases {
        let r = request(addr, "POST", path, &[], &body);
        assert_eq!(r.status, status, "{name}: {}", r.body);
        let v = r.json();
        let e = v["error"].as_str().unwrap_or_else(|| panic!("{name}: Ollama's error is a string: {v}"));
        assert!(e.contains(says), "{name}: {e:?} should name {says:?}");
    }
    // Nothing was computed, cached or kept: the session named in every bad chat is new.
    assert_eq!(metric(addr, "engram_prompt_tokens_computed_total"), 0);
    assert_eq!(metric(addr, "engram_sessions_idle"), 0);
    let r = request(addr, "POST", "/api/chat", &[], &chat(json!({"options": {"temperature": 0, "num_predict": 2}})));
    assert_eq!(r.status, 200, "{}", r.body);
    let p = r.json()["prompt_eval_count"].as_u64().unwrap();
    assert!(p > 1, "the first good request computes its whole prompt ({p} tokens)");
    // A num_predict past the context is Ollama's "until the context ends", not an error.
    let r = request(
        addr,
        "POST",
        "/api/chat",
        &[],
        &chat(json!({"options": {"temperature": 0, "num_predict": 1_000_000}, "session_id": "fits"})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    // Unknown options and keep_alive are ignored, as Ollama does.
    let r = request(
        addr,
        "POST",
        "/api/chat",
        &[],
        &chat(json!({"options": {"num_predict": 2, "mirostat": 2, "num_ctx": 99, "x": {}}, "keep_alive": 0})),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn tags_show_ps_version_list_the_llm_and_the_encoder() {
    let (_, enc, addr) = with_encoder();
    let addr = *addr;
    let tags = request(addr, "GET", "/api/tags", &[], "");
    assert_eq!(tags.status, 200, "{}", tags.body);
    let models = tags.json()["models"].as_array().unwrap().clone();
    let names: Vec<&str> = models.iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["tiny", enc.id()]);
    for m in &models {
        assert_eq!(m["model"], m["name"]);
        assert!(m["modified_at"].as_str().unwrap().ends_with('Z'), "{m}");
        assert!(m["digest"].as_str().is_some_and(|d| !d.is_empty()), "{m}");
        for f in ["format", "family", "parameter_size", "quantization_level"] {
            assert!(m["details"][f].is_string(), "{f}: {m}");
        }
    }
    assert_eq!(models[0]["details"]["format"], "gguf");
    assert_eq!(models[0]["details"]["quantization_level"], "Q8_0");
    assert!(models[0]["size"].as_u64().unwrap() > 0);
    assert!(!tags.body.contains(".gguf"), "no file system paths: {}", tags.body);

    let show = post(addr, "/api/show", &json!({"model": "tiny:latest"}));
    assert_eq!(show.status, 200, "{}", show.body);
    let v = show.json();
    let family = v["details"]["family"].as_str().unwrap().to_string();
    assert_eq!(v["model_info"]["general.architecture"], family.as_str());
    assert_eq!(v["model_info"][format!("{family}.context_length")], model().config.max_positions);
    assert_eq!(v["capabilities"], json!(["completion"]));
    assert!(v["template"].as_str().is_some_and(|t| !t.is_empty()));
    let show = post(addr, "/api/show", &json!({"name": enc.id()}));
    assert_eq!(show.status, 200, "{}", show.body);
    assert_eq!(show.json()["capabilities"], json!(["embedding"]));
    assert_eq!(show.json()["model_info"]["bert.context_length"], enc.max_tokens());
    assert_eq!(show.json()["model_info"]["bert.embedding_length"], enc.dim());

    let ps = request(addr, "GET", "/api/ps", &[], "");
    assert_eq!(ps.status, 200, "{}", ps.body);
    let running = ps.json()["models"].as_array().unwrap().clone();
    assert_eq!(running.len(), 2);
    assert_eq!(running[0]["context_length"], model().config.max_positions);
    assert_eq!(running[1]["context_length"], enc.max_tokens());
    assert_eq!(running[0]["size_vram"], 0);
    assert!(running[0]["expires_at"].as_str().unwrap() > "2100", "{}", ps.body);

    // Model management is not this server's: a 404 in Ollama's shape that says so.
    let pull = post(addr, "/api/pull", &json!({"model": "llama3.2"}));
    assert_eq!(pull.status, 404, "{}", pull.body);
    assert!(pull.json()["error"].as_str().unwrap().contains("does not pull"), "{}", pull.body);
    let version = request(addr, "GET", "/api/version", &[], "");
    assert!(version.json()["version"].as_str().is_some_and(|v| v.split('.').count() == 3), "{}", version.body);
}

#[test]
fn embed_and_the_legacy_embeddings_route_equal_the_library() {
    let (_, enc, addr) = with_encoder();
    let texts = ["the cat sat on the mat.", "rust and python"];
    let want = enc.encode(&texts).unwrap();
    let floats = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect::<Vec<f32>>();
    let r = post(*addr, "/api/embed", &json!({"model": format!("{}:latest", enc.id()), "input": texts, "keep_alive": "1m", "options": {}}));
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["model"], enc.id());
    let got = v["embeddings"].as_array().unwrap();
    assert_eq!(got.len(), 2);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(floats(g), want.vectors[i], "input {i}");
    }
    assert_eq!(v["prompt_eval_count"], want.num_tokens.iter().sum::<usize>());
    assert!(v["total_duration"].is_u64());
    let one = post(*addr, "/api/embed", &json!({"model": enc.id(), "input": texts[0]}));
    assert_eq!(floats(&one.json()["embeddings"][0]), want.vectors[0]);

    let legacy = post(*addr, "/api/embeddings", &json!({"model": enc.id(), "prompt": texts[1]}));
    assert_eq!(legacy.status, 200, "{}", legacy.body);
    assert_eq!(floats(&legacy.json()["embedding"]), want.vectors[1]);

    // Too long with truncate=false, the wrong model, the wrong dimensions: named.
    let long = "word ".repeat(200);
    for (body, status, says) in [
        (json!({"model": enc.id(), "input": [texts[0], long], "truncate": false}), 400, "input[1]"),
        (json!({"model": "tiny", "input": "x"}), 404, "tiny"),
        (json!({"model": enc.id(), "input": "x", "dimensions": 3}), 400, "dimensions"),
        (json!({"model": enc.id(), "input": [1, 2]}), 400, "input"),
    ] {
        let r = post(*addr, "/api/embed", &body);
        assert_eq!(r.status, status, "{body}: {}", r.body);
        assert!(r.json()["error"].as_str().unwrap().contains(says), "{body}: {}", r.body);
    }
    let ok = post(*addr, "/api/embed", &json!({"model": enc.id(), "input": long, "truncate": true}));
    assert_eq!(ok.status, 200, "{}", ok.body);
}

#[test]
fn a_kv_refusal_is_the_responses_own_status_streamed_or_not() {
    // Two blocks of KV: a prompt that can never fit is refused as on the OpenAI routes,
    // before any NDJSON line is sent.
    let m = model();
    let block = engram_kv::KvPool::new(engram_kv::KvLayout::of(&m.config), engram_kv::KvFormat::F32, 0).block_bytes();
    let addr = start(2 * block, ServerConfig::new("tiny"));
    let long = "many words in a row ".repeat(40);
    for stream in [false, true] {
        let r = post(addr, "/api/chat", &json!({"model": "tiny", "messages": [{"role": "user", "content": long}], "stream": stream}));
        assert_eq!(r.status, 400, "stream {stream}: {}", r.body);
        assert!(r.json()["error"].as_str().unwrap().contains("bytes of KV cache"), "{}", r.body);
    }
    let r = post(addr, "/api/generate", &json!({"model": "tiny", "prompt": "short", "stream": false, "options": {"num_predict": 2}}));
    assert_eq!(r.status, 200, "{}", r.body);
}
