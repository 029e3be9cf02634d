//! Where a ring turn's KV lives: in RAM, or — a turn masked out of attention, with
//! `DualStream::with_masked_turns` — in a file, its RAM blocks returned to the pool.
//!
//! ```text
//!  Ram { kv, writing: None }  ──masked──▶  Ram { kv, writing: Some(w) }  ──written──▶  Disk(d)
//!        ▲                                   (wanted again: writing dropped,                │
//!        └────────── restored: the file read back, positions placed, moves replayed ────────┘
//! ```
//! A turn keeps its positions while on disk; when the ring moves it (an eviction before it, a
//! new persistent stream), the move is recorded, not applied, and replayed on the KV read back,
//! in order, with the same `SeqKv::move_slots` the RAM turn would have gone through.
//!
//! Invariant: a turn restored from its file holds, bit for bit, the KV the same turn kept in RAM
//! would hold: the file's bytes are what was written (every entry check, checksum included,
//! passed), placed at the positions it was written at, then moved through exactly the moves the
//! ring made meanwhile (those made while the write was in flight included)
//! (`crates/dual/tests/it/masked_disk.rs`, `crates/dual/tests/dual_fuzz.rs`).

use std::path::PathBuf;
use std::sync::mpsc::Sender;
use std::sync::Arc;

use engram_kv::{KvError, SeqKv};
use engram_model::rope::LayerRopes;

/// A turn's file on disk; deleted when the last handle goes (the turn restored, evicted or
/// forgotten), so no file outlives the turn that owns it in this process. Its name is then sent
/// on `gone`, so the disk budget stops charging it wherever the handle was dropped.
#[derive(Debug)]
pub(crate) struct MaskedFile {
    pub(crate) path: PathBuf,
    /// Its size in bytes.
    pub(crate) bytes: u64,
    /// The owner its entry names (`owner/thread`), checked when it is read back.
    pub(crate) owner: String,
    /// Where its file name goes once the file is deleted (`MaskedStore::take_gone`).
    pub(crate) gone: Option<Sender<String>>,
}

impl MaskedFile {
    /// The file's name in its directory (its disk ledger's key).
    pub(crate) fn name(&self) -> String {
        self.path.file_name().map_or_else(String::new, |n| n.to_string_lossy().to_string())
    }
}

impl Drop for MaskedFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        if let Some(gone) = &self.gone {
            // The store may be gone first (the policy dropped): nothing left to uncharge.
            let _ = gone.send(self.name());
        }
    }
}

/// A write of a RAM turn's KV in flight: its ticket, the first position it was written at, and
/// the moves the ring made since (each the new first position), to replay on the file's KV.
pub(crate) struct Writing {
    pub(crate) ticket: u64,
    pub(crate) written_first: usize,
    pub(crate) moves: Vec<usize>,
}

/// A turn's KV in its file: where it was written, the moves since, its length in tokens, and
/// how the file is read back.
pub(crate) struct OnDisk {
    pub(crate) file: Arc<MaskedFile>,
    pub(crate) written_first: usize,
    pub(crate) moves: Vec<usize>,
    pub(crate) len: usize,
    pub(crate) reader: crate::ring::TurnReader,
}

impl OnDisk {
    /// The turn's first position now (after the recorded moves).
    pub(crate) fn first(&self) -> usize {
        self.moves.last().copied().unwrap_or(self.written_first)
    }
}

/// A ring turn's KV: in RAM (maybe being written), or on disk.
pub(crate) enum TurnKv {
    Ram { kv: SeqKv, writing: Option<Writing> },
    Disk(OnDisk),
}

impl TurnKv {
    /// A turn's KV in RAM, no write in flight.
    pub(crate) fn ram(kv: SeqKv) -> TurnKv {
        TurnKv::Ram { kv, writing: None }
    }

    /// The KV in RAM, if it is.
    pub(crate) fn resident(&self) -> Option<&SeqKv> {
        match self {
            TurnKv::Ram { kv, .. } => Some(kv),
            TurnKv::Disk(_) => None,
        }
    }

    /// The position of the turn's first token.
    pub(crate) fn first_position(&self) -> usize {
        match self {
            TurnKv::Ram { kv, .. } => kv.position(0),
            TurnKv::Disk(d) => d.first(),
        }
    }

    /// Moves the turn's tokens to positions `at..`: the RAM KV re-rotated (and the move recorded
    /// for a write in flight), or, on disk, the move recorded for the restore.
    pub(crate) fn move_to(&mut self, at: usize, rope: &(dyn LayerRopes + Send + Sync)) -> Result<(), KvError> {
        match self {
            TurnKv::Ram { kv, writing } => {
                kv.move_slots(0..kv.len(), at, rope)?;
                if let Some(w) = writing {
                    w.moves.push(at);
                }
            }
            TurnKv::Disk(d) => d.moves.push(at),
        }
        Ok(())
    }

    /// Rebuilds the RAM KV from `read` (the file's KV at its slot positions, every check passed):
    /// placed at the positions it was written at, then moved through the recorded moves.
    pub(crate) fn restore(d: &OnDisk, mut kv: SeqKv, rope: &(dyn LayerRopes + Send + Sync)) -> Result<SeqKv, String> {
        if kv.len() != d.len {
            return Err(format!("{}: holds {} tokens, the turn has {}", d.file.path.display(), kv.len(), d.len));
        }
        let positions: Vec<u32> = (d.written_first..d.written_first + kv.len()).map(|p| p as u32).collect();
        engram_model::KvCache::place(&mut kv, 0, &positions)?;
        for &at in &d.moves {
            kv.move_slots(0..kv.len(), at, rope).map_err(|e| format!("moving the restored turn: {e}"))?;
        }
        Ok(kv)
    }

    /// The file a turn on disk is in.
    pub(crate) fn file(&self) -> Option<&MaskedFile> {
        match self {
            TurnKv::Disk(d) => Some(&d.file),
            TurnKv::Ram { .. } => None,
        }
    }
}
