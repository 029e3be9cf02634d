//! The layering the seam exists for, read from the crates' `Cargo.toml` files: the engine
//! depends on no policy crate, no policy crate depends on another policy crate or on the
//! server, and the KV store depends on no policy.

use std::path::PathBuf;

/// The crates that decide what a sequence reuses and keeps.
const POLICIES: [&str; 4] = ["engram-context", "engram-dual", "engram-rag", "engram-sparse"];

/// `crate_dir`'s normal `[dependencies]` that are workspace crates (`engram-*`).
fn engram_deps(crate_dir: &str) -> Vec<String> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(crate_dir).join("Cargo.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut in_deps = false;
    let mut deps = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
            continue;
        }
        if in_deps {
            if let Some(name) = line.split(['=', '.', ' ']).next().filter(|n| n.starts_with("engram-")) {
                deps.push(name.to_string());
            }
        }
    }
    deps
}

#[test]
fn the_engine_depends_on_no_policy_crate() {
    let deps = engram_deps("engine");
    assert!(deps.contains(&"engram-policy".to_string()), "the engine reaches policies through the seam: {deps:?}");
    for p in POLICIES {
        assert!(!deps.contains(&p.to_string()), "engram-engine depends on the policy crate {p}");
    }
}

#[test]
fn no_policy_depends_on_another_policy_or_the_server() {
    for (dir, name) in [("context", "engram-context"), ("dual", "engram-dual"), ("rag", "engram-rag"), ("sparse", "engram-sparse")] {
        let deps = engram_deps(dir);
        assert!(deps.contains(&"engram-policy".to_string()), "{name} implements the seam: {deps:?}");
        for other in POLICIES.iter().chain(&["engram-server", "engram-scenario", "engram-bench"]) {
            assert!(*other == name || !deps.contains(&other.to_string()), "{name} depends on {other}");
        }
    }
}

#[test]
fn the_kv_store_and_the_seam_depend_on_no_policy() {
    for dir in ["kv", "policy"] {
        let deps = engram_deps(dir);
        for p in POLICIES.iter().chain(&["engram-engine"]) {
            assert!(!deps.contains(&p.to_string()), "{dir} depends on {p}");
        }
    }
}
