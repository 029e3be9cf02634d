//! `engram serve --long-context-after` beside `--context dual` is refused at start with an
//! error naming both flags (a dual-stream thread never goes sparse, so the flag would do
//! nothing); nothing is served and nothing is written under the data directory's `long`.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn dual_stream_contexts_with_long_context_are_refused_at_start() {
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/pycode-7m/pycode-7m-q8_0.gguf");
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(["serve", "--model"])
        .arg(&model)
        .args(["--data-dir"])
        .arg(data.path())
        .args(["--port", "0", "--no-rag", "--context", "dual", "--long-context-after", "4096"])
        .output()
        .expect("run engram");
    assert!(!out.status.success(), "served anyway");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--long-context-after") && err.contains("--context dual"), "{err}");
    assert!(!data.path().join("long").exists(), "refused before the offload folder is made");
}
