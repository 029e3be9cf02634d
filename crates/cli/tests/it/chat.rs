//! `engram chat`'s dual-stream commands through the binary (the committed pycode-7m): `/fact`
//! adds a fact every thread attends, `/facts` lists them with tombstones, `/forget` tombstones
//! one, `/thread NAME` switches threads (a new thread with the same facts answers as the first
//! did), bad commands are clear errors and the chat goes on; facts survive a restart.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

fn model() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/pycode-7m/pycode-7m-q8_0.gguf").display().to_string()
}

/// Runs `engram chat` over `input` lines; returns (stdout, stderr).
fn chat(data_dir: &std::path::Path, input: &str) -> (String, String) {
    let m = model();
    let dir = data_dir.display().to_string();
    let args = ["chat", "--model", &m, "--threads", "1", "--data-dir", &dir, "--max-tokens", "8", "--system", "You write Python."];
    let mut child = Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run engram chat");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn facts_and_threads_in_the_chat() {
    let dir = tempfile::tempdir().unwrap();
    let input = "/fact The user writes Django apps.\n/facts\ndef view(request):\n/thread work\ndef view(request):\n\
                 /fact The user prefers tabs.\n/forget 2\n/facts\n/thread bad name\n/bogus\n/forget two\n\n";
    let (out, err) = chat(dir.path(), input);
    // Answers may span lines: cut the output at the commands' own lines.
    let between = |from: &str, to: &str| {
        let start = out.find(from).unwrap_or_else(|| panic!("{from:?} in {out}")) + from.len();
        out[start..start + out[start..].find(to).unwrap_or_else(|| panic!("{to:?} in {out}"))].to_string()
    };
    assert!(out.starts_with("fact 1 added\n   1  The user writes Django apps.\n"), "{out}");
    // Both threads start from the same system prompt and facts: the same first answer.
    let first = between("   1  The user writes Django apps.\n", "new thread work\n");
    let second = between("new thread work\n", "fact 2 added\n");
    assert!(!first.trim().is_empty(), "{out}");
    assert_eq!(first, second, "{out}");
    assert!(
        out.contains("fact 2 added\nfact 2 tombstoned\n   1  The user writes Django apps.\n   2  [tombstoned] The user prefers tabs.\n"),
        "{out}"
    );
    assert!(err.contains("/thread wants a name"), "{err}");
    assert!(err.contains("unknown command /bogus"), "{err}");
    assert!(err.contains("/forget wants a fact id"), "{err}");

    // A restart keeps the facts (tombstones shown).
    let (out, _) = chat(dir.path(), "/facts\n/forget 2\n\n");
    assert_eq!(out.lines().next(), Some("   1  The user writes Django apps."), "{out}");
    assert!(out.contains("   2  [tombstoned] The user prefers tabs."), "{out}");
    let (_, err) = chat(dir.path(), "/forget 2\n\n");
    assert!(err.contains("already tombstoned"), "{err}");
}
