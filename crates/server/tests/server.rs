//! End-to-end tests against a real server on 127.0.0.1:0, over a tiny
//! HTTP/1.1 client on `std::net::TcpStream` (no client crate in the tree).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use engram_fixture::{GgufFormat, Shape};
use engram_kv::{KvFormat, KvLayout, KvPool};
use engram_model::Model;
use engram_server::{SchedulerConfig, Server, ServerConfig};
use serde_json::{json, Value};

/// The tiny fixture's Q8_0 GGUF (generated once per test binary) and the model loaded from it.
fn fixture() -> &'static (tempfile::TempDir, std::path::PathBuf, Arc<Model>) {
    static M: OnceLock<(tempfile::TempDir, std::path::PathBuf, Arc<Model>)> = OnceLock::new();
    M.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let files =
            engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
        let path = files.gguf(GgufFormat::Q8_0).unwrap().to_path_buf();
        let m = Model::load(&path).unwrap();
        (dir, path, Arc::new(m))
    })
}

fn model() -> Arc<Model> {
    fixture().2.clone()
}

/// Starts a server on its own runtime thread; returns its address.
fn start(budget_bytes: usize, config: ServerConfig) -> SocketAddr {
    let model = model();
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F32, budget_bytes);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let server = Server::start(model, pool, config);
            server.serve(listener, std::future::pending(), Duration::from_secs(1)).await.unwrap();
        });
    });
    rx.recv().unwrap()
}

fn shared() -> SocketAddr {
    static A: OnceLock<SocketAddr> = OnceLock::new();
    *A.get_or_init(|| start(256 << 20, ServerConfig::new("tiny")))
}

struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Resp {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
    /// `data:` payloads of an SSE body, with their `event:` names.
    fn sse(&self) -> Vec<(Option<String>, String)> {
        let mut out = Vec::new();
        for block in self.body.split("\n\n") {
            let mut ev = None;
            let mut data = None;
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event: ") {
                    ev = Some(e.to_string());
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data = Some(d.to_string());
                }
            }
            if let Some(d) = data {
                out.push((ev, d));
            }
        }
        out
    }
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(std::str::from_utf8(&raw[..eol]).unwrap().trim(), 16).unwrap();
        if size == 0 {
            break;
        }
        out.extend_from_slice(&raw[eol + 2..eol + 2 + size]);
        raw = &raw[eol + 2 + size + 2..];
    }
    out
}

fn request(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    if !body.is_empty() {
        req.push_str("Content-Type: application/json\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("header end");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers: Vec<(String, String)> = lines.filter_map(|l| l.split_once(": ").map(|(k, v)| (k.to_string(), v.to_string()))).collect();
    let mut body = raw[split + 4..].to_vec();
    if headers.iter().any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked")) {
        body = dechunk(&body);
    }
    Resp { status, headers, body: String::from_utf8(body).unwrap() }
}

fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(addr, "POST", path, &[], &body.to_string())
}

