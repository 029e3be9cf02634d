//! The store's files in the KV crate's checked envelope ([`engram_kv::envelope`]:
//! `<magic> v<version> <len> <blake3>\n` then a JSON body), with the store's errors.
//!
//! Invariant: [`write_atomic`] replaces a file whole (a crash leaves the old file or the new
//! one); [`read_checked`] hands back a body only if magic, version, length and checksum all
//! check out, else an error naming the file and what is wrong (truncated, damaged, foreign,
//! another version).

use std::path::Path;

use engram_kv::envelope;

use crate::error::{RagError, Result};

/// Writes `body` under the envelope `magic`/`version` to `path`, atomically.
pub fn write_atomic(path: &Path, magic: &str, version: u32, body: &[u8]) -> Result<()> {
    envelope::write(path, magic, version, body).map_err(|e| RagError::io(path, e))
}

/// The body of `path` (`None` if there is no such file), checked; see the module doc.
pub fn read_checked(path: &Path, magic: &str, version: u32) -> Result<Option<Vec<u8>>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RagError::io(path, e)),
    };
    envelope::open(&bytes, magic, version).map(|body| Some(body.to_vec())).map_err(|e| RagError::bad_store(path, e.to_string()))
}
