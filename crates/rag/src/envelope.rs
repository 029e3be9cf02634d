//! The store's files in Engram's one record envelope (`engram_kv::envelope`: magic, version,
//! length and blake3 of the body, written atomically), with errors as [`RagError`]s naming
//! the file.
//!
//! Invariant: a body is handed back only if the envelope checks out; see `engram_kv::envelope`.

use std::path::Path;

use engram_kv::envelope;

use crate::error::{RagError, Result};

/// Writes `body` under the envelope `magic`/`version` to `path`, atomically.
pub fn write_atomic(path: &Path, magic: &str, version: u32, body: &[u8]) -> Result<()> {
    envelope::write_sealed(path, magic, version, body).map_err(|e| RagError::io(path, e))
}

/// The body of `path` (`None` if there is no such file), checked.
pub fn read_checked(path: &Path, magic: &str, version: u32) -> Result<Option<Vec<u8>>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RagError::io(path, e)),
    };
    let body = envelope::open(&bytes, magic, version).map_err(|e| RagError::bad_store(path, e.to_string()))?;
    Ok(Some(body.to_vec()))
}
