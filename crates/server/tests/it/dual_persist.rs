//! `--context dual` over HTTP, what `tests/it/dual.rs` leaves out (the hybrid mode, restarts):
//! - the chat `"state"` field (the hybrid mode): a thread's state entry set, replaced and
//!   removed changes the answers as expected — the same state gives the same answer, another
//!   state another one, a replacement by the same text changes nothing, an empty state on a
//!   thread without one is a no-op — and without dual contexts, or over half the ring, it is a
//!   400 that changes nothing stored;
//! - a restart with a session directory: users' persistent streams and threads' rings come
//!   back from `<session dir>/dual`, and the conversation goes on answering as a server that
//!   never restarted.

use crate::common;
use common::*;
use engram_server::{ContextMode, ServerConfig};
use serde_json::{json, Value};

fn dual(ring_tokens: usize) -> ServerConfig {
    ServerConfig {
        context: ContextMode::Dual { ring_tokens, threshold: 0.6, keep_last: 1, persistent_cap: 512, summary_target: 300 },
        ..ServerConfig::new("tiny")
    }
}

const S1: &str = "Today the user ran 5 km in 31 minutes and slept 7 hours.";
const S2: &str = "Steps so far: 18000. Heart rate resting at 52; goal reached twice this week.";

/// A conversation of `turns` on `user`'s thread "t", each `(state field, question)`; the
/// answers.
fn run(addr: std::net::SocketAddr, user: &str, turns: &[(Option<&str>, &str)]) -> Vec<String> {
    let mut messages = vec![json!({"role": "system", "content": "You are a fitness coach."})];
    run_on(addr, user, &mut messages, turns)
}

/// [`run`] going on from `messages` (the history sent so far), which it extends.
fn run_on(addr: std::net::SocketAddr, user: &str, messages: &mut Vec<Value>, turns: &[(Option<&str>, &str)]) -> Vec<String> {
    let mut answers = Vec::new();
    for (state, q) in turns {
        messages.push(json!({"role": "user", "content": q}));
        let mut extra = json!({"user": user, "thread_id": "t"});
        if let Some(s) = state {
            extra["state"] = json!(s);
        }
        let r = chat(addr, &Value::Array(messages.clone()), extra);
        assert_eq!(r.status, 200, "{}", r.body);
        let a = content(&r);
        messages.push(json!({"role": "assistant", "content": a.clone()}));
        answers.push(a);
    }
    answers
}

#[test]
fn a_state_set_replaced_and_removed_changes_the_answers_as_expected() {
    let addr = start(64 << 20, dual(512));
    let q1 = "How am I doing?";
    let q2 = "What should I do tomorrow?";
    // Set: the same state gives the same answer on any user's thread, another state or none
    // another one; an empty state on a thread without one changes nothing.
    let a = run(addr, "a", &[(Some(S1), q1)]);
    assert_eq!(run(addr, "b", &[(Some(S1), q1)]), a);
    let other = run(addr, "c", &[(Some(S2), q1)]);
    let none = run(addr, "d", &[(None, q1)]);
    assert_ne!(other, a, "another state, another answer");
    assert_ne!(none, a, "no state, another answer");
    assert_eq!(run(addr, "e", &[(Some(""), q1)]), none, "an empty state on a thread without one is a no-op");

    // Replace: a second turn with the state replaced by another text answers otherwise than
    // with the state left as it was; replaced by the same text, exactly as left.
    let kept = run(addr, "p", &[(Some(S1), q1), (None, q2)]);
    let same = run(addr, "q", &[(Some(S1), q1), (Some(S1), q2)]);
    let replaced = run(addr, "r", &[(Some(S1), q1), (Some(S2), q2)]);
    assert_eq!(same, kept, "replaced by the same text: the same KV, the same answer");
    assert_eq!(replaced[0], kept[0]);
    assert_ne!(replaced[1], kept[1], "the replaced state is attended from the next turn");

    // Remove: the next turn no longer attends the state.
    let removed = run(addr, "s", &[(Some(S1), q1), (Some(""), q2)]);
    assert_eq!(removed[0], kept[0]);
    assert_ne!(removed[1], kept[1], "the removed state is no longer attended");
}

#[test]
fn a_state_without_dual_contexts_or_over_half_the_ring_is_a_400_that_changes_nothing() {
    let messages = json!([{"role": "system", "content": "You are a fitness coach."}, {"role": "user", "content": "How am I doing?"}]);
    // Without --context dual.
    let sessions = start(64 << 20, ServerConfig::new("tiny"));
    let r = chat(sessions, &messages, json!({"state": S1, "session_id": "s1"}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "state", "{}", r.body);
    // Nothing stored: the same session's next request reuses nothing.
    let r = chat(sessions, &messages, json!({"session_id": "s1"}));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 0, "{}", r.body);

    // Over half the ring: a 400 naming the field; the thread is as if never asked.
    let addr = start(64 << 20, dual(48));
    let long = S1.repeat(6);
    let r = chat(addr, &messages, json!({"user": "big", "thread_id": "t", "state": long}));
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["error"]["param"], "state", "{}", r.body);
    let after = run(addr, "big", &[(None, "How am I doing?")]);
    let fresh = run(addr, "fresh", &[(None, "How am I doing?")]);
    assert_eq!(after, fresh, "the refused state left nothing in the thread");
    assert_eq!(metric(addr, "engram_turns_evicted_total"), 0.0);
}

#[test]
fn a_restarted_server_goes_on_with_the_users_streams_and_rings() {
    let config = |dir: &std::path::Path| {
        let mut c = persisting(dir, engram_kv::EvictionPolicy::Weighted);
        c.context = dual(96).context;
        c
    };
    let turns: Vec<(Option<&str>, &str)> =
        vec![(Some(S1), "How am I doing?"), (None, "And my sleep?"), (None, "Plan my week."), (None, "Thanks! Anything else?")];
    // Never restarted.
    let d0 = tempfile::tempdir().unwrap();
    let (addr, stop, thread) = start_stoppable(config(d0.path()));
    let want = run(addr, "ann", &turns);
    assert!(metric(addr, "engram_turns_evicted_total") > 0.0, "the 96-token ring evicts");
    stop.send(()).unwrap();
    thread.join().unwrap();

    // Restarted after three turns: the fourth answers the same.
    let d1 = tempfile::tempdir().unwrap();
    let (addr, stop, thread) = start_stoppable(config(d1.path()));
    let mut messages = vec![json!({"role": "system", "content": "You are a fitness coach."})];
    let before = run_on(addr, "ann", &mut messages, &turns[..3]);
    stop.send(()).unwrap();
    thread.join().unwrap();
    let files: Vec<String> = std::fs::read_dir(d1.path().join("kv").join("dual"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert!(files.iter().any(|f| f.starts_with("stream-")) && files.iter().any(|f| f.ends_with(".ring")), "{files:?}");
    let (addr, stop, thread) = start_stoppable(config(d1.path()));
    let after = run_on(addr, "ann", &mut messages, &turns[3..]);
    stop.send(()).unwrap();
    thread.join().unwrap();
    assert_eq!([before, after].concat(), want, "the conversation goes on as if the server never stopped");
}
