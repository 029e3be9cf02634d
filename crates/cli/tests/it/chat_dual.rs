//! `engram chat --context dual` through the binary (the committed pycode-7m): the chat runs on
//! the dual-stream policy with `engram serve`'s flags. While its ring holds every turn it
//! answers as the sessions mode does (the anchors and the turns are the full rendering split
//! apart), though every turn sends only its new message; threads keep their own rings over one
//! persistent stream of the system prompt and facts; a small ring evicts whole turns and the
//! chat goes on; bad flag combinations are errors at start.

use std::io::Write;
use std::process::{Command, Output, Stdio};

use crate::chat::{cache_counts, model};

/// Runs `engram chat` with `extra` flags over `input` lines.
fn run_chat(data_dir: &std::path::Path, extra: &[&str], input: &str) -> Output {
    let m = model();
    let dir = data_dir.display().to_string();
    let mut args = vec!["chat", "--model", &m, "--threads", "1", "--data-dir", &dir, "--max-tokens", "8", "--system", "You write Python."];
    args.extend_from_slice(extra);
    let mut child = Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(&args)
        .env("ENGRAM_EMBEDDER", "none")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run engram chat");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    child.wait_with_output().unwrap()
}

/// (stdout, stderr) of a chat that must succeed.
fn chat(data_dir: &std::path::Path, extra: &[&str], input: &str) -> (String, String) {
    let out = run_chat(data_dir, extra, input);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

/// The prompt tokens of every turn's stats line of a dual-stream chat (the new turn alone).
fn new_prompt_tokens(err: &str) -> Vec<usize> {
    err.lines()
        .filter_map(|l| l.split_once(" ms, ")?.1.split_once(" new prompt tokens over the kept stream and turns")?.0.parse().ok())
        .collect()
}

/// The generated tokens of every turn's stats line.
fn completion_tokens(err: &str) -> Vec<usize> {
    err.lines()
        .filter_map(|l| l.split_once("turns, ").or_else(|| l.split_once("from cache, "))?.1.split_once(" tokens at ")?.0.parse().ok())
        .collect()
}

/// The ring keeps each answer's tokens as generated, and the sessions mode reuses them as far
/// as the next turn's rendering tokenizes the same way; while it does (the sessions mode's
/// turn k+1 took turn k's prompt and answer from the cache), the two modes see the same tokens
/// and answer the same (the server's `dual.rs` test makes the same comparison over HTTP).
#[test]
fn a_dual_chat_answers_as_the_sessions_mode_and_sends_only_new_messages() {
    let dir = tempfile::tempdir().unwrap();
    let input = "def add(a, b):\nclass Stack:\ndef pop(self):\n\n";
    let (sessions, s_err) = chat(dir.path(), &[], input);
    let (dual, d_err) = chat(dir.path(), &["--context", "dual"], input);
    let s = cache_counts(&s_err);
    let completions = completion_tokens(&s_err);
    assert_eq!((s.len(), completions.len()), (3, 3), "{s_err}");
    let agree = (1..3).take_while(|&k| s[k].0 + 1 >= s[k - 1].1 + completions[k - 1]).count() + 1;
    assert_eq!(agree, 3, "pycode-7m's answers here tokenize as generated: {s_err}");
    assert!(!sessions.trim().is_empty(), "{s_err}");
    assert_eq!(dual, sessions, "every turn answers as in the sessions mode");

    let d = new_prompt_tokens(&d_err);
    assert_eq!(d.len(), 3, "{d_err}");
    // Turn 1's prompt in dual-stream contexts is the turn alone: the system prompt (the user's
    // anchors) is the persistent stream's.
    assert!(d[0] < s[0].1, "the system prompt is not part of the turn's prompt: {d_err} / {s_err}");
    // Later turns carry only their new message (and the previous answer's closing), while the
    // sessions mode's prompt grows with the conversation.
    for k in 1..3 {
        assert!(d[k] < s[k].1 - s[k].0 + 8, "turn {k} sends its message, not the history: {d_err} / {s_err}");
        assert!(d[k] + 20 < s[k].1, "{d_err} / {s_err}");
    }
}

#[test]
fn threads_share_the_stream_and_a_small_ring_evicts_whole_turns() {
    let dir = tempfile::tempdir().unwrap();
    let input = "/fact The user writes Django apps.\ndef view(request):\n/thread work\ndef view(request):\n\n";
    let (out, err) = chat(dir.path(), &["--context", "dual"], input);
    let start = out.find("fact 1 added\n").expect("the fact is added") + "fact 1 added\n".len();
    let rest = &out[start..];
    let (first, second) = rest.split_once("new thread work\n").unwrap_or_else(|| panic!("{out}"));
    assert!(!first.trim().is_empty(), "{out}\n{err}");
    assert_eq!(first, second, "both threads start from the same stream: {out}");

    // A ring of 24 tokens holds about one turn: every later turn evicts an earlier one whole,
    // and the chat goes on answering.
    let many = "def a():\ndef b():\ndef c():\ndef d():\ndef e():\n\n";
    let (out, err) = chat(dir.path(), &["--context", "dual", "--ring-tokens", "24", "--log", "engram_dual=debug"], many);
    assert_eq!(new_prompt_tokens(&err).len(), 5, "{out}\n{err}");
    assert!(err.matches("whole turn(s) evicted from the ring").count() >= 3, "{err}");
    assert!(!err.contains("is not kept"), "every turn fits the ring on its own: {err}");
}

#[test]
fn bad_context_flags_are_errors_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_chat(dir.path(), &["--context", "ring"], "hi\n\n");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--context wants sessions or dual"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run_chat(dir.path(), &["--context", "dual", "--persistent-cap-tokens", "100", "--summary-target-tokens", "100"], "hi\n\n");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("must be below --persistent-cap-tokens"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The long-context layer cannot hold a dual-stream thread: refused as `serve` refuses it.
    let out = run_chat(dir.path(), &["--context", "dual", "--long-context-after", "64"], "hi\n\n");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--long-context-after does not work with --context dual"), "{err}");
}
