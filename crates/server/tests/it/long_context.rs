//! `--long-context-after`: a conversation past the threshold is served sparse (DynaKV over KV
//! offloaded to disk) over HTTP, and its next turns extend the kept sparse cache (they report
//! the history as cached tokens and compute only what is new).

use serde_json::{json, Value};

use crate::common::{chat, content, metric, persisting, start, start_stoppable};
use engram_server::{LongContextConfig, ServerConfig};

#[test]
fn a_long_conversation_goes_sparse_and_its_next_turn_reuses_it() {
    let dir = tempfile::tempdir().unwrap();
    let long = LongContextConfig { ram_budget: 8 << 10, cache_bytes: 4 << 10, ..LongContextConfig::new(96, dir.path().to_path_buf()) };
    let addr = start(64 << 20, ServerConfig { long_context: Some(long), ..ServerConfig::new("tiny") });
    let history = "The KV cache keeps every turn's keys and values in blocks of 32 tokens. ".repeat(10);
    let mut messages = vec![json!({"role": "system", "content": history}), json!({"role": "user", "content": "What is kept?"})];
    let mut prompt_before = 0;
    for turn in 0..3 {
        let r = chat(addr, &Value::Array(messages.clone()), json!({"max_tokens": 8}));
        let answer = content(&r);
        let usage = &r.json()["usage"];
        let prompt = usage["prompt_tokens"].as_u64().unwrap();
        let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        assert!(prompt > 96, "past the threshold: {usage}");
        if turn > 0 {
            assert!(
                cached >= prompt_before,
                "turn {turn} reuses the sparse cache: {cached} cached, the previous prompt was {prompt_before}"
            );
        }
        prompt_before = prompt;
        messages.push(json!({"role": "assistant", "content": answer}));
        messages.push(json!({"role": "user", "content": format!("Question {turn}: and then?")}));
    }
    assert_eq!(metric(addr, "engram_long_context_switches_total"), 1.0, "switched once");
    assert_eq!(metric(addr, "engram_long_context_resumes_total"), 2.0, "both later turns extended it");
    assert_eq!(metric(addr, "engram_long_context_sessions"), 1.0);
    assert!(metric(addr, "engram_long_context_ram_bytes") > 0.0, "its RAM is charged to the KV pool");
    assert!(metric(addr, "engram_long_context_offload_bytes") > 0.0, "its older KV is in its file");
}

/// A server that persists sessions under `<dir>/kv` and serves conversations past 96 tokens
/// sparse, their live offload files in `<dir>/long`.
fn long_persisting(dir: &std::path::Path, disk_budget: u64) -> ServerConfig {
    let long = LongContextConfig { ram_budget: 8 << 10, cache_bytes: 4 << 10, ..LongContextConfig::new(96, dir.join("long")) };
    std::fs::create_dir_all(dir.join("long")).unwrap();
    let mut c = persisting(dir, engram_kv::EvictionPolicy::Lru);
    c.sessions.disk.as_mut().unwrap().budget_bytes = disk_budget;
    c.long_context = Some(long);
    c
}

/// The saved long conversations' folders under `<dir>/kv`.
fn long_folders(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir.join("kv"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with("long-"))
        .collect()
}

/// Turn `n` (from 0) of the conversation: the messages so far, with `answers` as the assistant's.
fn turn_messages(n: usize, answers: &[String]) -> Value {
    let history = "The KV cache keeps every turn's keys and values in blocks of 32 tokens. ".repeat(10);
    let mut m = vec![json!({"role": "system", "content": history}), json!({"role": "user", "content": "What is kept?"})];
    for (i, a) in answers.iter().take(n).enumerate() {
        m.push(json!({"role": "assistant", "content": a}));
        m.push(json!({"role": "user", "content": format!("Question {i}: and then?")}));
    }
    Value::Array(m)
}

/// One greedy turn: its answer and usage.
fn ask_turn(addr: std::net::SocketAddr, n: usize, answers: &[String]) -> (String, Value) {
    let r = chat(addr, &turn_messages(n, answers), json!({"max_tokens": 8, "temperature": 0}));
    assert_eq!(r.status, 200, "{}", r.body);
    (content(&r), r.json()["usage"].clone())
}

