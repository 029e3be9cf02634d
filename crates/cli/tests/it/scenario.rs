//! `engram scenario` through the binary: `validate` passes the shipped files and refuses a
//! bad one with its line; `run` streams a shipped scenario and writes its report as JSON, in
//! which every agent's turns after its first come from its cache; a second run finds the
//! permanent agents' caches (identity-based keys) in the cache directory.

use std::process::{Command, Output};

use engram_fixture::{GgufFormat, Shape};

fn engram(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_engram")).args(args).output().expect("run engram")
}

fn example(name: &str) -> String {
    format!("{}/../../examples/scenarios/{name}.yaml", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn validate_passes_the_shipped_files_and_names_the_line_of_a_bad_one() {
    for f in ["gossip", "prisoners-dilemma"] {
        let out = engram(&["scenario", "validate", &example(f)]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains(": ok ("));
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "id: x\nagents:\n  - id: a\nphases:\n  - name: p\n    agents: [a, b]\n").unwrap();
    let out = engram(&["scenario", "validate", bad.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 6: phase \"p\" names agent \"b\", which is not defined"), "{err}");
}

#[test]
fn run_reports_each_agents_cache_and_permanent_agents_outlive_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let files = engram_fixture::generate(Shape::Tiny, engram_fixture::DEFAULT_SEED, dir.path(), &[GgufFormat::Q8_0], &mut |_| {}).unwrap();
    let model = files.gguf(GgufFormat::Q8_0).unwrap().to_str().unwrap().to_string();
    let cache = dir.path().join("cache");
    let run = || {
        let args = ["scenario", "run", &example("gossip"), "--model", &model, "--max-tokens", "6", "--json"];
        let out = engram(&[&args[..], &["--cache-dir", cache.to_str().unwrap(), "--kv-format", "f32"]].concat());
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let progress = String::from_utf8_lossy(&out.stderr).to_string();
        assert!(progress.contains("## Phase 3: The Reunion") && progress.contains("cached"), "{progress}");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let first = run();
    let phases = first["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 3);
    let mut seen = std::collections::BTreeSet::new();
    for t in phases.iter().flat_map(|p| p["turns"].as_array().unwrap()) {
        let agent = t["agent"].as_str().unwrap().to_string();
        let cached = t["cached_tokens"].as_u64().unwrap();
        assert_eq!(t["computed_tokens"].as_u64().unwrap() + cached, t["prompt_tokens"].as_u64().unwrap());
        if !seen.insert(agent.clone()) {
            assert!(cached > 0, "{agent}: {t}");
        }
    }
    assert_eq!(phases[0]["messages"][0]["visible_to"], serde_json::json!(["alice", "bob"]));
    // The same file again: each permanent agent's first turn reuses the cache it left
    // (its system prompt and phase 1 opening, a DIVERGE of the longer conversation).
    let again = run();
    let opening = &again["phases"][0]["turns"][0];
    assert!(opening["cached_tokens"].as_u64().unwrap() > 0, "{opening}");
    assert_eq!(again["phases"][0]["messages"], first["phases"][0]["messages"]);
}
