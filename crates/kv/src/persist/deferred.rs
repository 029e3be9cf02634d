//! Entries opened now and checked later, many on one thread (a thread's ring of turn files,
//! restored when the thread comes back after a restart): [`open_entry_unchecked`] does every
//! check but the checksum and hands back an [`UncheckedEntry`]; [`check_in_background`] sums a
//! batch of them, in order, on one background thread while the caller computes on their mapped
//! blocks.
//!
//! Invariant: as with [`super::open_entry`], until the [`ChecksumCheck`] returns `Ok` the KV
//! may hold any bytes; nothing computed from it may be shown, kept or shared before then. A
//! checked entry's blocks read a private copy, never the file.

use std::path::{Path, PathBuf};

use super::{open, read_ahead_layer_major, ChecksumCheck, EntryMeta, PendingSum, PersistError};
use crate::{KvPool, SeqKv};

/// An opened entry whose checksum is still to be computed (see the module doc).
#[must_use = "an unchecked entry's KV may hold any bytes until it is checked"]
pub struct UncheckedEntry {
    sum: PendingSum,
    num_blocks: usize,
    layer_bytes: usize,
}

impl UncheckedEntry {
    /// The entry's path.
    pub fn path(&self) -> &Path {
        &self.sum.path
    }

    /// Reads the entry layer by layer (the order a forward pass reads it), checks the sum, then
    /// copies every block into RAM. `Err` ([`PersistError::is_corrupt`]): not the bytes written.
    pub fn check(self) -> Result<(), PersistError> {
        let (block_bytes, data_offset) = (self.sum.block_bytes, self.sum.data_offset);
        read_ahead_layer_major(&self.sum.map, data_offset, self.num_blocks, block_bytes, self.layer_bytes);
        self.sum.check()
    }
}

/// [`super::open_entry`] without starting the checksum: every other check has passed; the
/// caller checks the returned entry (now, or with others in [`check_in_background`]).
pub fn open_entry_unchecked(
    path: &Path,
    pool: &KvPool,
    expect_fingerprint: &str,
    vocab_size: usize,
) -> Result<(EntryMeta, SeqKv, UncheckedEntry), PersistError> {
    let (meta, kv, sum) = open(path, pool, expect_fingerprint, vocab_size)?;
    let (num_blocks, layer_bytes) = (kv.blocks().len(), 2 * pool.section_bytes());
    Ok((meta, kv, UncheckedEntry { sum, num_blocks, layer_bytes }))
}

/// Checks `entries` in order on one background thread; the returned check fails with the
/// first entry that fails (the rest are not read). `what` names the batch in errors about the
/// thread itself. Errors: the thread could not be started.
pub fn check_in_background(what: impl Into<PathBuf>, entries: Vec<UncheckedEntry>) -> Result<ChecksumCheck, PersistError> {
    let path = what.into();
    let handle = std::thread::Builder::new()
        .name("engram-kv-checksum".into())
        .spawn(move || entries.into_iter().try_for_each(UncheckedEntry::check))
        .map_err(|e| PersistError::io(&path, e))?;
    Ok(ChecksumCheck { path, handle })
}