/// Waits until the metrics show the saves of `turns` turns asked for and none pending (the
/// writer thread writes them after each turn's end), for up to 5 minutes.
fn saves_settled(addr: std::net::SocketAddr, turns: f64) {
    let t = std::time::Instant::now();
    while metric(addr, "engram_long_context_saves_total") < turns || metric(addr, "engram_long_context_saves_pending") > 0.0 {
        assert!(t.elapsed() < std::time::Duration::from_secs(300), "the saves of {turns} turns never settled");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn stop(s: (tokio::sync::oneshot::Sender<()>, std::thread::JoinHandle<()>)) {
    s.0.send(()).unwrap();
    s.1.join().unwrap();
}

/// A long conversation's sparse state survives a restart: the restarted server's next turn
/// resumes from the saved file (the whole history reported cached, nothing re-prefilled) and
/// answers as a server never restarted does; a truncated offload file is never used (the turn
/// is recomputed as a cold server computes it, the bad folder replaced); the folder counts against the disk
/// budget, and a budget too small for it keeps none.
#[test]
fn a_long_conversation_survives_a_restart_without_a_re_prefill() {
    // The reference: one server, never restarted, four turns.
    let never = tempfile::tempdir().unwrap();
    let (addr, s, t) = start_stoppable(long_persisting(never.path(), 256 << 20));
    let mut answers = Vec::new();
    for n in 0..4 {
        answers.push(ask_turn(addr, n, &answers).0);
    }
    assert_eq!(metric(addr, "engram_long_context_switches_total"), 1.0);
    saves_settled(addr, 4.0);
    assert_eq!(metric(addr, "engram_long_context_saved_sessions"), 1.0);
    stop((s, t));

    // Two turns, a restart, the third turn.
    let dir = tempfile::tempdir().unwrap();
    let (addr, s, t) = start_stoppable(long_persisting(dir.path(), 256 << 20));
    let mut prompt_before = 0;
    for n in 0..2 {
        let (a, usage) = ask_turn(addr, n, &answers);
        assert_eq!(a, answers[n]);
        prompt_before = usage["prompt_tokens"].as_u64().unwrap();
    }
    saves_settled(addr, 2.0);
    let saved = metric(addr, "engram_long_context_saved_bytes");
    assert!(saved > 0.0, "the saved folder is counted in the disk store");
    stop((s, t));
    let folders = long_folders(dir.path());
    assert_eq!(folders.len(), 1, "one saved conversation");

    let (addr, s, t) = start_stoppable(long_persisting(dir.path(), 256 << 20));
    let (a, usage) = ask_turn(addr, 2, &answers);
    saves_settled(addr, 1.0);
    assert_eq!(metric(addr, "engram_long_context_saved_sessions"), 1.0, "found again at start, saved again");
    let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
    assert!(
        cached > prompt_before,
        "the history comes from the saved state: {cached} cached, turn 2's prompt was {prompt_before}: {usage}"
    );
    assert_eq!(metric(addr, "engram_long_context_disk_resumes_total"), 1.0);
    assert_eq!(metric(addr, "engram_long_context_switches_total"), 0.0, "no exact prefill switched again");
    assert_eq!(a, answers[2], "the restarted server answers as the unrestarted one");
    stop((s, t));

    // The saved offload file truncated between two runs: recomputed, never used.
    let folder = &long_folders(dir.path())[0];
    let kv =
        std::fs::read_dir(folder).unwrap().map(|e| e.unwrap().path()).find(|p| p.file_name().unwrap().to_string_lossy().starts_with("kv-"));
    let kv = kv.expect("the saved offload file");
    let len = std::fs::metadata(&kv).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&kv).unwrap().set_len(len / 2).unwrap();
    let (addr, s, t) = start_stoppable(long_persisting(dir.path(), 256 << 20));
    let (a, _) = ask_turn(addr, 3, &answers);
    assert_eq!(metric(addr, "engram_long_context_disk_resumes_total"), 0.0, "the truncated state is not resumed");
    assert_eq!(metric(addr, "engram_long_context_switches_total"), 1.0, "the turn was prefilled and switched again");
    stop((s, t));
    assert_eq!(long_folders(dir.path()).len(), 1, "saved anew");
    // Recomputed means what a server that never saw the conversation answers (a cold prefill,
    // then the switch).
    let cold = tempfile::tempdir().unwrap();
    let (addr, s, t) = start_stoppable(long_persisting(cold.path(), 256 << 20));
    assert_eq!(ask_turn(addr, 3, &answers).0, a, "recomputed: a cold server's answer");
    stop((s, t));

    // A disk budget smaller than the folder: not saved, nothing left behind.
    let small = tempfile::tempdir().unwrap();
    let budget = (saved as u64) / 2;
    let (addr, s, t) = start_stoppable(long_persisting(small.path(), budget));
    for n in 0..2 {
        assert_eq!(ask_turn(addr, n, &answers).0, answers[n]);
    }
    saves_settled(addr, 2.0);
    assert_eq!(metric(addr, "engram_long_context_saved_sessions"), 0.0);
    assert!(metric(addr, "engram_long_context_save_failures_total") >= 1.0);
    stop((s, t));
    assert!(long_folders(small.path()).is_empty(), "a refused save leaves no folder");
}

/// `long_context_after` on a request overrides the server's threshold for that conversation:
/// under a default no conversation here reaches, a request naming a low one goes sparse and
/// its next turn extends the sparse cache; the same request without it stays exact. A value
/// that is not a whole number of tokens of at least 1, or a server without long context, is
/// a 400 naming the field.
#[test]
fn a_request_sets_its_own_long_context_threshold() {
    let dir = tempfile::tempdir().unwrap();
    let long = LongContextConfig { ram_budget: 8 << 10, cache_bytes: 4 << 10, ..LongContextConfig::new(1 << 20, dir.path().to_path_buf()) };
    let addr = start(64 << 20, ServerConfig { long_context: Some(long), ..ServerConfig::new("tiny") });
    let history = "The KV cache keeps every turn's keys and values in blocks of 32 tokens. ".repeat(10);
    let messages = json!([{"role": "system", "content": history}, {"role": "user", "content": "What is kept?"}]);
    let r = chat(addr, &messages, json!({"max_tokens": 4, "session_id": "exact"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(metric(addr, "engram_long_context_switches_total"), 0.0, "under the server's threshold: exact");

    let r = chat(addr, &messages, json!({"max_tokens": 4, "session_id": "own", "long_context_after": 96}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(metric(addr, "engram_long_context_switches_total"), 1.0, "past the request's own threshold: sparse");
    let mut next = messages.as_array().unwrap().clone();
    next.push(json!({"role": "assistant", "content": content(&r)}));
    next.push(json!({"role": "user", "content": "And then?"}));
    let r = chat(addr, &Value::Array(next), json!({"max_tokens": 4, "session_id": "own", "long_context_after": 96}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(metric(addr, "engram_long_context_resumes_total"), 1.0, "the next turn extends the sparse cache");

    // Raw completions take it too.
    let body = json!({"model": "tiny", "prompt": history, "max_tokens": 2, "long_context_after": 64});
    let r = crate::common::post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(metric(addr, "engram_long_context_switches_total"), 2.0);

    for bad in [json!(0), json!(-5), json!(1.5), json!("96"), json!([96])] {
        let r = chat(addr, &messages, json!({"max_tokens": 4, "long_context_after": bad}));
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert!(r.body.contains("long_context_after"), "{bad}: the error names the field: {}", r.body);
        let r = crate::common::post(addr, "/v1/completions", &json!({"model": "tiny", "prompt": "hi", "long_context_after": bad}));
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
        assert!(r.body.contains("long_context_after"), "{}", r.body);
    }
    let plain = start(64 << 20, ServerConfig::new("tiny"));
    let r = chat(plain, &messages, json!({"max_tokens": 4, "long_context_after": 96}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("--long-context-after"), "{}", r.body);
}
