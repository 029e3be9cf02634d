//! End-to-end tests against a real server on 127.0.0.1:0 (the helpers and the
//! HTTP client are in `common`; the agents' tests in `agents.rs`).

use crate::common;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_server::{Server, ServerConfig, SessionsConfig};
use serde_json::{json, Value};

#[test]
fn chat_stream_equals_non_stream() {
    let addr = shared();
    let msgs = json!([{"role": "user", "content": "Tell me about caches, stream test"}]);
    let whole = chat(addr, &msgs, json!({}));
    let text = content(&whole);
    let v = whole.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["usage"]["completion_tokens"], 16);
    let r = chat(addr, &msgs, json!({"stream": true, "stream_options": {"include_usage": true}}));
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/event-stream"));
    let events = r.sse();
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let mut streamed = String::new();
    let mut finish = None;
    let mut usage = None;
    for (_, d) in &events[..events.len() - 1] {
        let c: Value = serde_json::from_str(d).unwrap();
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(ch) = c["choices"].as_array().and_then(|a| a.first()) {
            streamed.push_str(ch["delta"]["content"].as_str().unwrap_or(""));
            if !ch["finish_reason"].is_null() {
                finish = Some(ch["finish_reason"].as_str().unwrap().to_string());
            }
        }
        if !c["usage"].is_null() {
            usage = Some(c["usage"].clone());
        }
    }
    assert_eq!(streamed, text);
    assert_eq!(finish.as_deref(), Some("length"));
    assert_eq!(usage.unwrap()["completion_tokens"], 16);
}

#[test]
fn second_turn_reuses_the_history() {
    let addr = shared();
    let first = json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "History reuse: what is a KV cache?"}]);
    let r1 = chat(addr, &first, json!({}));
    let a1 = content(&r1);
    let p1 = r1.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    let mut second = first.as_array().unwrap().clone();
    second.push(json!({"role": "assistant", "content": a1}));
    second.push(json!({"role": "user", "content": "And why reuse it?"}));
    let r2 = chat(addr, &Value::Array(second), json!({}));
    assert_eq!(r2.status, 200, "{}", r2.body);
    let cached = r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(cached >= p1, "turn 2 reused {cached} tokens, turn 1's prompt alone was {p1}");
}

#[test]
fn named_session_is_reused_and_isolated() {
    let addr = shared();
    let msgs = json!([{"role": "user", "content": "named session check"}]);
    let r1 = chat(addr, &msgs, json!({"session_id": "named-1"}));
    assert_eq!(r1.status, 200);
    assert_eq!(r1.header("x-session-id"), Some("named-1"));
    let r2 = request(
        addr,
        "POST",
        "/v1/chat/completions",
        &[("X-Session-Id", "named-1")],
        &json!({"messages": msgs, "max_tokens": 4, "temperature": 0}).to_string(),
    );
    assert_eq!(r2.status, 200, "{}", r2.body);
    let p = r2.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), p - 1);
}

