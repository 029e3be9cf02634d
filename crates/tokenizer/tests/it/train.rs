//! Training the fixture BPE: speed, shape, determinism (also across processes).
use crate::common;
use common::*;
use engram_tokenizer::*;
use std::time::Instant;

#[test]
fn fixture_training_is_fast_and_shaped() {
    let t0 = Instant::now();
    let tk = train_bpe(FIXTURE_CORPUS, 2048, &FIXTURE_SPECIAL_TOKENS).unwrap();
    let dt = t0.elapsed();
    assert!(dt.as_secs_f64() < 10.0, "training took {dt:?}");
    assert_eq!(tk.get_vocab_size(true), 2048);
    for (i, s) in FIXTURE_SPECIAL_TOKENS.iter().enumerate() {
        assert_eq!(tk.token_to_id(s), Some(i as u32), "{s}");
    }
    // the 256 byte-level symbols come right after the specials
    assert_eq!(tk.token_to_id("!"), Some(4));
    // BOS prepended for single sequences, never twice
    let e = tk.encode("Hello world", true).unwrap();
    assert_eq!(e.get_ids()[0], 0);
    assert_ne!(e.get_ids()[1], 0);
    let e = tk.encode("Hello world", false).unwrap();
    assert_ne!(e.get_ids()[0], 0);
    // merges learned: common words are single tokens
    let e = tk.encode(" the", false).unwrap();
    assert_eq!(e.get_ids().len(), 1);
}

#[test]
fn fixture_roundtrips_text() {
    let tk = Tokenizer::from_tokenizers(fixture().clone()).unwrap();
    for s in SAMPLES.iter().copied().chain([&FIXTURE_CORPUS[..5000]]) {
        let e = tk.encode(s, false).unwrap();
        assert_eq!(tk.decode(&e.ids, false).unwrap(), s);
        let e = tk.encode(s, true).unwrap();
        assert_eq!(e.ids[0], 0);
        assert_eq!(tk.decode(&e.ids[1..], false).unwrap(), s);
        assert_eq!(tk.decode(&e.ids, false).unwrap(), format!("<s>{s}"));
    }
    // the corpus really has multi-byte characters split over several tokens
    let e = tk.encode("日本語", false).unwrap();
    assert!(e.ids.len() > 3);
}

#[test]
fn training_is_deterministic_in_process() {
    let a = train_bpe(FIXTURE_CORPUS, 2048, &FIXTURE_SPECIAL_TOKENS).unwrap();
    let b = train_bpe(FIXTURE_CORPUS, 2048, &FIXTURE_SPECIAL_TOKENS).unwrap();
    assert_eq!(a.to_string(false).unwrap(), b.to_string(false).unwrap());
    assert_eq!(a.to_string(false).unwrap(), fixture_json());
    // a larger vocabulary has many more count ties: still identical
    let a = train_bpe(FIXTURE_CORPUS, 6000, &FIXTURE_SPECIAL_TOKENS).unwrap();
    let b = train_bpe(FIXTURE_CORPUS, 6000, &FIXTURE_SPECIAL_TOKENS).unwrap();
    assert_eq!(a.to_string(false).unwrap(), b.to_string(false).unwrap());
}

/// Helper run in a child process by `training_is_deterministic_across_processes`.
#[test]
#[ignore = "helper: run by training_is_deterministic_across_processes"]
fn emit_fixture_json() {
    if let Ok(path) = std::env::var("ENGRAM_TOK_EMIT") {
        std::fs::write(path, fixture_json()).unwrap();
    }
}

#[test]
fn training_is_deterministic_across_processes() {
    // Fresh processes get fresh hash seeds (and, with the variable, no rayon).
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    for (i, par) in [None, Some("false"), Some("true")].into_iter().enumerate() {
        let out = dir.path().join(format!("t{i}.json"));
        let mut cmd = std::process::Command::new(&exe);
        cmd.args(["--ignored", "--exact", "train::emit_fixture_json", "--test-threads=1"])
            .env("ENGRAM_TOK_EMIT", &out)
            .stdout(std::process::Stdio::null());
        match par {
            Some(v) => cmd.env("TOKENIZERS_PARALLELISM", v),
            None => cmd.env_remove("TOKENIZERS_PARALLELISM"),
        };
        let status = cmd.status().unwrap();
        assert!(status.success());
        let got = std::fs::read_to_string(&out).unwrap();
        assert!(got == fixture_json(), "process {i} trained a different tokenizer.json");
    }
}

#[test]
fn train_rejects_bad_arguments() {
    assert!(train_bpe(FIXTURE_CORPUS, 100, &FIXTURE_SPECIAL_TOKENS).is_err());
    assert!(train_bpe(FIXTURE_CORPUS, 1000, &["<s>", "<s>"]).is_err());
    assert!(train_bpe(FIXTURE_CORPUS, 1000, &[""]).is_err());
    // without "<s>" there is no post-processor
    let tk = train_bpe(FIXTURE_CORPUS, 400, &["<pad>"]).unwrap();
    assert_eq!(tk.token_to_id("<pad>"), Some(0));
    assert!(tk.get_post_processor().is_none());
}

/// The JSON must load in Python `tokenizers` and `transformers` and encode identically.
/// Skipped (with a note) when Python or those packages are absent.
#[test]
fn fixture_loads_in_python() {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import tokenizers, transformers"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipped: python3 with tokenizers+transformers not available");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    write_dir(
        dir.path(),
        &[("tokenizer_config.json", r#"{"bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "PreTrainedTokenizerFast"}"#)],
    );
    let samples = serde_json::to_string(SAMPLES).unwrap();
    std::fs::write(dir.path().join("samples.json"), &samples).unwrap();
    let script = r#"
import json, sys
from tokenizers import Tokenizer
from transformers import AutoTokenizer
d = sys.argv[1]
s = json.load(open(d + "/samples.json"))
t = Tokenizer.from_file(d + "/tokenizer.json")
a = AutoTokenizer.from_pretrained(d)
out = {"tokenizers": [t.encode(x).ids for x in s], "transformers": [a(x)["input_ids"] for x in s]}
print(json.dumps(out))
"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, dir.path().to_str().unwrap()])
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "python failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tk = Tokenizer::from_hf_dir(dir.path()).unwrap();
    for (i, s) in SAMPLES.iter().enumerate() {
        let ours: Vec<u64> = tk.encode(s, true).unwrap().ids.iter().map(|&x| x as u64).collect();
        for lib in ["tokenizers", "transformers"] {
            let theirs: Vec<u64> = v[lib][i].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).collect();
            assert_eq!(ours, theirs, "{lib} differs on {s:?}");
        }
    }
}
