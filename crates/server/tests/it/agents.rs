//! End-to-end tests of `/v1/agents` against a real server: agents' own caches, their
//! sessions across restarts, pinned on disk, and deletion (also mid-generation).

use crate::common;
use common::*;
use serde_json::json;
use std::time::Duration;

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
        c.sessions.disk.as_mut().unwrap().budget_bytes = budget;
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

/// A generate that found its agent before a delete, but whose job reached
/// the engine after the delete's forget, ran and checked in a pinned session for the deleted
/// agent that nothing removed. Rounds of a generate whose body takes a while to prepare (a
/// long prompt and a large ignored field: parsed, rendered and tokenized between the lookup
/// and the submit) with a delete sent meanwhile, at several delays: the generate answers
/// (it ran before the forget) or is a 404, and after each round the agent has no session.
#[test]
fn a_generate_racing_a_delete_leaves_no_session() {
    let addr = start(256 << 20, engram_server::ServerConfig::new("tiny"));
    let body = json!({"prompt": "word ".repeat(2000), "max_tokens": 1, "temperature": 0, "metadata": "x".repeat(1 << 20)}).to_string();
    for round in 0..24u64 {
        let id = format!("racer-{round}");
        assert_eq!(post(addr, "/v1/agents", &json!({"id": id, "system": "You race."})).status, 201);
        let (path, body) = (format!("/v1/agents/{id}/generate"), body.clone());
        let generate = std::thread::spawn(move || request(addr, "POST", &path, &[], &body));
        std::thread::sleep(Duration::from_micros(400 * (round % 12)));
        assert_eq!(request(addr, "DELETE", &format!("/v1/agents/{id}"), &[], "").status, 200);
        let r = generate.join().unwrap();
        assert!(r.status == 200 || r.status == 404, "round {round}: {} {}", r.status, r.body);
        let t0 = std::time::Instant::now();
        while metric(addr, "engram_sessions_idle") > 0.0 || metric(addr, "engram_sequences_running") > 0.0 {
            assert!(t0.elapsed() < Duration::from_secs(3), "round {round}: the deleted agent's session stayed (generate: {})", r.status);
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}
