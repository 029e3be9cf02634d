//! `engram serve --chunk-reuse blend` and the per-request `chunk_reuse` / `blend_ratio` fields
//! of `/v1/rag/query` (chunk KV reuse), on a real loopback server with the tiny fixture model: the
//! RAG job starts from the tenant's chunk store (chunks' KV computed once, by the engine as
//! background jobs the request waits on, moved into place) repaired by `engram_engine::blend`
//! in the engine's step; with ratio 1 the answer is the cold one token for token
//! whether the chunks were computed or reused; the response says which reuse happened; bad
//! modes and ratios are a 400 that changes nothing stored.

use crate::common;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use common::*;
use engram_engine::PooledEncoder;
use engram_rag::ChunkReuse;
use engram_server::{RagServerConfig, ServerConfig};
use serde_json::{json, Value};

fn server(dir: &Path, reuse: ChunkReuse) -> SocketAddr {
    let enc = Arc::new(PooledEncoder::new(model(), "tiny"));
    let rag = RagServerConfig { idle: None, chunk_reuse: reuse, ..RagServerConfig::new(dir.join("rag")) };
    start(256 << 20, ServerConfig { embedder: Some(enc), rag: Some(rag), ..ServerConfig::new("tiny") })
}

const QUESTIONS: [&str; 3] = ["Who will test the importer?", "When is the budget review?", "What should I do before noon?"];

#[test]
fn blend_at_ratio_one_answers_as_cold_and_says_what_it_reused() {
    let dir = tempfile::tempdir().unwrap();
    let cold_addr = server(&dir.path().join("cold"), ChunkReuse::Prefix);
    assert_eq!(post(cold_addr, "/v1/rag/documents", &rag_docs()).status, 201);
    let addr = server(&dir.path().join("blend"), ChunkReuse::Prefix);
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    let (mut reused, mut computed) = (0, 0);
    for round in 0..2 {
        for q in QUESTIONS {
            let cold = rag_query(cold_addr, json!({"query": q, "max_tokens": 12, "use_qa": false, "chunk_reuse": "prefix"}));
            let b = rag_query(addr, json!({"query": q, "max_tokens": 12, "use_qa": false, "chunk_reuse": "blend", "blend_ratio": 1.0}));
            assert_eq!(b["answer"], cold["answer"], "round {round}, {q}: {b}");
            assert_eq!(b["sources"], cold["sources"]);
            assert_eq!(b["chunk_reuse"], "blend", "{b}");
            assert_eq!(cold["chunk_reuse"], "prefix", "{cold}");
            let stats = &b["blend"];
            assert_eq!(stats["ratio"], 1.0);
            assert_eq!(stats["recomputed_tokens"], stats["moved_tokens"], "{b}");
            let r = stats["chunks_reused"].as_u64().unwrap();
            reused += r;
            computed += stats["chunks_computed"].as_u64().unwrap();
            // A chunk taken from the store makes it a KV answer; the tokens prefilled at
            // admission are not counted as cached.
            assert_eq!(b["cache_level"], if r > 0 { "kv" } else { "none" }, "{b}");
            if round == 1 {
                assert_eq!(stats["chunks_computed"], 0, "every chunk was stored in round 0: {b}");
                assert!(b["usage"]["cached_tokens"].as_u64().unwrap() > 0, "{b}");
            }
        }
    }
    assert!(reused >= QUESTIONS.len() as u64, "the second round reuses every chunk");
    assert_eq!(metric(addr, "engram_rag_blend_jobs_total"), 2.0 * QUESTIONS.len() as f64);
    assert_eq!(metric(addr, "engram_rag_blend_chunks_reused_total"), reused as f64);
    // Every chunk computed (and the system prompt, once) was a background job of the engine
    // that the request waited on, not work of its admission.
    assert!(computed > 0);
    assert_eq!(metric(addr, "engram_rag_blend_chunk_jobs_total"), (1 + computed) as f64);
    assert!(metric(addr, "engram_background_jobs_total") >= (1 + computed) as f64);
    // Blended KV never enters the exact tree: a prefix ask afterwards starts cold.
    let p = rag_query(addr, json!({"query": QUESTIONS[0], "max_tokens": 12, "use_qa": false}));
    assert_eq!(p["chunk_reuse"], "prefix");
    assert_eq!(p["cache_level"], "none", "{p}");
}

#[test]
fn the_servers_default_reuse_applies_and_a_request_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    let addr = server(dir.path(), ChunkReuse::Blend { ratio: 1.0 });
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    let q = QUESTIONS[1];
    let b = rag_query(addr, json!({"query": q, "max_tokens": 8, "use_qa": false}));
    assert_eq!(b["chunk_reuse"], "blend", "{b}");
    assert_eq!(b["blend"]["ratio"], 1.0);
    let lower = rag_query(addr, json!({"query": q, "max_tokens": 8, "use_qa": false, "blend_ratio": 0.5}));
    assert_eq!(lower["blend"]["ratio"], 0.5);
    let p = rag_query(addr, json!({"query": q, "max_tokens": 8, "use_qa": false, "chunk_reuse": "prefix"}));
    assert_eq!(p["chunk_reuse"], "prefix", "{p}");
    assert!(p.get("blend").is_none(), "{p}");
    assert_eq!(p["answer"], b["answer"], "ratio 1 = the exact path");
}

