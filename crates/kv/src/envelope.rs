//! The one envelope of Engram's small record files (a RAG bank's manifest, a QA bank, a
//! user's fact log, a ring manifest), and its one write path.
//!
//! ```text
//!  <magic> v<version> <body bytes> <blake3 of body, hex>\n
//!  <body>
//! ```
//! Invariant: [`write_sealed`] replaces a file whole (temp file in the same folder, fsync,
//! rename, fsync of the folder: [`crate::persist::atomic_write`]), so a crash leaves the old
//! file or the new one; [`open`] hands back a body only if magic, version, length and checksum
//! all check out, else an [`EnvelopeError`] saying what is wrong (truncated, damaged, foreign,
//! another version).

use std::path::Path;

/// Headers are one short line; a longer first line is not an envelope.
const MAX_HEADER: usize = 256;

/// Why bytes are not a sound envelope of the expected kind.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// No header line (empty, or the first line is too long or not text).
    #[error("not an engram file (no header line)")]
    NoHeader,
    /// A header of another kind of file.
    #[error("not a {expected} file")]
    Foreign { expected: String },
    /// The expected kind, another format version.
    #[error("format {found} (this build reads v{reads})")]
    Version { found: String, reads: u32 },
    /// The header's length field does not parse.
    #[error("bad length in header")]
    BadLength,
    /// The body is shorter or longer than the header says.
    #[error("truncated or extended: {body} body bytes, the header says {header}")]
    Length { body: usize, header: usize },
    /// The body's checksum differs from the header's.
    #[error("checksum mismatch (damaged)")]
    Checksum,
}

/// `body` under the envelope `magic`/`version`.
pub fn seal(magic: &str, version: u32, body: &[u8]) -> Vec<u8> {
    let mut out = format!("{magic} v{version} {} {}\n", body.len(), blake3::hash(body).to_hex()).into_bytes();
    out.extend_from_slice(body);
    out
}

/// The body of `bytes`, checked against `magic` and `version`; see the module doc.
pub fn open<'a>(bytes: &'a [u8], magic: &str, version: u32) -> Result<&'a [u8], EnvelopeError> {
    let nl = bytes.iter().take(MAX_HEADER).position(|&b| b == b'\n').ok_or(EnvelopeError::NoHeader)?;
    let header = std::str::from_utf8(&bytes[..nl]).map_err(|_| EnvelopeError::NoHeader)?;
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
        return Err(EnvelopeError::Length { body: body.len(), header: len });
    }
    if blake3::hash(body).to_hex().as_str() != fields[3] {
        return Err(EnvelopeError::Checksum);
    }
    Ok(body)
}

/// Writes `body` sealed under `magic`/`version` to `path`, atomically (see the module doc).
pub fn write_sealed(path: &Path, magic: &str, version: u32, body: &[u8]) -> std::io::Result<()> {
    write_sealed_parts(path, magic, version, &[body])
}

/// [`write_sealed`] of the body that is `parts` one after another, without building it (a
/// large record kept in parts is written with no copy of it in RAM): the file is byte for byte
/// what `write_sealed` of their concatenation writes.
pub fn write_sealed_parts(path: &Path, magic: &str, version: u32, parts: &[&[u8]]) -> std::io::Result<()> {
    write_sealed_with(path, magic, version, |out| parts.iter().try_for_each(|p| out(p)))
}