fn chat(addr: SocketAddr, messages: &Value, extra: Value) -> Resp {
    let mut body = json!({"model": "tiny", "messages": messages, "max_tokens": 16, "temperature": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    post(addr, "/v1/chat/completions", &body)
}

fn content(r: &Resp) -> String {
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

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
fn agents_have_their_own_cache() {
    let addr = shared();
    let r = post(addr, "/v1/agents", &json!({"id": "planner", "system": "You plan."}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(post(addr, "/v1/agents", &json!({"id": "planner"})).status, 409);
    assert_eq!(post(addr, "/v1/agents", &json!({"id": "a/b"})).status, 400);
    let list = request(addr, "GET", "/v1/agents", &[], "").json();
    assert!(list["data"].as_array().unwrap().iter().any(|a| a["id"] == "planner"));
    let g = |prompt: &str| post(addr, "/v1/agents/planner/generate", &json!({"prompt": prompt, "max_tokens": 4, "temperature": 0}));
    let r1 = g("plan the day");
    assert_eq!(r1.status, 200, "{}", r1.body);
    let r2 = g("plan the day");
    let p = r2.json()["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), p - 1);
    assert_eq!(request(addr, "GET", "/v1/agents/planner", &[], "").status, 200);
    assert_eq!(request(addr, "DELETE", "/v1/agents/planner", &[], "").status, 200);
    assert_eq!(request(addr, "GET", "/v1/agents/planner", &[], "").status, 404);
    assert_eq!(g("plan the day").status, 404);
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
fn a_prompt_that_can_never_fit_gets_503_with_retry_after() {
    // Two blocks of KV: 64 tokens.
    let m = model();
    let block = KvPool::new(KvLayout::of(&m.config), KvFormat::F32, 0).block_bytes();
    let addr = start(
        2 * block,
        ServerConfig { scheduler: SchedulerConfig { max_sessions: 4, ..Default::default() }, ..ServerConfig::new("tiny") },
    );
    let long = "many words in a row ".repeat(40);
    let r = chat(addr, &json!([{"role": "user", "content": long}]), json!({}));
    assert_eq!(r.status, 503, "{}", r.body);
    assert!(r.header("retry-after").is_some());
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("KV"));
    // A small one still works, and the server keeps serving.
    let r = chat(addr, &json!([{"role": "user", "content": "short"}]), json!({"max_tokens": 4}));
    assert_eq!(r.status, 200, "{}", r.body);
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
                    tenant: format!("t{i}"),
                    session: None,
                    text: None,
                    add_special: false,
                    prompt: vec![1, 100 + i, 200 + i, 300 + i],
                    params: params.clone(),
                    pinned: false,
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

/// Starts a server that stops when `stop` is sent; joining the thread waits
/// for its shutdown (engine finished, sessions flushed to disk).
fn start_stoppable(config: ServerConfig) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, std::thread::JoinHandle<()>) {
    start_stoppable_with(model(), config)
}

/// [`start_stoppable`] with another model (e.g. the same file at another attention precision).
fn start_stoppable_with(
    model: Arc<Model>,
    config: ServerConfig,
) -> (SocketAddr, tokio::sync::oneshot::Sender<()>, std::thread::JoinHandle<()>) {
    let pool = KvPool::new(KvLayout::of(&model.config), KvFormat::F16, 64 << 20);
    let (tx, rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let t = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            let server = Server::start(model, pool, config);
            server
                .serve(
                    listener,
                    async {
                        let _ = stop_rx.await;
                    },
                    Duration::from_secs(5),
                )
                .await
                .unwrap();
        });
    });
    (rx.recv().unwrap(), stop_tx, t)
}

/// A server config that persists sessions (and agents) under `<dir>/kv`, 256 MiB.
fn persisting(dir: &std::path::Path, policy: engram_kv::EvictionPolicy) -> ServerConfig {
    let mut c = ServerConfig::new("tiny");
    c.scheduler.disk = Some(engram_server::DiskConfig { dir: dir.join("kv"), budget_bytes: 256 << 20, policy });
    c
}

/// The session entry files a [`persisting`] server keeps under `<dir>/kv`.
fn session_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir.join("kv"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("session-"))
        .collect()
}

fn metric(addr: SocketAddr, line_prefix: &str) -> f64 {
    let m = request(addr, "GET", "/metrics", &[], "").body;
    m.lines().find(|l| l.starts_with(line_prefix)).and_then(|l| l.rsplit(' ').next()).map_or(0.0, |v| v.parse().unwrap())
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

/// An agent made before a restart is still there after it, with its cached
/// session restored from disk (the same answer, the prompt taken from the
/// cache); deleting it deletes its session file, and it stays deleted after
/// the next restart.
#[test]
fn agents_and_their_sessions_survive_a_restart_and_deletion_removes_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = || persisting(dir.path(), engram_kv::EvictionPolicy::Lru);
    let g = |addr| {
        let r = post(addr, "/v1/agents/planner/generate", &json!({"prompt": "plan the day", "max_tokens": 6, "temperature": 0}));
        assert_eq!(r.status, 200, "{}", r.body);
        r.json()
    };
    let (addr, stop, thread) = start_stoppable(config());
    assert_eq!(post(addr, "/v1/agents", &json!({"id": "planner", "name": "Planner", "system": "You plan."})).status, 201);
    let first = g(addr);
    stop.send(()).unwrap();
    thread.join().unwrap();
    assert_eq!(session_files(dir.path()).len(), 1);

    let (addr, stop, thread) = start_stoppable(config());
    let agent = request(addr, "GET", "/v1/agents/planner", &[], "").json();
    assert_eq!((agent["name"].as_str(), agent["system"].as_str()), (Some("Planner"), Some("You plan.")));
    let again = g(addr);
    let p = again["usage"]["prompt_tokens"].as_u64().unwrap();
    assert_eq!(again["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap(), p - 1, "restored from disk");
    assert_eq!(metric(addr, "engram_sessions_restored"), 1.0);
    assert_eq!(again["text"], first["text"], "restored answers as the first run did");
    assert_eq!(request(addr, "DELETE", "/v1/agents/planner", &[], "").status, 200);
    stop.send(()).unwrap();
    thread.join().unwrap();
    assert_eq!(session_files(dir.path()).len(), 0, "the deleted agent's session file is gone");

    let (addr, stop, thread) = start_stoppable(config());
    assert_eq!(request(addr, "GET", "/v1/agents/planner", &[], "").status, 404);
    assert_eq!(request(addr, "GET", "/v1/agents", &[], "").json()["data"].as_array().unwrap().len(), 0);
    stop.send(()).unwrap();
    thread.join().unwrap();
}

/// A named agent's session is pinned on disk: under a disk budget that holds
/// only some sessions, the least recently used (LRU policy) are evicted as
/// chats come in — but never the agent's, though it is the oldest — and
/// `engram cache ls` would show it pinned.
#[test]
fn an_agents_session_is_pinned_on_disk_and_outlives_newer_chats() {
    let dir = tempfile::tempdir().unwrap();
    let config = |budget: u64| {
        let mut c = persisting(dir.path(), engram_kv::EvictionPolicy::Lru);
        c.scheduler.disk.as_mut().unwrap().budget_bytes = budget;
        c
    };
    let (addr, stop, thread) = start_stoppable(config(256 << 20));
    assert_eq!(post(addr, "/v1/agents", &json!({"id": "keeper", "system": "You keep notes."})).status, 201);
    let r = post(addr, "/v1/agents/keeper/generate", &json!({"prompt": "note: milk", "max_tokens": 4, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    stop.send(()).unwrap();
    thread.join().unwrap();
    let files = session_files(dir.path());
    assert_eq!(files.len(), 1);
    let (agent_file, agent_bytes) = (files[0].clone(), std::fs::metadata(&files[0]).unwrap().len());
    // Strictly the least recently used entry from here on (the store's clock has 1 s steps).
    std::thread::sleep(std::time::Duration::from_millis(1100));

    // Room for the agent (two blocks: its system prompt) and one or two chats (one block each).
    let (addr, stop, thread) = start_stoppable(config(agent_bytes * 2));
    for i in 0..4 {
        let r = chat(
            addr,
            &json!([{"role": "user", "content": format!("chat {i}")}]),
            json!({"max_tokens": 4, "session_id": format!("chat-{i}")}),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    stop.send(()).unwrap();
    thread.join().unwrap();
    let files = session_files(dir.path());
    assert!(files.len() < 4, "the budget forced too few evictions: {files:?}");
    assert!(files.contains(&agent_file), "the pinned agent session was evicted: {files:?}");
    let store = engram_kv::disk::DiskStore::open(dir.path().join("kv"), u64::MAX, engram_kv::EvictionPolicy::Lru).unwrap();
    let pinned: Vec<_> = store.list().into_iter().filter(|e| e.pinned).map(|e| e.owner).collect();
    assert_eq!(pinned.len(), 1, "exactly the agent's session is pinned: {pinned:?}");
    assert!(pinned[0].contains("agent:keeper"), "{pinned:?}");
}

/// An agent deleted while one of its requests is generating: the request
/// finishes, but its cache is not kept (nothing on disk once the server
/// stopped), and requests for it after the delete are 404.
#[test]
fn an_agent_deleted_mid_generation_leaves_no_cache() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, stop, thread) = start_stoppable(persisting(dir.path(), engram_kv::EvictionPolicy::Lru));
    assert_eq!(post(addr, "/v1/agents", &json!({"id": "scribe", "system": "You write."})).status, 201);
    let long = std::thread::spawn(move || {
        post(addr, "/v1/agents/scribe/generate", &json!({"prompt": "write", "max_tokens": 3000, "ignore_eos": true, "temperature": 0}))
    });
    let t0 = std::time::Instant::now();
    while metric(addr, "engram_sequences_running") < 1.0 {
        assert!(t0.elapsed() < Duration::from_secs(60), "the generation never started");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(request(addr, "DELETE", "/v1/agents/scribe", &[], "").status, 200);
    let r = long.join().unwrap();
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["completion_tokens"], 3000, "it ran to the end after the delete");
    let again = post(addr, "/v1/agents/scribe/generate", &json!({"prompt": "write", "max_tokens": 1}));
    assert_eq!(again.status, 404);
    stop.send(()).unwrap();
    thread.join().unwrap();
    let files = session_files(dir.path());
    assert!(files.is_empty(), "the deleted agent's cache was written: {files:?}");
}
