//! PerCache's idle-time population in `engram serve` (predicted questions answered while the server is idle), on a real loopback
//! server with the tiny fixture model: after an ingest the engine's idle hook predicts
//! questions and answers them into the QA bank / prefills them into the chunk KV tree, one
//! unit at a time; a predicted question then answers from the QA bank with the tokens a server
//! without any cache generates; a request that arrives while units run is answered as cold;
//! `--rag-idle off` runs nothing.

use crate::common;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use engram_engine::PooledEncoder;
use engram_server::{RagServerConfig, ServerConfig};
use serde_json::{json, Value};

fn server(dir: &Path, idle: bool) -> SocketAddr {
    let enc = Arc::new(PooledEncoder::new(model(), "tiny"));
    let mut rag = RagServerConfig::new(dir.join("rag"));
    if !idle {
        rag.idle = None;
    }
    start(256 << 20, ServerConfig { embedder: Some(enc), rag: Some(rag), ..ServerConfig::new("tiny") })
}

fn predictions(addr: SocketAddr) -> Vec<Value> {
    let r = request(addr, "GET", "/v1/rag/predictions", &[], "");
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["data"].as_array().unwrap().clone()
}

/// Waits until `name` reaches `at_least` (idle units run on the engine thread).
fn wait_metric(addr: SocketAddr, name: &str, at_least: f64) -> f64 {
    let t = Instant::now();
    loop {
        let v = metric(addr, name);
        if v >= at_least {
            return v;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "{name} stayed at {v}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What a server with no idle population and no earlier query answers (a cold prefill).
fn cold_answers(questions: &[&str], max_tokens: u64) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let addr = server(dir.path(), false);
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    questions.iter().map(|q| rag_query(addr, json!({"query": q, "max_tokens": max_tokens, "use_qa": false}))).collect()
}

#[test]
fn a_predicted_question_answers_from_the_qa_bank_with_the_cold_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let addr = server(dir.path(), true);
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    wait_metric(addr, "engram_rag_idle_qa_populated_total", 1.0);
    let answered: Vec<String> =
        predictions(addr).iter().filter(|p| p["answered"] == true).map(|p| p["query"].as_str().unwrap().to_string()).collect();
    assert!(!answered.is_empty(), "{:?}", predictions(addr));
    let q = answered[0].as_str();
    // Asked for the first time by the user: served from the QA bank, filled in idle time.
    let hit = rag_query(addr, json!({"query": q}));
    assert_eq!(hit["cache_level"], "qa", "{hit}");
    assert_eq!(hit["matched_query"], q);
    assert!(hit["similarity"].as_f64().unwrap() > 0.999, "{hit}");
    // The tokens a server without caches generates for it (default max_tokens both ways).
    let cold = &cold_answers(&[q], 32)[0];
    assert_eq!(cold["cache_level"], "none", "{cold}");
    assert_eq!(hit["answer"], cold["answer"], "an idle-time answer differs from the cold one");
    assert_eq!(hit["sources"], cold["sources"]);

    assert!(metric(addr, "engram_rag_idle_predicted_queries_total") >= answered.len() as f64);
    assert!(metric(addr, "engram_rag_idle_compute_ms_total") > 0.0);
    assert!(metric(addr, "engram_rag_idle_longest_unit_ms") > 0.0);
    assert!(metric(addr, "engram_rag_idle_units_total{kind=\"answer\"}") >= 1.0);
    assert_eq!(metric(addr, "engram_rag_idle_errors_total"), 0.0);
    assert_eq!(metric(addr, "engram_rag_queries_total{level=\"qa\"}"), 1.0);
}

#[test]
fn a_request_while_idle_units_run_is_answered_as_cold() {
    let questions = ["Who will test the importer?", "What should I bring to the budget review?"];
    let cold = cold_answers(&questions, 12);
    let dir = tempfile::tempdir().unwrap();
    let addr = server(dir.path(), true);
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    for (q, c) in questions.iter().zip(&cold) {
        // Units are running (the first has finished); the request goes between two of them.
        let units = wait_metric(addr, "engram_rag_idle_compute_ms_total", 1e-6);
        let a = rag_query(addr, json!({"query": q, "max_tokens": 12, "use_qa": false}));
        assert_eq!(a["answer"], c["answer"], "{q}: {a}");
        assert_eq!(a["sources"], c["sources"]);
        eprintln!(
            "{q}: answered in {:.1} ms with {units:.1} ms of idle units before it; longest unit {:.1} ms",
            a["timings"]["total_ms"].as_f64().unwrap(),
            metric(addr, "engram_rag_idle_longest_unit_ms")
        );
    }
    // Idle work goes on after the requests, and later asks stay exact.
    wait_metric(addr, "engram_rag_idle_units_total{kind=\"answer\"}", 1.0);
    for (q, c) in questions.iter().zip(&cold) {
        let a = rag_query(addr, json!({"query": q, "max_tokens": 12, "use_qa": false}));
        assert_eq!(a["answer"], c["answer"], "{q}: {a}");
    }
    assert_eq!(metric(addr, "engram_rag_idle_errors_total"), 0.0);
}

#[test]
fn with_idle_off_nothing_is_predicted() {
    let dir = tempfile::tempdir().unwrap();
    let addr = server(dir.path(), false);
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    rag_query(addr, json!({"query": "When is the budget review?", "max_tokens": 4}));
    std::thread::sleep(Duration::from_millis(300));
    assert!(predictions(addr).is_empty());
    let r = request(addr, "GET", "/metrics", &[], "");
    assert!(!r.body.contains("engram_rag_idle_"), "{}", r.body);
    assert!(!dir.path().join("rag").read_dir().unwrap().any(|t| t.unwrap().path().join("abstracts").exists()));
}

/// Waits until idle work has drained: every prediction planned and the unit counts steady.
fn wait_idle_done(addr: SocketAddr) {
    let count = || {
        let m = request(addr, "GET", "/metrics", &[], "").body;
        m.lines()
            .filter(|l| l.starts_with("engram_rag_idle_units_total") || l.starts_with("engram_rag_idle_interrupted_total"))
            .map(|l| l.to_string())
            .collect::<Vec<_>>()
    };
    let t = Instant::now();
    let mut last = count();
    loop {
        std::thread::sleep(Duration::from_millis(400));
        let now = count();
        if now == last && predictions(addr).iter().all(|p| !p["strategy"].is_null()) {
            return;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "idle work never drained");
        last = now;
    }
}

#[test]
fn a_request_during_an_idle_unit_stops_it_at_once_and_nothing_partial_is_stored() {
    let q = "Who will test the importer?";
    let cold = &cold_answers(&[q], 12)[0];
    let dir = tempfile::tempdir().unwrap();
    let addr = server(dir.path(), true);
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    // Units run back to back now; each query (a handler waiting for the library, then a job)
    // stops the one running at its next model step, and is answered as cold.
    let mut asked = 0;
    while metric(addr, "engram_rag_idle_interrupted_total") < 1.0 {
        assert!(asked < 60, "no idle unit was ever interrupted");
        let a = rag_query(addr, json!({"query": q, "max_tokens": 12, "use_qa": false}));
        assert_eq!(a["answer"], cold["answer"], "{a}");
        assert_eq!(a["sources"], cold["sources"]);
        asked += 1;
    }
    let step = metric(addr, "engram_rag_idle_longest_step_ms");
    assert!(step > 0.0, "the longest step between interrupt checks is reported");
    // The interrupted units ran again later; every predicted answer stored is whole: the
    // tokens a cache-less server generates for that question.
    wait_idle_done(addr);
    let answered: Vec<String> =
        predictions(addr).iter().filter(|p| p["answered"] == true).map(|p| p["query"].as_str().unwrap().to_string()).collect();
    assert!(!answered.is_empty(), "{:?}", predictions(addr));
    let qs: Vec<&str> = answered.iter().take(3).map(String::as_str).collect();
    for (q, c) in qs.iter().zip(cold_answers(&qs, 32)) {
        let hit = rag_query(addr, json!({"query": q}));
        assert_eq!(hit["cache_level"], "qa", "{hit}");
        assert_eq!(hit["answer"], c["answer"], "{q}: a stored predicted answer differs from the cold one");
    }
    assert_eq!(metric(addr, "engram_rag_idle_errors_total"), 0.0);
    eprintln!(
        "{asked} queries to see an interruption; interrupted {}, longest step {step:.2} ms, longest unit {:.2} ms",
        metric(addr, "engram_rag_idle_interrupted_total"),
        metric(addr, "engram_rag_idle_longest_unit_ms")
    );
}

#[test]
fn after_a_restart_idle_work_starts_without_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let config = |idle: bool| {
        let enc = Arc::new(PooledEncoder::new(model(), "tiny"));
        let mut rag = RagServerConfig::new(dir.path().join("rag"));
        if !idle {
            rag.idle = None;
        }
        ServerConfig { embedder: Some(enc), rag: Some(rag), ..ServerConfig::new("tiny") }
    };
    // Documents arrive while idle time is off; the server stops.
    let (addr, stop, t) = start_stoppable(config(false));
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    stop.send(()).unwrap();
    t.join().unwrap();
    // Restarted with idle time on: no RAG request, yet the tenant's units run.
    let (addr, stop, t) = start_stoppable(config(true));
    wait_metric(addr, "engram_rag_idle_qa_populated_total", 1.0);
    let answered: Vec<String> =
        predictions(addr).iter().filter(|p| p["answered"] == true).map(|p| p["query"].as_str().unwrap().to_string()).collect();
    assert!(!answered.is_empty());
    let hit = rag_query(addr, json!({"query": answered[0]}));
    assert_eq!(hit["cache_level"], "qa", "{hit}");
    stop.send(()).unwrap();
    t.join().unwrap();
    // The answer is what a cache-less server (same KV format) generates.
    let other = tempfile::tempdir().unwrap();
    let enc = Arc::new(PooledEncoder::new(model(), "tiny"));
    let mut rag = RagServerConfig::new(other.path().join("rag"));
    rag.idle = None;
    let (addr, stop, t) = start_stoppable(ServerConfig { embedder: Some(enc), rag: Some(rag), ..ServerConfig::new("tiny") });
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    let cold = rag_query(addr, json!({"query": answered[0], "use_qa": false}));
    assert_eq!(hit["answer"], cold["answer"]);
    stop.send(()).unwrap();
    t.join().unwrap();
}
