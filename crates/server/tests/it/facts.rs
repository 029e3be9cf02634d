//! `/v1/users/{id}/facts` end to end: a fact is in the context every
//! thread of its user attends (the answer equals one whose system messages spell the fact
//! out); a superseded fact is tombstoned and, once the stream passes its cap, dropped from the
//! KV (compaction); facts survive a restart; past the cap the facts are summarized; users are
//! scoped to their API key's account; every bad input is a clear 4xx that changes nothing.

use crate::common;
use common::*;
use engram_server::{ContextMode, ServerConfig};
use serde_json::{json, Value};

const SYSTEM: &str = "You answer in one line.";
const QUESTION: &str = "What do you know about me?";

fn dual(persistent_cap: usize) -> ServerConfig {
    ServerConfig {
        context: ContextMode::Dual { ring_tokens: 1024, threshold: 0.6, keep_last: 1, persistent_cap, summary_target: 12 },
        ..ServerConfig::new("tiny")
    }
}

fn add(addr: std::net::SocketAddr, user: &str, body: Value) -> Resp {
    post(addr, &format!("/v1/users/{user}/facts"), &body)
}

fn list(addr: std::net::SocketAddr, user: &str) -> Resp {
    request(addr, "GET", &format!("/v1/users/{user}/facts"), &[], "")
}

/// Tokens of the system message `content` as the template renders it after others (a fact's
/// segment), and of the base (the system prompt after BOS).
fn segment_len(content: &str) -> usize {
    let m = model();
    let tok = &m.tokenizer;
    let tpl = tok.chat_template().unwrap();
    let (bos, eos) = (tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""));
    let msg = |c: &str| vec![engram_tokenizer::ChatMessage::new("system", c)];
    let before = tpl.render(&[], false, bos, eos).unwrap();
    let with = tpl.render(&msg(content), false, bos, eos).unwrap();
    tok.encode(with.strip_prefix(before.as_str()).unwrap(), false).unwrap().ids.len()
}

fn base_len() -> usize {
    let m = model();
    let tok = &m.tokenizer;
    let tpl = tok.chat_template().unwrap();
    let (bos, eos) = (tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or(""));
    let msg = vec![engram_tokenizer::ChatMessage::new("system", SYSTEM)];
    tok.encode(&tpl.render(&msg, false, bos, eos).unwrap(), false).unwrap().ids.len()
}

/// The first answer of `user`'s thread to `QUESTION`, with `facts` spelled out as system
/// messages after the system prompt.
fn ask(addr: std::net::SocketAddr, user: &str, thread: &str, facts: &[&str]) -> String {
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    for f in facts {
        messages.push(json!({"role": "system", "content": format!("Fact about the user: {f}")}));
    }
    messages.push(json!({"role": "user", "content": QUESTION}));
    content(&chat(addr, &Value::Array(messages), json!({"user": user, "thread_id": thread})))
}

#[test]
fn a_fact_is_attended_by_every_thread_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = || ServerConfig { context: dual(512).context, ..persisting(dir.path(), engram_kv::EvictionPolicy::Lru) };
    let (addr, stop, t) = start_stoppable(config());
    let r = add(addr, "ann", json!({"text": "The user's name is Ann and she keeps bees."}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.json()["id"], 1);
    // The fact is in the stream: the answer equals a user without facts whose system messages
    // spell the same fact out (the same tokens at the same positions).
    let with_fact = ask(addr, "ann", "t1", &[]);
    let spelled_out = ask(addr, "ref", "t1", &["The user's name is Ann and she keeps bees."]);
    assert_eq!(with_fact, spelled_out);
    let listed = list(addr, "ann").json();
    stop.send(()).unwrap();
    t.join().unwrap();

    let (addr, stop, t) = start_stoppable(config());
    assert_eq!(list(addr, "ann").json(), listed, "the log survives the restart");
    assert_eq!(ask(addr, "ann", "t2", &[]), with_fact, "a new thread after the restart attends the same stream");
    stop.send(()).unwrap();
    t.join().unwrap();
}

#[test]
fn a_superseded_fact_is_tombstoned_and_dropped_at_compaction() {
    // A cap that holds the system prompt and the new fact but not the old one beside them: the
    // supersession masks the old fact at once; the stream is then over its cap, so it is
    // compacted, and the view is exactly the system prompt and the new fact.
    let (old, new) = ("Fact about the user: Ann lives in Oslo.", "Fact about the user: Ann lives in Bergen now.");
    let cap = base_len() + segment_len(new) + segment_len(old) - 1;
    let addr = start(64 << 20, dual(cap));
    ask(addr, "ann", "t0", &[]); // the user's base is set: the stream is [base]
    assert_eq!(add(addr, "ann", json!({"text": "Ann lives in Oslo."})).status, 201);
    let r = add(addr, "ann", json!({"text": "Ann lives in Bergen now.", "replaces": 1}));
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.json()["fact"]["replaces"], 1);
    let facts = list(addr, "ann").json();
    assert_eq!(facts["live"], 1);
    assert_eq!(facts["data"][0]["tombstoned"], true, "{facts}");
    assert_eq!(facts["data"][0]["replaced_by"], 2, "{facts}");
    assert_eq!(facts["data"][1]["tombstoned"], false, "{facts}");
    assert_eq!(ask(addr, "ann", "t1", &[]), ask(addr, "ref", "t1", &["Ann lives in Bergen now."]));
    assert!(metric(addr, "engram_persistent_compactions_total") >= 1.0);
    // Deleting the last live fact masks it: the system prompt alone is attended.
    assert_eq!(request(addr, "DELETE", "/v1/users/ann/facts/2", &[], "").status, 200);
    assert_eq!(list(addr, "ann").json()["live"], 0);
}