#[test]
fn bad_input_is_a_4xx_with_an_openai_error() {
    let addr = shared();
    let user = json!([{"role": "user", "content": "hi"}]);
    let long = "word ".repeat(5000);
    let cases: Vec<(&str, String, u16, Option<&str>)> = vec![
        ("malformed json", "{\"messages\": [".into(), 400, None),
        ("empty body", "".into(), 400, None),
        ("wrong type", json!({"messages": "hi"}).to_string(), 400, None),
        ("wrong field type", json!({"messages": user, "temperature": "hot"}).to_string(), 400, None),
        ("unknown model", json!({"model": "gpt-9", "messages": user}).to_string(), 404, Some("model")),
        ("empty messages", json!({"messages": []}).to_string(), 400, Some("messages")),
        ("bad role", json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string(), 400, Some("messages[0].role")),
        ("prompt over context", json!({"messages": [{"role": "user", "content": long}]}).to_string(), 400, Some("messages")),
        ("max_tokens over limit", json!({"messages": user, "max_tokens": 1_000_000}).to_string(), 400, Some("max_tokens")),
        ("max_tokens zero", json!({"messages": user, "max_tokens": 0}).to_string(), 400, Some("max_tokens")),
        ("negative temperature", json!({"messages": user, "temperature": -1}).to_string(), 400, Some("temperature")),
        ("top_p zero", json!({"messages": user, "top_p": 0}).to_string(), 400, Some("top_p")),
        ("n > 1", json!({"messages": user, "n": 2}).to_string(), 400, Some("n")),
        ("session with slash", json!({"messages": user, "session_id": "a/b"}).to_string(), 400, Some("session_id")),
        ("session with dots", json!({"messages": user, "session_id": ".."}).to_string(), 400, Some("session_id")),
        ("empty stop", json!({"messages": user, "stop": [""]}).to_string(), 400, Some("stop")),
        ("stop over 256 bytes", json!({"messages": user, "stop": ["x".repeat(257)]}).to_string(), 400, Some("stop")),
    ];
    for (name, body, status, param) in cases {
        let r = request(addr, "POST", "/v1/chat/completions", &[], &body);
        assert_eq!(r.status, status, "{name}: {}", r.body);
        let e = &r.json()["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{name}: {}", r.body);
        assert!(e["type"].is_string(), "{name}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{name}: {}", r.body);
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{name}: {}", r.body);
        }
    }
    let r = request(addr, "GET", "/v1/agents/..", &[], "");
    assert!(r.status == 400 || r.status == 404, "{}", r.body);
    let r = request(addr, "GET", "/nope", &[], "");
    assert_eq!(r.status, 404);
    assert!(r.json()["error"]["message"].is_string());
    // The unknown-model message says which ids exist.
    let r = request(addr, "POST", "/v1/chat/completions", &[], &json!({"model": "gpt-9", "messages": user}).to_string());
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("tiny"));
}

#[test]
fn concurrent_clients_get_what_a_lone_client_gets() {
    // Its own server, so other tests' sessions cannot interfere with timing.
    let addr = start(256 << 20, ServerConfig::new("tiny"));
    let (clients, turns) = (4usize, 3usize);
    let run = |c: usize| -> Vec<String> {
        let mut msgs = vec![json!({"role": "user", "content": format!("client {c} opens with a question about topic {}", c * 7)})];
        let mut answers = Vec::new();
        for t in 0..turns {
            let r = chat(addr, &Value::Array(msgs.clone()), json!({"max_tokens": 12 + 3 * c}));
            let a = content(&r);
            msgs.push(json!({"role": "assistant", "content": a}));
            msgs.push(json!({"role": "user", "content": format!("turn {t} follow-up from {c}")}));
            answers.push(a);
        }
        answers
    };
    let alone: Vec<Vec<String>> = (0..clients).map(run).collect();
    let together: Vec<Vec<String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..clients).map(|c| s.spawn(move || run(c))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(alone, together);
    let m = request(addr, "GET", "/metrics", &[], "").body;
    let hits: f64 = m.lines().find(|l| l.starts_with("engram_cache_hits_total ")).unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    assert!(hits > 0.0, "{m}");
}

#[test]
fn anthropic_messages_plain_and_streamed() {
    let addr = shared();
    let body = json!({"model": "tiny", "max_tokens": 8, "temperature": 0, "system": "Be brief.",
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "anthropic check"}]}]});
    let r = post(addr, "/v1/messages", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(v["type"], "message");
    assert_eq!(v["role"], "assistant");
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 8);
    let text = v["content"][0]["text"].as_str().unwrap().to_string();
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    let r = post(addr, "/v1/messages", &sb);
    assert_eq!(r.status, 200);
    let events = r.sse();
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_deref().unwrap()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names[1], "content_block_start");
    assert_eq!(&names[names.len() - 3..], &["content_block_stop", "message_delta", "message_stop"]);
    let streamed: String = events
        .iter()
        .filter(|(e, _)| e.as_deref() == Some("content_block_delta"))
        .map(|(_, d)| serde_json::from_str::<Value>(d).unwrap()["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, text);
    // Errors in Anthropic's shape.
    let r = post(addr, "/v1/messages", &json!({"max_tokens": 8, "messages": []}));
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["type"], "error");
    let r = post(addr, "/v1/messages", &json!({"messages": [{"role": "user", "content": "x"}]}));
    assert_eq!(r.status, 400, "max_tokens is required: {}", r.body);
}

