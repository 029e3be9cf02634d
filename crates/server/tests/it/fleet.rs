//! Replicas sharing one remote tier on a real `redis-server` (skipped without one, except under
//! CI=true):
//! - `--context dual`: a user's facts added on replica A are attended on replica B (the
//!   answer equals one whose system messages spell the facts out), listed there, changed
//!   there on top of A's, and a thread's state entry set on A is attended on B — also after
//!   both restart with empty disks; a bit-flipped log is a miss, counted;
//! - an agent deleted on A is gone on B, which held it (a 404 there, not listed), and one
//!   created anew on A under that id is B's new definition.

use std::time::Duration;

use crate::common;
use common::*;
use engram_remote::testing::TestRedis;
use engram_remote::{RemoteConfig, RemoteTier};
use engram_server::{ContextMode, ServerConfig};
use serde_json::{json, Value};

fn redis() -> Option<TestRedis> {
    TestRedis::start_if_available()
}

/// A replica: its own data directory (`dir`), the tier at `url`, `context`.
struct Replica {
    addr: std::net::SocketAddr,
    tier: RemoteTier,
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Replica {
    fn start(dir: &std::path::Path, url: &str, context: ContextMode) -> Replica {
        let tier = RemoteTier::new(RemoteConfig { timeout: Duration::from_millis(500), ..RemoteConfig::new(url) }).unwrap();
        let mut config = ServerConfig { context, ..persisting(dir, engram_kv::EvictionPolicy::Lru) };
        config.sessions.remote = Some(tier.clone());
        let (addr, stop, thread) = start_stoppable(config);
        Replica { addr, tier, stop, thread }
    }

    /// Waits until this replica's queued writes reached the store.
    fn flush(&self) {
        self.tier.flush();
    }

    fn stop(self) {
        self.stop.send(()).unwrap();
        self.thread.join().unwrap();
    }
}

fn dual() -> ContextMode {
    ContextMode::Dual { ring_tokens: 1024, threshold: 0.6, keep_last: 1, persistent_cap: 512, summary_target: 12 }
}

const SYSTEM: &str = "You answer in one line.";
const ANN: &str = "The user's name is Ann and she keeps bees.";
const ANN2: &str = "Ann lives by the sea.";
const STATE: &str = "Today the user ran 5 km in 31 minutes and slept 7 hours.";

/// `user`'s answer on `thread` to `messages` after the system prompt (with `facts` spelled out
/// as system messages) and `state` if given.
fn ask(addr: std::net::SocketAddr, user: &str, thread: &str, facts: &[&str], turns: &[&str], state: Option<&str>) -> String {
    let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
    for f in facts {
        messages.push(json!({"role": "system", "content": format!("Fact about the user: {f}")}));
    }
    for (i, t) in turns.iter().enumerate() {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": t}));
    }
    let mut extra = json!({"user": user, "thread_id": thread});
    if let Some(s) = state {
        extra["state"] = json!(s);
    }
    content(&chat(addr, &Value::Array(messages), extra))
}

fn facts_of(addr: std::net::SocketAddr, user: &str) -> Vec<String> {
    let r = request(addr, "GET", &format!("/v1/users/{user}/facts"), &[], "");
    assert_eq!(r.status, 200, "{}", r.body);
    r.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["tombstoned"] == false)
        .map(|f| f["text"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_users_facts_and_thread_state_follow_them_to_another_replica() {
    let Some(r) = redis() else { return };
    let url = format!("redis://127.0.0.1:{}/", r.port);
    let dirs: Vec<tempfile::TempDir> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let q1 = "What do you know about me?";
    let q2 = "And what should I do tomorrow?";

    let a = Replica::start(dirs[0].path(), &url, dual());
    let b = Replica::start(dirs[1].path(), &url, dual());
    // A fact added on A is attended on B: B answers as a user whose system messages spell it out.
    assert_eq!(post(a.addr, "/v1/users/ann/facts", &json!({"text": ANN})).status, 201);
    // A thread's state entry set on A.
    let first = ask(a.addr, "sam", "t", &[], &[q1], Some(STATE));
    a.flush();
    let spelled = ask(b.addr, "ref", "t1", &[ANN], &[q1], None);
    assert_eq!(ask(b.addr, "ann", "t1", &[], &[q1], None), spelled, "B attends the fact A added");
    assert_eq!(facts_of(b.addr, "ann"), vec![ANN]);
    // The state entry set on A is attended on B's turn of that thread (B's ring starts empty:
    // rings stay local), as a thread that sets the same state there answers.
    let turns = [q1, first.as_str(), q2];
    let with_state = ask(b.addr, "ref2", "t", &[], &turns, Some(STATE));
    assert_ne!(ask(b.addr, "ref3", "t", &[], &turns, None), with_state, "the state entry changes the answer");
    assert_eq!(ask(b.addr, "sam", "t", &[], &turns, None), with_state, "B sets the state entry A set");
    // A change on B goes on from A's log, and A takes it.
    assert_eq!(post(b.addr, "/v1/users/ann/facts", &json!({"text": ANN2})).status, 201);
    b.flush();
    assert_eq!(facts_of(a.addr, "ann"), vec![ANN, ANN2]);
    let spelled2 = ask(a.addr, "ref", "t1", &[ANN, ANN2], &[q1], None);
    assert_eq!(ask(a.addr, "ann", "t9", &[], &[q1], None), spelled2, "A attends the fact B added");
    a.stop();
    b.stop();

    // Both restart with empty data directories: only Redis remembers.
    let a = Replica::start(dirs[2].path(), &url, dual());
    let b = Replica::start(dirs[3].path(), &url, dual());
    assert_eq!(ask(b.addr, "ann", "t1", &[], &[q1], None), ask(b.addr, "ref", "t1", &[ANN, ANN2], &[q1], None));
    assert_eq!(ask(a.addr, "sam", "t", &[], &turns, None), with_state, "the state entry outlives both replicas");
    let hits = metric(a.addr, "engram_remote_hits_total");
    assert!(hits >= 1.0, "hits {hits}");

    // A bit-flipped log is a miss, counted: a replica that never saw the user has no facts.
    let key = r.cli(&["--scan", "--pattern", "engram:v1:t:*:doc:dual-facts:*"]);
    let key = key.lines().next().expect("the fact log's key").to_string();
    r.cli(&[
        "EVAL",
        "local m = redis.call('ZRANGE', KEYS[1], -1, -1)[1]; local i = math.floor(#m / 2); \
           local b = string.char((string.byte(m, i) + 1) % 256); redis.call('DEL', KEYS[1]); \
           return redis.call('ZADD', KEYS[1], 1, string.sub(m, 1, i - 1) .. b .. string.sub(m, i + 1))",
        "1",
        &key,
    ]);
    let dir = tempfile::tempdir().unwrap();
    let c = Replica::start(dir.path(), &url, dual());
    let bad = metric(c.addr, "engram_remote_bad_values_total");
    assert_eq!(request(c.addr, "GET", "/v1/users/ann/facts", &[], "").status, 404, "a flipped log is not used");
    assert_eq!(metric(c.addr, "engram_remote_bad_values_total"), bad + 1.0);
    c.stop();
    a.stop();
    b.stop();
}

#[test]
fn an_agent_deleted_on_one_replica_is_gone_on_the_others() {
    let Some(r) = redis() else { return };
    let url = format!("redis://127.0.0.1:{}/", r.port);
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let a = Replica::start(da.path(), &url, ContextMode::Sessions);
    let b = Replica::start(db.path(), &url, ContextMode::Sessions);
    assert_eq!(post(a.addr, "/v1/agents", &json!({"id": "helper", "system": "Be terse."})).status, 201);
    assert_eq!(post(a.addr, "/v1/agents", &json!({"id": "other"})).status, 201);
    a.flush();
    // B holds both (found in the tier) and uses one.
    assert_eq!(request(b.addr, "GET", "/v1/agents/helper", &[], "").status, 200);
    assert_eq!(request(b.addr, "GET", "/v1/agents/other", &[], "").status, 200);
    let gen = post(b.addr, "/v1/agents/helper/generate", &json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0}));
    assert_eq!(gen.status, 200, "{}", gen.body);

    // Deleted on A: B notices when the agent is used, and when it lists.
    assert_eq!(request(a.addr, "DELETE", "/v1/agents/helper", &[], "").status, 200);
    assert_eq!(request(a.addr, "DELETE", "/v1/agents/other", &[], "").status, 200);
    a.flush();
    let gen = post(b.addr, "/v1/agents/helper/generate", &json!({"prompt": "Hi", "max_tokens": 2, "temperature": 0}));
    assert_eq!(gen.status, 404, "{}", gen.body);
    assert_eq!(request(b.addr, "GET", "/v1/agents/helper", &[], "").status, 404);
    let listed = request(b.addr, "GET", "/v1/agents", &[], "").json();
    assert_eq!(listed["data"], json!([]), "B no longer lists agents A deleted");
    // Created anew on A under the same id: B takes the new definition.
    assert_eq!(post(a.addr, "/v1/agents", &json!({"id": "helper", "system": "Be verbose."})).status, 201);
    a.flush();
    let got = request(b.addr, "GET", "/v1/agents/helper", &[], "");
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["system"], "Be verbose.");
    // Redis forgetting everything (restarted empty) is not a deletion: B keeps what it holds.
    r.cli(&["FLUSHALL"]);
    assert_eq!(request(b.addr, "GET", "/v1/agents/helper", &[], "").status, 200);
    a.stop();
    b.stop();
}