#[test]
fn bad_modes_and_ratios_are_a_400_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let addr = server(dir.path(), ChunkReuse::Prefix);
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    let before = snapshot(dir.path());
    let q = "Who will test the importer?";
    let cases: Vec<(Value, &str, &str)> = vec![
        (json!({"query": q, "chunk_reuse": "sideways"}), "chunk_reuse", "expected prefix or blend"),
        (json!({"query": q, "chunk_reuse": "blend", "blend_ratio": 1.5}), "blend_ratio", "not in [0, 1]"),
        (json!({"query": q, "chunk_reuse": "blend", "blend_ratio": -0.1}), "blend_ratio", "not in [0, 1]"),
        (json!({"query": q, "blend_ratio": 0.3}), "blend_ratio", "applies only with"),
        (json!({"query": q, "chunk_reuse": "prefix", "blend_ratio": 0.3}), "blend_ratio", "applies only with"),
    ];
    for (body, param, says) in cases {
        let r = post(addr, "/v1/rag/query", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        let e = &r.json()["error"];
        assert_eq!(e["param"], param, "{}", r.body);
        assert!(e["message"].as_str().unwrap().contains(says), "{}", r.body);
    }
    for body in [json!({"query": q, "chunk_reuse": 3}), json!({"query": q, "chunk_reuse": "blend", "blend_ratio": "high"})] {
        assert_eq!(post(addr, "/v1/rag/query", &body).status, 400, "{body}");
    }
    assert_eq!(snapshot(dir.path()), before, "a refused request changed a stored file");
    assert_eq!(metric(addr, "engram_rag_blend_jobs_total"), 0.0);
}

/// The chunk store's files under `dir`.
fn chunk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    snapshot(dir).into_keys().filter(|p| p.contains("/chunks/") && p.ends_with(".kv")).map(Into::into).collect()
}

#[test]
fn blend_reuse_survives_a_restart_and_a_damaged_file_is_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let enc = Arc::new(PooledEncoder::new(model(), "tiny"));
        let rag =
            RagServerConfig { idle: None, chunk_reuse: ChunkReuse::Blend { ratio: 0.15 }, ..RagServerConfig::new(dir.path().join("rag")) };
        ServerConfig { embedder: Some(enc), rag: Some(rag), ..ServerConfig::new("tiny") }
    };
    let ask = |addr| -> Vec<Value> {
        QUESTIONS.iter().map(|q| rag_query(addr, json!({"query": q, "max_tokens": 10, "use_qa": false}))).collect()
    };
    let (addr, stop, t) = start_stoppable(config());
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    let before = ask(addr);
    // Saved in idle time.
    let t0 = std::time::Instant::now();
    while chunk_files(dir.path()).len() < 3 {
        assert!(t0.elapsed() < std::time::Duration::from_secs(30), "the chunk store was not saved");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    stop.send(()).unwrap();
    t.join().unwrap();

    // Restarted: every chunk comes from the files; the answers are the ones before.
    let (addr, stop, t) = start_stoppable(config());
    let after = ask(addr);
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a["answer"], b["answer"], "{a}");
        assert_eq!(a["blend"]["chunks_computed"], 0, "{a}");
        assert_eq!(a["cache_level"], "kv", "{a}");
    }
    stop.send(()).unwrap();
    t.join().unwrap();

    // One file bit-flipped, one truncated: refused and deleted, their chunks computed again.
    let files = chunk_files(dir.path());
    let mut flipped = std::fs::read(&files[0]).unwrap();
    let n = flipped.len();
    flipped[n - 64] ^= 0x10;
    std::fs::write(&files[0], &flipped).unwrap();
    let b = std::fs::read(&files[1]).unwrap();
    let truncated = b[..b.len() / 2].to_vec();
    std::fs::write(&files[1], &truncated).unwrap();
    let (addr, stop, t) = start_stoppable(config());
    let again = ask(addr);
    let computed: u64 = again.iter().map(|a| a["blend"]["chunks_computed"].as_u64().unwrap()).sum();
    assert!(computed >= 2, "{again:?}");
    for (b, a) in before.iter().zip(&again) {
        assert_eq!(a["answer"], b["answer"], "{a}");
    }
    // Deleted at load (and written again, sound, once their chunks were recomputed).
    assert_ne!(std::fs::read(&files[0]).ok(), Some(flipped));
    assert_ne!(std::fs::read(&files[1]).ok(), Some(truncated));
    stop.send(()).unwrap();
    t.join().unwrap();
}
