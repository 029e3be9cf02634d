//! `engram chat`'s dual-stream commands through the binary (the committed pycode-7m): `/fact`
//! adds a fact every thread attends, `/facts` lists them with tombstones, `/forget` tombstones
//! one, `/thread NAME` switches threads (a new thread with the same facts answers as the first
//! did), bad commands are clear errors and the chat goes on; facts survive a restart. A
//! second turn reuses the first turn's cache (the stats line says so) and answers exactly as
//! a cold run of the same rendered conversation.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

pub(crate) fn model() -> String {
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

/// The `(cached, prompt)` token counts of every turn's stats line on stderr.
pub(crate) fn cache_counts(err: &str) -> Vec<(usize, usize)> {
    err.lines()
        .filter_map(|l| {
            let rest = l.split_once(" ms, ")?.1;
            let (cached, rest) = rest.split_once(" of ")?;
            let prompt = rest.split_once(" prompt tokens from cache")?.0;
            Some((cached.parse().ok()?, prompt.parse().ok()?))
        })
        .collect()
}

#[test]
fn a_second_turn_reuses_the_first_turns_cache_and_equals_a_cold_run() {
    let dir = tempfile::tempdir().unwrap();
    let (first, _) = chat(dir.path(), "def add(a, b):\n\n");
    let (both, err) = chat(dir.path(), "def add(a, b):\nclass Stack:\n\n");
    let answer1 = first.strip_suffix('\n').expect("an answer ends with a newline");
    let answer2 = both.strip_prefix(first.as_str()).unwrap_or_else(|| panic!("turn 1 answers as before: {first:?} vs {both:?}"));
    let answer2 = answer2.strip_suffix('\n').expect("an answer ends with a newline");
    let counts = cache_counts(&err);
    assert_eq!(counts.len(), 2, "{err}");
    assert_eq!(counts[0].0, 0, "the first turn starts cold: {err}");
    assert!(counts[1].0 >= counts[0].1, "turn 2 takes at least turn 1's prompt from the cache: {err}");
    assert!(counts[1].0 < counts[1].1, "{err}");

    // Cold: the same conversation rendered and generated from an empty cache.
    let model = engram_model::Model::load(std::path::Path::new(&model())).unwrap();
    let tok = &model.tokenizer;
    let messages = [
        engram_tokenizer::ChatMessage::new("system", "You write Python."),
        engram_tokenizer::ChatMessage::new("user", "def add(a, b):"),
        engram_tokenizer::ChatMessage::new("assistant", answer1),
        engram_tokenizer::ChatMessage::new("user", "class Stack:"),
    ];
    let text = tok.chat_template().unwrap().render(&messages, true, tok.bos_token().unwrap_or(""), tok.eos_token().unwrap_or("")).unwrap();
    let ids = tok.encode(&text, false).unwrap().ids;
    assert_eq!(ids.len(), counts[1].1, "the chat's turn 2 prompt is this rendering");
    let pool = engram_kv::KvPool::new(engram_kv::KvLayout::of(&model.config), engram_kv::KvFormat::F16, 64 << 20);
    let params = engram_engine::SamplingParams { max_tokens: 8, ..Default::default() };
    let cold = engram_engine::LoneSequence::new(&model, &pool).generate(&ids, &params, &mut |_| true).unwrap();
    assert_eq!(answer2, cold.text, "turn 2 on the reused cache vs a cold run");
}