/// [`write_sealed`] of the body that `body` emits piece by piece (it calls its argument with
/// each piece, in order), never held whole in RAM: `body` runs twice, once for the header's
/// length and checksum and once to write, and must emit the same bytes both times. Where the
/// second run's bytes differ from the first's, nothing is written (`InvalidData`) and the file
/// at `path` is left as it was. The file is byte for byte what `write_sealed` of the
/// concatenated pieces writes.
pub fn write_sealed_with(
    path: &Path,
    magic: &str,
    version: u32,
    body: impl Fn(&mut dyn FnMut(&[u8]) -> std::io::Result<()>) -> std::io::Result<()>,
) -> std::io::Result<()> {
    let sum = |write: &mut dyn FnMut(&[u8]) -> std::io::Result<()>| {
        let (mut hash, mut len) = (blake3::Hasher::new(), 0usize);
        body(&mut |p| {
            hash.update(p);
            len += p.len();
            write(p)
        })?;
        Ok::<_, std::io::Error>((len, hash.finalize()))
    };
    let (len, hash) = sum(&mut |_| Ok(()))?;
    let header = format!("{magic} v{version} {len} {}\n", hash.to_hex());
    crate::persist::atomic_write(path, |w| {
        std::io::Write::write_all(w, header.as_bytes())?;
        let written = sum(&mut |p| std::io::Write::write_all(w, p))?;
        if written != (len, hash) {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "the body changed between its checksum and its write"));
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_written_in_parts_is_the_file_of_its_concatenation() {
        let dir = tempfile::tempdir().unwrap();
        let (whole, parts) = (dir.path().join("whole"), dir.path().join("parts"));
        write_sealed(&whole, "engram-test", 3, b"head bytes|tail bytes").unwrap();
        write_sealed_parts(&parts, "engram-test", 3, &[b"head bytes|", b"", b"tail bytes"]).unwrap();
        let (a, b) = (std::fs::read(&whole).unwrap(), std::fs::read(&parts).unwrap());
        assert_eq!(a, b);
        assert_eq!(open(&b, "engram-test", 3).unwrap(), b"head bytes|tail bytes");
    }

    #[test]
    fn a_body_emitted_in_pieces_is_the_file_of_their_concatenation_and_a_changing_one_is_not_written() {
        let dir = tempfile::tempdir().unwrap();
        let (whole, pieces) = (dir.path().join("whole"), dir.path().join("pieces"));
        write_sealed(&whole, "engram-test", 3, b"head bytes|tail bytes").unwrap();
        write_sealed_with(&pieces, "engram-test", 3, |out| {
            out(b"head ")?;
            out(b"")?;
            out(b"bytes|tail bytes")
        })
        .unwrap();
        assert_eq!(std::fs::read(&whole).unwrap(), std::fs::read(&pieces).unwrap());
        // A body that emits other bytes on its second run: an error, the old file kept, no
        // temporary file left.
        let runs = std::sync::atomic::AtomicUsize::new(0);
        let e = write_sealed_with(&pieces, "engram-test", 3, |out| {
            let n = runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            out(if n == 0 { b"first" } else { b"other" })
        })
        .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        assert_eq!(runs.into_inner(), 2);
        assert_eq!(std::fs::read(&whole).unwrap(), std::fs::read(&pieces).unwrap());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }

    #[test]
    fn a_sealed_body_opens_and_every_kind_of_damage_is_named() {
        let good = seal("engram-test", 1, b"{\"a\": 1}");
        assert_eq!(open(&good, "engram-test", 1).unwrap(), b"{\"a\": 1}");
        assert_eq!(open(b"", "engram-test", 1), Err(EnvelopeError::NoHeader));
        assert_eq!(open(&[b'x'; 300], "engram-test", 1), Err(EnvelopeError::NoHeader));
        assert!(matches!(open(&good, "engram-other", 1), Err(EnvelopeError::Foreign { .. })));
        assert!(matches!(open(&good, "engram-test", 2), Err(EnvelopeError::Version { .. })));
        assert!(matches!(open(&good[..good.len() - 1], "engram-test", 1), Err(EnvelopeError::Length { .. })));
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 0x20;
        assert_eq!(open(&flipped, "engram-test", 1), Err(EnvelopeError::Checksum));
        let mut bad_len = String::from_utf8(good.clone()).unwrap();
        bad_len = bad_len.replacen(" 8 ", " x ", 1);
        assert_eq!(open(bad_len.as_bytes(), "engram-test", 1), Err(EnvelopeError::BadLength));
    }

    #[test]
    fn a_sealed_write_reads_back_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        write_sealed(&path, "engram-test", 3, b"body").unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes, seal("engram-test", 3, b"body"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
