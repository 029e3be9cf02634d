//! A user's persistent stream as an immutable entry file: its KV written in
//! `engram-kv`'s entry format (checksummed, fingerprinted, `kind` `prefix`, `owner` the user),
//! then read back with every check passed, so the stream every thread of the user forks (one
//! copy, charged once) is what the file holds; after a restart the stream is restored from the
//! file instead of prefilled again. The blocks read back are copied into RAM once the checksum
//! passes (as a session's are), so a file truncated or swapped under the server afterwards
//! cannot fault a read of them (SIGBUS).
//!
//! ```text
//!  <dir>/stream-<blake3(owner), 32 hex>.safetensors
//!    tokens: the stream's tokens, masked segments included      (EntryMeta::tokens)
//!    text:   its layout, JSON [{"segment","id","tokens","masked"}, ...]   (EntryMeta::text)
//!    kv:     the blocks as they lie in RAM
//! ```
//! Invariant: a restored stream holds the file's KV only as far as it is the KV this stream
//! would compute — the longest prefix whose tokens agree with the stream's and below which the
//! same slots are masked in both (the KV of a token depends on the tokens before it and on
//! which of them it attended); the rest is left to [`PersistentStream::prefill`]. A file that
//! fails any check (checksum, truncation, another model or KV format, another user's, a
//! layout that does not add up) is refused whole: nothing of it is used.

use std::path::{Path, PathBuf};

use engram_kv::{read_entry, write_entry, EntryKind, EntryMeta, KvPool, PersistError, SeqKv};
use serde::{Deserialize, Serialize};

use super::{PersistentStream, SegmentId};

/// One segment of the layout a stream file records.
#[derive(Serialize, Deserialize, PartialEq, Debug)]
struct SegmentRecord {
    /// `base`, `fact` or `summary`.
    segment: String,
    id: u64,
    tokens: usize,
    masked: bool,
}

/// Why a stream file was not used (it is then prefilled as if there were none).
#[derive(Debug, thiserror::Error)]
pub enum StreamFileError {
    /// The entry itself failed a check (damaged, truncated, another model or format).
    #[error(transparent)]
    Entry(#[from] PersistError),
    /// A sound entry that is not this user's stream file.
    #[error("{}: {reason}", path.display())]
    Foreign { path: PathBuf, reason: String },
}

impl StreamFileError {
    /// True when the file is damaged and should be deleted (not merely someone else's).
    pub fn is_corrupt(&self) -> bool {
        matches!(self, StreamFileError::Entry(e) if e.is_corrupt())
    }
}

/// The file name of `owner`'s persistent stream in a policy's directory.
pub fn stream_file_name(owner: &str) -> String {
    let hash = blake3::hash(owner.as_bytes()).to_hex();
    format!("stream-{}.safetensors", &hash[..32])
}

fn segment_name(id: SegmentId) -> (&'static str, u64) {
    match id {
        SegmentId::Base => ("base", 0),
        SegmentId::Fact(n) => ("fact", n),
        SegmentId::Summary(n) => ("summary", n),
    }
}

/// A stream's file contents taken on the engine thread, written elsewhere
/// ([`PersistentStream::snapshot`]).
pub struct StreamSnapshot {
    /// The entry's metadata (tokens and layout included).
    pub meta: EntryMeta,
    /// A fork of the stream's KV holding exactly `meta.tokens`.
    kv: SeqKv,
    fingerprint: String,
    /// The stream's generation when taken.
    pub generation: u64,
}

impl StreamSnapshot {
    /// Writes the entry to `path` atomically (temp file, fsync, rename, directory fsync: a crash
    /// leaves the old file or none, never a torn one under the name) and reads it back, every
    /// check passed (checksum included). Returns the bytes written and the KV read back.
    pub fn write_and_read_back(self, path: &Path, pool: &KvPool, vocab: usize) -> Result<(u64, SeqKv), StreamFileError> {
        let bytes = write_entry(path, &self.meta, &self.kv)?;
        drop(self.kv);
        let (back, mapped) = read_entry(path, pool, &self.fingerprint, vocab)?;
        if back.tokens != self.meta.tokens || mapped.len() != self.meta.tokens.len() {
            return Err(StreamFileError::Foreign { path: path.to_path_buf(), reason: "the file read back holds other tokens".into() });
        }
        Ok((bytes, mapped))
    }
}

impl PersistentStream {
    /// The layout a file records for this stream.
    fn layout(&self) -> Vec<SegmentRecord> {
        self.segments
            .iter()
            .map(|s| {
                let (segment, id) = segment_name(s.id);
                SegmentRecord { segment: segment.into(), id, tokens: s.tokens.len(), masked: s.masked }
            })
            .collect()
    }

