//! The checked envelope of Engram's small files (a RAG store's manifests, a user's fact log, a
//! dual-stream ring's manifest): one header line, then the body.
//!
//! ```text
//!  <magic> v<version> <body bytes> <blake3 of body, hex>\n
//!  <body>
//! ```
//! Invariant: [`open`] hands back a body only if magic, version, length and checksum all check
//! out, else an [`EnvelopeError`] saying which; [`write`] writes [`seal`]'s bytes with
//! [`crate::persist::atomic_write`] (temp file, fsync, rename, fsync of the folder), so a crash
//! leaves the old file or the new one.

use std::path::Path;

/// The header line longer than which a file is not an envelope (real ones are ~100 bytes).
const MAX_HEADER: usize = 256;

/// Why bytes are not a sound envelope of the expected kind.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("not an engram file (no header line)")]
    NoHeader,
    #[error("not an engram file (header not text)")]
    HeaderNotText,
    #[error("not a {expected} file")]
    Foreign { expected: String },
    #[error("format {found} (this build reads v{reads})")]
    Version { found: String, reads: u32 },
    #[error("bad length in the header")]
    BadLength,
    #[error("truncated or extended: {found} body bytes, the header says {header}")]
    Length { found: usize, header: usize },
    #[error("checksum mismatch (damaged)")]
    Checksum,
}

/// `body` under the header of `magic` / `version`: the bytes of a file.
pub fn seal(magic: &str, version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = format!("{magic} v{version} {} {}\n", body.len(), blake3::hash(body).to_hex()).into_bytes();
    out.extend_from_slice(body);
    out
}

/// The body of `bytes` if they are a sound envelope of `magic` / `version`.
pub fn open<'a>(bytes: &'a [u8], magic: &str, version: u32) -> Result<&'a [u8], EnvelopeError> {
    let nl = bytes.iter().position(|&b| b == b'\n').filter(|&n| n < MAX_HEADER).ok_or(EnvelopeError::NoHeader)?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| EnvelopeError::HeaderNotText)?;
    let fields: Vec<&str> = header.split(' ').collect();
    if fields.len() != 4 || fields[0] != magic {
        return Err(EnvelopeError::Foreign { expected: magic.to_string() });
    }
    if fields[1] != format!("v{version}") {
        return Err(EnvelopeError::Version { found: fields[1].to_string(), reads: version });
    }
    let len: usize = fields[2].parse().map_err(|_| EnvelopeError::BadLength)?;
    let body = &bytes[nl + 1..];
    if body.len() != len {
        return Err(EnvelopeError::Length { found: body.len(), header: len });
    }
    if blake3::hash(body).to_hex().as_str() != fields[3] {
        return Err(EnvelopeError::Checksum);
    }
    Ok(body)
}

/// Writes `body` sealed as `magic` / `version` to `path`, atomically.
pub fn write(path: &Path, magic: &str, version: u32, body: &[u8]) -> std::io::Result<()> {
    let bytes = seal(magic, version, body);
    crate::persist::atomic_write(path, |w| std::io::Write::write_all(w, &bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_body_opens_and_every_damage_is_named() {
        let sealed = seal("engram-test", 2, b"{\"a\":1}");
        assert_eq!(open(&sealed, "engram-test", 2), Ok(&b"{\"a\":1}"[..]));
        assert_eq!(open(&sealed, "engram-other", 2), Err(EnvelopeError::Foreign { expected: "engram-other".into() }));
        assert_eq!(open(&sealed, "engram-test", 3), Err(EnvelopeError::Version { found: "v2".into(), reads: 3 }));
        assert_eq!(open(&sealed[..sealed.len() - 1], "engram-test", 2), Err(EnvelopeError::Length { found: 6, header: 7 }));
        let mut flipped = sealed.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(open(&flipped, "engram-test", 2), Err(EnvelopeError::Checksum));
        assert_eq!(open(b"no newline at all", "engram-test", 2), Err(EnvelopeError::NoHeader));
        assert_eq!(open(&[0xFF, b'\n'], "engram-test", 2), Err(EnvelopeError::HeaderNotText));
        assert_eq!(open(b"engram-test v2 x 00\n", "engram-test", 2), Err(EnvelopeError::BadLength));
    }

    #[test]
    fn write_replaces_the_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        write(&path, "engram-test", 1, b"first").unwrap();
        write(&path, "engram-test", 1, b"second").unwrap();
        assert_eq!(open(&std::fs::read(&path).unwrap(), "engram-test", 1), Ok(&b"second"[..]));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temp file left");
    }
}