#[test]
fn completions_models_health_metrics() {
    let addr = shared();
    let r = post(addr, "/v1/completions", &json!({"model": "tiny", "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["object"], "text_completion");
    assert_eq!(r.json()["usage"]["completion_tokens"], 5);
    let r = request(addr, "GET", "/v1/models", &[], "");
    assert_eq!(r.json()["data"][0]["id"], "tiny");
    assert_eq!(request(addr, "GET", "/health", &[], "").status, 200);
    let m = request(addr, "GET", "/metrics", &[], "").body;
    for name in [
        "engram_requests_total",
        "engram_cache_hits_total",
        "engram_cache_misses_total",
        "engram_prompt_tokens_reused_total",
        "engram_prompt_tokens_computed_total",
        "engram_time_to_first_token_seconds_bucket",
        "engram_inter_token_seconds_bucket",
        "engram_kv_bytes_used",
    ] {
        assert!(m.contains(name), "{name} missing from\n{m}");
    }
}

#[test]
fn api_keys_map_to_tenants() {
    let mut config = ServerConfig::new("tiny");
    config.api_keys = vec![("k1".into(), "alice".into()), ("k2".into(), "bob".into())];
    let addr = start(64 << 20, config);
    let body = json!({"messages": [{"role": "user", "content": "tenant isolation"}], "max_tokens": 3, "temperature": 0}).to_string();
    assert_eq!(request(addr, "POST", "/v1/chat/completions", &[], &body).status, 401);
    assert_eq!(request(addr, "POST", "/v1/chat/completions", &[("Authorization", "Bearer nope")], &body).status, 401);
    let a1 = request(addr, "POST", "/v1/chat/completions", &[("Authorization", "Bearer k1")], &body);
    assert_eq!(a1.status, 200, "{}", a1.body);
    // Bob sends the same prompt: nothing of Alice's cache is visible to him.
    let b1 = request(addr, "POST", "/v1/chat/completions", &[("x-api-key", "k2")], &body);
    assert_eq!(b1.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let a2 = request(addr, "POST", "/v1/chat/completions", &[("Authorization", "Bearer k1")], &body);
    assert!(a2.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0);
}

#[test]
/// A prompt larger than the whole KV budget is a 400 naming the bytes it
/// needs and the budget (a 503 with Retry-After would have clients retry in vain).
fn a_prompt_that_can_never_fit_is_a_400_naming_the_bytes() {
    // Two blocks of KV: 64 tokens.
    let m = model();
    let block = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 0).block_bytes();
    let addr =
        start(2 * block, ServerConfig { sessions: SessionsConfig { max_sessions: 4, ..Default::default() }, ..ServerConfig::new("tiny") });
    let long = "many words in a row ".repeat(40);
    let r = chat(addr, &json!([{"role": "user", "content": long}]), json!({}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.header("retry-after").is_none());
    let message = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(message.contains("bytes of KV cache") && message.contains(&format!("budget of {} bytes", 2 * block)), "{message}");
    // A small one still works, and the server keeps serving.
    let r = chat(addr, &json!([{"role": "user", "content": "short"}]), json!({"max_tokens": 4}));
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
/// Prompts that each extend the last, under a budget of four blocks: every one is served
/// (streamed or not), since what the pool holds besides it is idle caches that can go. A
/// reservation must ask eviction for what it charges (its new blocks, a copy of a shared
/// partial block), not for a looser bound the pool could never free.
fn a_prompt_that_fits_once_idle_caches_go_is_served() {
    let m = model();
    let block = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 0).block_bytes();
    let addr = start(4 * block, ServerConfig::new("tiny"));
    let mut longest = 0;
    for words in 1..=40 {
        for stream in [false, true] {
            let text = "word ".repeat(words);
            let r = chat(addr, &json!([{"role": "user", "content": text}]), json!({"max_tokens": 2, "stream": stream}));
            assert_eq!(r.status, 200, "{words} words, stream {stream}: {}", r.body);
            if stream {
                assert!(r.sse().iter().any(|(_, d)| d == "[DONE]"), "{}", r.body);
            } else {
                longest = r.json()["usage"]["prompt_tokens"].as_u64().unwrap();
            }
        }
    }
    assert!(longest > 64, "the last prompts need three of the four blocks ({longest} tokens)");
}

#[test]
fn a_dropped_client_cancels_its_sequence() {
    let addr = start(64 << 20, ServerConfig::new("tiny"));
    let mut s = TcpStream::connect(addr).unwrap();
    let body = json!({"messages": [{"role": "user", "content": "cancel me"}], "max_tokens": 4000, "temperature": 0, "ignore_eos": true, "stream": true}).to_string();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
    drop(s);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let m = request(addr, "GET", "/metrics", &[], "").body;
        let gauge = |name: &str| -> f64 { m.lines().find(|l| l.starts_with(name)).unwrap().rsplit(' ').next().unwrap().parse().unwrap() };
        if gauge("engram_cancelled_total ") >= 1.0 && gauge("engram_sequences_running ") == 0.0 {
            assert!(gauge("engram_generated_tokens_total ") < 4000.0);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not cancelled:\n{m}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn decoding_sequences_share_steps() {
    // Through the engine handle directly: 4 requests submitted together must
    // be decoded in shared forward steps, not one after another.
    let m = model();
    let pool = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 64 << 20);
    let server = Server::start(m.clone(), pool, ServerConfig::new("tiny"));
    let engine = server.engine();
    let params = engram_engine::SamplingParams { max_tokens: 32, ignore_eos: true, ..Default::default() };
    let rxs: Vec<_> = (0..4u32)
        .map(|i| {
            engine
                .submit(engram_server::Job {
                    owner: format!("t{i}").into(),
                    session: None,
                    text: None,
                    add_special: false,
                    prompt: vec![1, 100 + i, 200 + i, 300 + i],
                    params: params.clone(),
                    pinned: false,
                    long_context_after: None,
                })
                .unwrap()
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut total = 0;
    for mut rx in rxs {
        rt.block_on(async {
            while let Some(ev) = rx.recv().await {
                if let engram_server::Event::Finished { completion_tokens, .. } = ev {
                    total += completion_tokens;
                }
            }
        });
    }
    assert_eq!(total, 4 * 32);
    let steps = server.metrics().steps.load(std::sync::atomic::Ordering::Relaxed);
    assert!(steps < 2 * 32 + 8, "{steps} steps for 4 x 32 tokens: not batched");
}

/// A session file damaged on disk between two runs: the restarted server
/// restores it (its header is sound), prefills on it while the checksum runs,
/// finds the damage before the first token, and answers from a cold prefill:
/// the same answer as a server without a cache, no cached tokens reported,
/// the file deleted and the failure counted.
#[test]
fn a_damaged_session_file_is_recomputed_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let config = || persisting(dir.path(), engram_kv::EvictionPolicy::Lru);
    let ask = |addr, messages: &Vec<Value>| {
        let body = json!({"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0}).to_string();
        let r = request(addr, "POST", "/v1/chat/completions", &[], &body);
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let (addr, stop, thread) = start_stoppable(config());
    let mut messages = vec![json!({"role": "user", "content": "Remember: the code word is heron, and the gate is 14."})];
    let r = ask(addr, &messages);
    messages.push(json!({"role": "assistant", "content": r["choices"][0]["message"]["content"]}));
    stop.send(()).unwrap();
    thread.join().unwrap();
    let files = session_files(dir.path());
    assert_eq!(files.len(), 1);
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let at = bytes.len() - 64;
    bytes[at] ^= 0x10;
    std::fs::write(&files[0], &bytes).unwrap();

    messages.push(json!({"role": "user", "content": "What was the code word?"}));
    let (addr, stop, thread) = start_stoppable(config());
    let r = ask(addr, &messages);
    assert_eq!(r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), 0, "nothing reused from the damaged file");
    assert_eq!(metric(addr, "engram_restores_failed_total"), 1.0);
    let lookups = request(addr, "GET", "/metrics", &[], "").body;
    let counted: f64 = lookups
        .lines()
        .filter(|l| l.starts_with("engram_cache_lookups_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(counted, 1.0, "one request, one lookup (the failed restore's admission is taken back)\n{lookups}");
    assert_eq!(metric(addr, "engram_cache_misses_total"), 1.0);
    assert_eq!(metric(addr, "engram_cache_hits_total"), 0.0);
    assert_eq!(metric(addr, "engram_sessions_restored"), 0.0);
    assert!(!files[0].exists() || std::fs::read(&files[0]).unwrap() != bytes, "the damaged file is gone");
    let answer = r["choices"][0]["message"]["content"].clone();
    stop.send(()).unwrap();
    thread.join().unwrap();

    let (cold, stop, thread) = start_stoppable(ServerConfig::new("tiny"));
    assert_eq!(ask(cold, &messages)["choices"][0]["message"]["content"], answer, "the answer equals a cold server's");
    stop.send(()).unwrap();
    thread.join().unwrap();
}

/// Three turns, stop, start a new server on the same data directory: the
/// fourth turn is a warm hit restored from disk, visible in `usage` and `/metrics`,
/// and its answer equals what a server without any cache gives.
#[test]
fn a_restarted_server_restores_the_conversation_from_disk() {
    let dir = tempfile::tempdir().unwrap();
    let config = || persisting(dir.path(), engram_kv::EvictionPolicy::Weighted);
    let (addr, stop, thread) = start_stoppable(config());
    let mut messages = vec![json!({"role": "system", "content": "You remember everything the user says."})];
    let ask = |addr, messages: &Vec<Value>| {
        let r = request(
            addr,
            "POST",
            "/v1/chat/completions",
            &[],
            &json!({"model": "tiny", "messages": messages, "max_tokens": 8, "temperature": 0}).to_string(),
        );
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    for turn in 0..3 {
        messages.push(json!({"role": "user", "content": format!("Turn {turn}: remember the number {}.", 7 * turn + 3)}));
        let r = ask(addr, &messages);
        if turn > 0 {
            assert!(r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() > 0);
        }
        messages.push(json!({"role": "assistant", "content": r["choices"][0]["message"]["content"]}));
    }
    stop.send(()).unwrap();
    thread.join().unwrap();
    assert!(!session_files(dir.path()).is_empty());

    let (addr, stop, thread) = start_stoppable(config());
    messages.push(json!({"role": "user", "content": "Which numbers did I tell you?"}));
    let r = ask(addr, &messages);
    let cached = r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let prompt = r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached * 2 > prompt, "warm hit: {cached} of {prompt} prompt tokens from disk");
    assert_eq!(metric(addr, "engram_sessions_restored"), 1.0);
    assert_eq!(metric(addr, "engram_cache_lookups_total{path=\"extend\"}"), 1.0);
    let warm_answer = r["choices"][0]["message"]["content"].clone();
    stop.send(()).unwrap();
    thread.join().unwrap();

    // A server that never restarted, fed the same turns, answers the same from RAM.
    let (hot, stop, thread) = start_stoppable(ServerConfig::new("tiny"));
    let mut replay = vec![messages[0].clone()];
    for turn in 0..4 {
        replay.push(messages[1 + 2 * turn].clone());
        let r = ask(hot, &replay);
        if turn < 3 {
            assert_eq!(r["choices"][0]["message"]["content"], messages[2 + 2 * turn]["content"], "greedy turns replay identically");
            replay.push(messages[2 + 2 * turn].clone());
        } else {
            assert_eq!(
                r["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(),
                cached,
                "hot and warm reuse the same tokens"
            );
            assert_eq!(r["choices"][0]["message"]["content"], warm_answer, "warm (restored) equals hot (in memory)");
        }
    }
    stop.send(()).unwrap();
    thread.join().unwrap();
}

/// A session persisted by a server with exact attention is not reused by one running the same
/// model file with bf16 attention on the same data directory (their caches differ, so do their
/// fingerprints), and the bf16 server answers as a cold one does; its own session is then
/// reused by its own restart.
#[test]
fn another_attention_precision_never_reuses_a_persisted_session() {
    let dir = tempfile::tempdir().unwrap();
    let config = || persisting(dir.path(), engram_kv::EvictionPolicy::Weighted);
    let turn1 = json!([{"role": "user", "content": "Remember the number 42 for me."}]);
    let (addr, stop, thread) = start_stoppable(config());
    let first = chat(addr, &turn1, json!({"max_tokens": 6}));
    assert_eq!(first.status, 200, "{}", first.body);
    stop.send(()).unwrap();
    thread.join().unwrap();
    assert!(!session_files(dir.path()).is_empty());

    let bf16 = || Arc::new(Model::load(&fixture().1).unwrap().with_attention(engram_model::AttentionPrecision::Bf16));
    let turn2 = json!([
        {"role": "user", "content": "Remember the number 42 for me."},
        {"role": "assistant", "content": content(&first)},
        {"role": "user", "content": "Which number was it?"}
    ]);
    let cached = |r: &Resp| r.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    let (addr, stop, thread) = start_stoppable_with(bf16(), config());
    let warm = chat(addr, &turn2, json!({"max_tokens": 6}));
    assert_eq!(warm.status, 200, "{}", warm.body);
    assert_eq!(cached(&warm), 0, "an exact session reused by a bf16 server");
    assert_eq!(metric(addr, "engram_sessions_restored"), 0.0);
    stop.send(()).unwrap();
    thread.join().unwrap();
    let (cold, stop, thread) = start_stoppable_with(bf16(), ServerConfig::new("tiny"));
    assert_eq!(content(&chat(cold, &turn2, json!({"max_tokens": 6}))), content(&warm), "bf16 answer = a cold bf16 server's");
    stop.send(()).unwrap();
    thread.join().unwrap();

    // The bf16 server's own session is found by its own restart.
    let (addr, stop, thread) = start_stoppable_with(bf16(), config());
    let again = chat(addr, &turn2, json!({"max_tokens": 6}));
    assert!(cached(&again) > 0, "a bf16 session not reused by a bf16 restart");
    assert_eq!(content(&again), content(&warm));
    stop.send(()).unwrap();
    thread.join().unwrap();
}

/// A completion sent as token ids on a named session is kept without text
/// (the ids' text is unknown). A later text request on that session must not match those
/// tokens by characters — the empty text made every one of them "end inside the common
/// part", so the request EXTENDed them and the model saw the ids, then the whole text. It
/// reuses none of them and answers as a cold server does.
#[test]
fn a_text_request_never_extends_a_session_built_from_token_ids() {
    let addr = start(64 << 20, ServerConfig::new("tiny"));
    let ids = model().tokenizer.encode("The cache keeps every", true).unwrap().ids;
    let r = post(addr, "/v1/completions", &json!({"prompt": ids, "max_tokens": 4, "temperature": 0, "session_id": "mixed"}));
    assert_eq!(r.status, 200, "{}", r.body);
    let text = json!({"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0, "ignore_eos": true});
    let mut named = text.clone();
    named["session_id"] = json!("mixed");
    let r = post(addr, "/v1/completions", &named);
    assert_eq!(r.status, 200, "{}", r.body);
    let usage = &r.json()["usage"];
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0, "the token-id session's tokens were reused: {usage}");
    let cold = post(start(64 << 20, ServerConfig::new("tiny")), "/v1/completions", &text);
    assert_eq!(r.json()["choices"][0]["text"], cold.json()["choices"][0]["text"], "not what a cold server answers");
    assert_eq!(usage["prompt_tokens"], cold.json()["usage"]["prompt_tokens"]);
}
