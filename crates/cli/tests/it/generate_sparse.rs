//! `engram generate --sparse` through the binary (the committed pycode-7m): bad
//! configurations are clear errors; a budget covering the prompt falls back to exact attention
//! with a warning and generates what the exact path does; a small budget runs sparse.

use std::path::PathBuf;
use std::process::{Command, Output};

fn model() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/pycode-7m/pycode-7m-q8_0.gguf").display().to_string()
}

fn engram(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_engram")).args(args).output().expect("run engram")
}

fn generate(prompt: &str, extra: &[&str]) -> Output {
    let m = model();
    let mut args = vec!["generate", "--model", &m, "--threads", "1", "--prompt", prompt, "--max-tokens", "16"];
    args.extend_from_slice(extra);
    engram(&args)
}

#[test]
fn bad_sparse_configurations_are_clear_errors() {
    for (extra, says) in [
        (&["--sparse", "bogus"][..], "unknown sparse method"),
        (&["--sparse-budget", "16"][..], "--sparse-budget needs --sparse"),
        (&["--sparse", "dynakv", "--sparse-budget", "0"][..], "at least 1 token"),
    ] {
        let out = generate("def f(x):", extra);
        assert!(!out.status.success(), "{extra:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{extra:?}: {err}");
    }
}

#[test]
fn a_budget_covering_the_prompt_runs_exact_and_a_small_one_runs_sparse() {
    let short = "def parse_args(argv):\n    ";
    let exact = generate(short, &[]);
    assert!(exact.status.success());
    let fallback = generate(short, &["--sparse", "dynakv"]);
    assert!(fallback.status.success(), "{}", String::from_utf8_lossy(&fallback.stderr));
    let err = String::from_utf8_lossy(&fallback.stderr);
    assert!(err.contains("warning") && err.contains("running exact attention"), "{err}");
    assert_eq!(fallback.stdout, exact.stdout, "the fallback generates what exact attention does");

    let long = "import os\nimport sys\n\ndef walk(root):\n    for name in os.listdir(root):\n        path = os.path.join(root, name)\n        yield path\n\n".repeat(12);
    let sparse = generate(&long, &["--sparse", "dynakv", "--sparse-budget", "32"]);
    let err = String::from_utf8_lossy(&sparse.stderr);
    assert!(sparse.status.success(), "{err}");
    assert!(err.contains("sparse dynakv (budget 32"), "{err}");
    assert!(!sparse.stdout.is_empty());
}

#[test]
fn offloaded_generation_writes_what_the_in_ram_one_does_and_leaves_no_file() {
    let long = "import os\nimport sys\n\ndef walk(root):\n    for name in os.listdir(root):\n        path = os.path.join(root, name)\n        yield path\n\n".repeat(24);
    let ram = generate(&long, &["--sparse", "dynakv", "--sparse-budget", "32"]);
    assert!(ram.status.success());
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().display().to_string();
    let off = generate(&long, &["--sparse", "dynakv", "--sparse-budget", "32", "--sparse-offload", &d, "--sparse-ram-mib", "0"]);
    let err = String::from_utf8_lossy(&off.stderr);
    assert!(off.status.success(), "{err}");
    assert!(err.contains("offloaded:"), "{err}");
    // The prompt spans several prefill chunks and goes to the file as it is written: the KV
    // held in RAM during the prefill stays well below the prompt's.
    let number = |after: &str| -> f64 {
        err.split(after)
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{after:?} in {err}"))
    };
    assert!(number("prompt ") > 600.0, "{err}");
    assert!(number("at most ") < number("MiB of ") / 2.0, "{err}");
    assert_eq!(off.stdout, ram.stdout, "offload is lossless");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the file is removed at exit");
    let missing = format!("{d}/no/such/dir");
    let bad = generate(&long, &["--sparse", "dynakv", "--sparse-budget", "32", "--sparse-offload", &missing, "--sparse-ram-mib", "0"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no/such/dir"));
    let alone = generate("def f(x):", &["--sparse-offload", &d]);
    assert!(String::from_utf8_lossy(&alone.stderr).contains("--sparse-offload needs --sparse"));
}
