//! `engram serve --context dual` through every generation route: OpenAI's chat, Anthropic's
//! messages (the user from `metadata.user_id`), an agent's generate (the agent as the user)
//! and Ollama's chat each take only the new turn into the ring, so one conversation answers
//! the same through all of them and every turn's prompt is that turn alone, never the
//! history again; the raw-text routes are 400s that say why.

use crate::common;
use common::*;
use engram_server::{ContextMode, ServerConfig};
use serde_json::{json, Value};

const SYSTEM: &str = "You answer in one line.";
const TURNS: [&str; 4] = ["What is a KV cache?", "And eviction?", "Why whole turns?", "Thanks!"];

fn dual() -> ServerConfig {
    ServerConfig {
        context: ContextMode::Dual { ring_tokens: 4096, threshold: 0.6, keep_last: 1, persistent_cap: 512, summary_target: 300 },
        ..ServerConfig::new("tiny")
    }
}

/// One turn's answer and the prompt tokens the engine was given for it.
type Turn = (String, u64);

/// Runs the conversation, each request carrying the whole history as clients do; `ask` sends
/// the history (without the system message) and returns the answer and its prompt tokens.
fn converse(mut ask: impl FnMut(&Value) -> Turn) -> Vec<Turn> {
    let mut history = Vec::new();
    let mut out = Vec::new();
    for t in TURNS {
        history.push(json!({"role": "user", "content": t}));
        let (answer, prompt) = ask(&Value::Array(history.clone()));
        history.push(json!({"role": "assistant", "content": answer.clone()}));
        out.push((answer, prompt));
    }
    out
}

fn openai(addr: std::net::SocketAddr, user: &str) -> Vec<Turn> {
    converse(|history| {
        let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
        messages.extend(history.as_array().unwrap().iter().cloned());
        let r = chat(addr, &Value::Array(messages), json!({"user": user, "thread_id": "t1"}));
        (content(&r), r.json()["usage"]["prompt_tokens"].as_u64().unwrap())
    })
}

fn anthropic(addr: std::net::SocketAddr, user: &str) -> Vec<Turn> {
    converse(|history| {
        let body = json!({"model": "tiny", "max_tokens": 16, "temperature": 0, "system": SYSTEM, "messages": history,
                          "metadata": {"user_id": user}, "thread_id": "t1"});
        let r = post(addr, "/v1/messages", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        let u = &v["usage"];
        let prompt = u["input_tokens"].as_u64().unwrap() + u["cache_read_input_tokens"].as_u64().unwrap();
        (v["content"][0]["text"].as_str().unwrap().to_string(), prompt)
    })
}

fn agent(addr: std::net::SocketAddr, id: &str) -> Vec<Turn> {
    let r = post(addr, "/v1/agents", &json!({"id": id, "system": SYSTEM}));
    assert_eq!(r.status, 201, "{}", r.body);
    converse(|history| {
        let body = json!({"messages": history, "max_tokens": 16, "temperature": 0});
        let r = post(addr, &format!("/v1/agents/{id}/generate"), &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        (v["text"].as_str().unwrap().to_string(), v["usage"]["prompt_tokens"].as_u64().unwrap())
    })
}

fn ollama(addr: std::net::SocketAddr, user: &str) -> Vec<Turn> {
    converse(|history| {
        let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
        messages.extend(history.as_array().unwrap().iter().cloned());
        let body = json!({"model": "tiny", "messages": messages, "stream": false, "user": user, "thread_id": "t1",
                          "options": {"temperature": 0, "num_predict": 16}});
        let r = post(addr, "/api/chat", &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        (v["message"]["content"].as_str().unwrap().to_string(), v["prompt_eval_count"].as_u64().unwrap())
    })
}

#[test]
fn every_chat_route_keeps_each_turn_once_and_answers_the_same() {
    let addr = start(64 << 20, dual());
    let want = openai(addr, "ann");
    // Each turn's prompt is the turn alone: later turns are no longer than the first by more
    // than the previous answer's closing, whatever the history's length.
    let first = want[0].1;
    for (i, (_, prompt)) in want.iter().enumerate().skip(1) {
        assert!(*prompt < first + 8, "turn {i}: the prompt is {prompt} tokens; the first was {first}");
    }
    for (route, got) in [("anthropic", anthropic(addr, "bob")), ("agent", agent(addr, "cy"))] {
        assert_eq!(got, want, "{route}: the same answers from the same prompt tokens as /v1/chat/completions");
    }
    // Ollama reports the prompt tokens computed (`prompt_eval_count`), at most the prompt's.
    let got = ollama(addr, "dee");
    for (i, ((a, computed), (b, prompt))) in got.iter().zip(&want).enumerate() {
        assert_eq!(a, b, "ollama: turn {i}'s answer");
        assert!(computed <= prompt, "ollama: turn {i} computed {computed} tokens; the prompt is {prompt}");
    }
    assert_eq!(metric(addr, "engram_turns_evicted_total"), 0.0);
}

#[test]
fn an_agents_second_thread_starts_from_its_anchors_alone() {
    let addr = start(64 << 20, dual());
    agent(addr, "ag");
    let body = json!({"messages": [{"role": "user", "content": TURNS[0]}], "max_tokens": 16, "temperature": 0, "thread_id": "side"});
    let side = post(addr, "/v1/agents/ag/generate", &body);
    assert_eq!(side.status, 200, "{}", side.body);
    // A fresh user's first turn with the same system prompt: the same answer.
    let fresh = openai(addr, "new");
    assert_eq!(side.json()["text"].as_str().unwrap(), fresh[0].0);
    // Deleting the agent forgets its stream and threads: a new agent of that id starts cold.
    let r = request(addr, "DELETE", "/v1/agents/ag", &[], "");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(agent(addr, "ag"), fresh);
}

#[test]
fn raw_text_routes_refuse_dual_stream_contexts_saying_why() {
    let addr = start(64 << 20, dual());
    let r = post(addr, "/v1/completions", &json!({"model": "tiny", "prompt": "def f(", "max_tokens": 4}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "prompt", "{}", r.body);
    assert!(r.body.contains("no turns"), "{}", r.body);
    let r = post(addr, "/api/generate", &json!({"model": "tiny", "prompt": "def f(", "raw": true, "stream": false}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("no turns"), "{}", r.body);
    // The templated /api/generate is one user turn, as a chat's.
    let r = post(addr, "/api/generate", &json!({"model": "tiny", "prompt": "hi", "stream": false, "options": {"num_predict": 4}}));
    assert_eq!(r.status, 200, "{}", r.body);
}