#[test]
fn past_the_cap_the_facts_are_summarized() {
    let one = segment_len("Fact about the user: Fact number 0: Ann likes the colour 0.");
    let addr = start(64 << 20, dual(base_len() + 2 * one));
    for i in 0..4 {
        let r = add(addr, "ann", json!({"text": format!("Fact number {i}: Ann likes the colour {i}.")}));
        assert_eq!(r.status, 201, "{}", r.body);
    }
    // The served model summarizes as the engine's low-priority background jobs (beside the
    // turn, or after it); the new stream is swapped in when they end.
    ask(addr, "ann", "t1", &[]);
    let t = std::time::Instant::now();
    while metric(addr, "engram_summaries_total") < 1.0 {
        assert!(t.elapsed() < std::time::Duration::from_secs(60), "four facts past a cap of two are summarized");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(list(addr, "ann").json()["live"], 4, "the log keeps every fact; only the stream is condensed");
}

#[test]
fn bad_input_is_a_clear_4xx_and_changes_nothing() {
    let addr = start(64 << 20, dual(64));
    assert_eq!(add(addr, "ann", json!({"text": "Ann keeps bees."})).status, 201);
    let r = add(addr, "ann", json!({"text": "Superseded."}));
    assert_eq!(r.status, 201);
    assert_eq!(request(addr, "DELETE", "/v1/users/ann/facts/2", &[], "").status, 200);
    let before = list(addr, "ann").json();
    let long = "bees ".repeat(200);
    let huge = "b".repeat(5000);
    let cases: Vec<(&str, &str, String, u16, &str)> = vec![
        ("POST", "/v1/users/ann/facts", json!({"text": ""}).to_string(), 400, "empty"),
        ("POST", "/v1/users/ann/facts", json!({"text": "   "}).to_string(), 400, "empty"),
        ("POST", "/v1/users/ann/facts", json!({"text": long}).to_string(), 400, "cap is 64 tokens"),
        ("POST", "/v1/users/ann/facts", json!({"text": long}).to_string(), 400, "tokens on its own"),
        ("POST", "/v1/users/ann/facts", json!({"text": huge}).to_string(), 400, "at most 4096"),
        ("POST", "/v1/users/ann/facts", json!({"text": "x", "replaces": 99}).to_string(), 404, "no fact 99"),
        ("POST", "/v1/users/ann/facts", json!({"text": "x", "replaces": 2}).to_string(), 409, "already tombstoned"),
        ("POST", "/v1/users/ann/facts", json!({"txt": "x"}).to_string(), 400, "txt"),
        ("POST", "/v1/users/ann/facts", "not json".to_string(), 400, ""),
        ("POST", "/v1/users/bad%20id/facts", json!({"text": "x"}).to_string(), 400, "user"),
        ("DELETE", "/v1/users/ann/facts/99", String::new(), 404, "no fact 99"),
        ("DELETE", "/v1/users/ann/facts/2", String::new(), 409, "already tombstoned"),
        ("DELETE", "/v1/users/ann/facts/two", String::new(), 400, "numbers"),
        ("DELETE", "/v1/users/nobody/facts", String::new(), 404, "no facts"),
        ("DELETE", "/v1/users/nobody/facts/1", String::new(), 404, "no facts"),
        ("GET", "/v1/users/nobody/facts", String::new(), 404, "no facts"),
    ];
    for (method, path, body, status, says) in cases {
        let r = request(addr, method, path, &[], &body);
        assert_eq!(r.status, status, "{method} {path} {body}: {}", r.body);
        assert!(r.body.contains(says), "{method} {path}: {} should say {says:?}", r.body);
    }
    assert_eq!(list(addr, "ann").json(), before, "nothing stored changed");
    assert_eq!(list(addr, "nobody").status, 404, "no user was created");
    // Deleting the whole log forgets the user.
    assert_eq!(request(addr, "DELETE", "/v1/users/ann/facts", &[], "").status, 200);
    assert_eq!(list(addr, "ann").status, 404);
    // Without --context dual the routes say what they need.
    let sessions = start(64 << 20, ServerConfig::new("tiny"));
    let r = add(sessions, "ann", json!({"text": "x"}));
    assert_eq!(r.status, 404);
    assert!(r.body.contains("--context dual"), "{}", r.body);
}

#[test]
fn users_are_scoped_to_their_accounts() {
    let keys = vec![("key-a".to_string(), "acct-a".to_string()), ("key-b".to_string(), "acct-b".to_string())];
    let addr = start(64 << 20, ServerConfig { api_keys: keys, ..dual(512) });
    let auth = |k: &'static str| [("Authorization", if k == "a" { "Bearer key-a" } else { "Bearer key-b" })];
    let body = json!({"text": "Ann keeps bees."}).to_string();
    assert_eq!(request(addr, "POST", "/v1/users/ann/facts", &auth("a"), &body).status, 201);
    assert_eq!(request(addr, "GET", "/v1/users/ann/facts", &auth("a"), "").status, 200);
    assert_eq!(request(addr, "GET", "/v1/users/ann/facts", &auth("b"), "").status, 404, "another account's user is unknown");
    assert_eq!(request(addr, "DELETE", "/v1/users/ann/facts/1", &auth("b"), "").status, 404);
    assert_eq!(request(addr, "GET", "/v1/users/ann/facts", &[], "").status, 401);
    assert_eq!(request(addr, "GET", "/v1/users/ann/facts", &auth("a"), "").json()["live"], 1);
}