    /// Writes the stream's KV to `path` (atomically: temp file, fsync, rename) and replaces the
    /// KV by the blocks read back from it — the same bytes, checked, one copy that every fork
    /// shares. Returns the bytes written. Errors (the KV kept as it was): no
    /// KV yet, the file system, or a file that does not read back as written.
    pub fn save_and_read_back(
        &mut self,
        path: &Path,
        pool: &KvPool,
        fingerprint: &str,
        owner: &str,
        vocab: usize,
    ) -> Result<u64, StreamFileError> {
        let snapshot = self
            .snapshot(fingerprint, owner)
            .ok_or_else(|| StreamFileError::Foreign { path: path.to_path_buf(), reason: "the stream is not prefilled".into() })?;
        let (bytes, mapped) = snapshot.write_and_read_back(path, pool, vocab)?;
        self.kv = Some(mapped);
        Ok(bytes)
    }

    /// What the stream's file would hold now (its entry metadata and a fork of its KV: blocks
    /// shared, not copied), to write off the caller's thread ([`StreamSnapshot::write_and_read_back`]);
    /// `None` before the stream is prefilled.
    pub fn snapshot(&self, fingerprint: &str, owner: &str) -> Option<StreamSnapshot> {
        let kv = self.kv()?;
        let meta = EntryMeta {
            fingerprint: fingerprint.to_string(),
            kind: EntryKind::Prefix,
            owner: owner.to_string(),
            tokens: self.tokens(),
            text: serde_json::to_string(&self.layout()).expect("records serialize"),
            offsets: Vec::new(),
            created_unix: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        };
        Some(StreamSnapshot { meta, kv: kv.fork(kv.len()), fingerprint: fingerprint.to_string(), generation: self.generation })
    }

    /// Replaces the KV by `mapped`, the blocks read back by [`StreamSnapshot::write_and_read_back`], if the stream is
    /// still the one the snapshot was taken of: the same generation, tokens and layout, fully
    /// prefilled. Returns whether it did (else `mapped` is dropped and nothing changes).
    pub fn adopt_read_back(&mut self, generation: u64, tokens: &[u32], mapped: SeqKv) -> bool {
        let same = generation == self.generation && self.kv().is_some() && mapped.len() == self.len() && tokens == self.tokens();
        if same {
            self.kv = Some(mapped);
        }
        same
    }

    /// Takes the KV from `owner`'s stream file at `path` when this stream holds none yet (a
    /// restart): as far as the file's tokens and masked slots agree with the stream's (see the
    /// module doc), read back, the rest left to [`PersistentStream::prefill`]. Returns the tokens
    /// taken (`None`: no file, or a KV already held). Errors: the file refused whole (damaged,
    /// truncated, another model, format or user, a bad layout); nothing of it is used.
    pub fn restore_from(
        &mut self,
        path: &Path,
        pool: &KvPool,
        fingerprint: &str,
        owner: &str,
        vocab: usize,
    ) -> Result<Option<usize>, StreamFileError> {
        if self.kv.as_ref().is_some_and(|kv| !kv.is_empty()) || !path.exists() {
            return Ok(None);
        }
        let foreign = |reason: String| StreamFileError::Foreign { path: path.to_path_buf(), reason };
        let (meta, mut kv) = read_entry(path, pool, fingerprint, vocab)?;
        if meta.kind != EntryKind::Prefix || meta.owner != owner {
            return Err(foreign(format!("a {} entry of owner {:?}, not this user's stream", meta.kind, meta.owner)));
        }
        let layout: Vec<SegmentRecord> =
            serde_json::from_str(&meta.text).map_err(|e| foreign(format!("the stream layout does not parse: {e}")))?;
        if layout.iter().map(|s| s.tokens).sum::<usize>() != meta.tokens.len() {
            return Err(foreign("the stream layout does not add up to the file's tokens".into()));
        }
        let file_masked: Vec<bool> = layout.iter().flat_map(|s| std::iter::repeat(s.masked).take(s.tokens)).collect();
        let mine = self.tokens();
        let my_masked: Vec<bool> = self.segments.iter().flat_map(|s| std::iter::repeat(s.masked).take(s.tokens.len())).collect();
        // Slot i's KV is this stream's if the tokens up to it agree and the slots before it are
        // masked alike.
        let mut n = 0;
        while n < mine.len() && n < meta.tokens.len() && mine[n] == meta.tokens[n] && (n == 0 || file_masked[n - 1] == my_masked[n - 1]) {
            n += 1;
        }
        kv.truncate(n);
        self.kv = (n > 0).then_some(kv);
        Ok(Some(n))
    }
}
