//! The store's file envelope and its one write path.
//!
//! ```text
//!  <magic> v<version> <body bytes> <blake3 of body, hex>\n
//!  <body: JSON>
//! ```
//! Invariant: [`write_atomic`] replaces a file whole — temp file in the same folder, fsync,
//! rename, fsync of the folder — so a crash leaves the old file or the new one; [`read_checked`]
//! hands back a body only if magic, version, length and checksum all check out, else an error
//! naming the file and what is wrong (truncated, damaged, foreign, another version).

use std::io::Write;
use std::path::Path;

use crate::error::{RagError, Result};

/// Writes `body` under the envelope `magic`/`version` to `path`, atomically.
pub fn write_atomic(path: &Path, magic: &str, version: u32, body: &[u8]) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let io = |e| RagError::io(path, e);
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(io)?;
    let header = format!("{magic} v{version} {} {}\n", body.len(), blake3::hash(body).to_hex());
    tmp.write_all(header.as_bytes()).map_err(io)?;
    tmp.write_all(body).map_err(io)?;
    tmp.as_file().sync_all().map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    // The rename is durable once the folder is.
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
    Ok(())
}

/// The body of `path` (`None` if there is no such file), checked; see the module doc.
pub fn read_checked(path: &Path, magic: &str, version: u32) -> Result<Option<Vec<u8>>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RagError::io(path, e)),
    };
    let bad = |why: &str| RagError::bad_store(path, why.to_string());
    let nl = bytes.iter().position(|&b| b == b'\n').filter(|&n| n < 256).ok_or_else(|| bad("not an engram file (no header line)"))?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| bad("not an engram file (header not text)"))?;
    let fields: Vec<&str> = header.split(' ').collect();
    if fields.len() != 4 || fields[0] != magic {
        return Err(bad(&format!("not a {magic} file")));
    }
    if fields[1] != format!("v{version}") {
        return Err(bad(&format!("format {} (this build reads v{version})", fields[1])));
    }
    let len: usize = fields[2].parse().map_err(|_| bad("bad length in header"))?;
    let body = &bytes[nl + 1..];
    if body.len() != len {
        return Err(bad(&format!("truncated or extended: {} body bytes, header says {len}", body.len())));
    }
    if blake3::hash(body).to_hex().as_str() != fields[3] {
        return Err(bad("checksum mismatch (damaged)"));
    }
    Ok(Some(body.to_vec()))
}
