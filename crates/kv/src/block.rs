//! One block: `BLOCK_TOKENS` tokens of keys and values for every layer.
//!
//! Byte layout (identical in RAM and in persisted files, so a restored file
//! is used where it lies): for each layer, the keys section then the values
//! section; each section is `[num_kv_heads][BLOCK_TOKENS]` rows of
//! `elem.row_bytes(head_dim)` bytes.
//!
//! NOTE: 32 tokens per block. It is the finest prefix granularity of the prefix-caching design, so
//! prefix sharing loses at most 31 tokens; one head's 32 f16 keys of dim 64
//! are 4 KiB, which stays in L1 while a step's queries read them; and a
//! partial last block wastes under 32 tokens per sequence.

use std::sync::{Arc, OnceLock};

use memmap2::Mmap;

use crate::pool::KvPool;
use crate::sliding::SlidingLayers;

/// Tokens per block.
pub const BLOCK_TOKENS: usize = 32;

/// One cache line; [`LineBytes`] are made of these.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Heap bytes that start on a 64-byte boundary, so every head's rows in a block start on a
/// cache line (a head's 32 rows are whole lines in every format) and the attention kernels'
/// 64-byte loads never straddle two lines. A plain `Vec<u8>` of a block's size comes from
/// `malloc` 16 bytes past a line, which split every such load; on the Sapphire Rapids
/// machines here that cost nothing measurable (`attend_speed`, before and after), other CPUs
/// charge more for split loads.
#[derive(Clone)]
pub(crate) struct LineBytes {
    lines: Vec<Line>,
    len: usize,
}

impl std::ops::Deref for LineBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl std::ops::DerefMut for LineBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl LineBytes {
    /// `len` zero bytes.
    pub(crate) fn zeroed(len: usize) -> LineBytes {
        LineBytes { lines: vec![bytemuck::Zeroable::zeroed(); len.div_ceil(64)], len }
    }
    /// A copy of `bytes`.
    pub(crate) fn copy_of(bytes: &[u8]) -> LineBytes {
        let mut b = LineBytes::zeroed(bytes.len());
        b.as_mut_slice().copy_from_slice(bytes);
        b
    }
    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.lines)[..self.len]
    }
    /// The bytes, writable.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.lines)[..self.len]
    }
}

/// Where a block's bytes live.
pub(crate) enum Storage {
    /// Heap memory (line-aligned), writable while the block is not shared.
    Owned(LineBytes),
    /// A read-only range of a mapped cache file (restored from disk), read from the mapping
    /// only until `copy` holds the same bytes in RAM: the entry's checksum thread makes that
    /// copy once the sum is checked (`persist.rs`), so a file truncated afterwards under the
    /// process can no longer fault (SIGBUS) a read of this block.
    Mapped { map: Arc<Mmap>, offset: usize, copy: Arc<OnceLock<LineBytes>> },
}

/// A block of cached keys and values. Its bytes are charged to its pool from
/// creation until drop; copy-on-write copies are charged before they are made.
pub struct Block {
    pub(crate) storage: Storage,
    /// Tokens filled, `0..=BLOCK_TOKENS`.
    pub(crate) len: usize,
    pub(crate) pool: KvPool,
    /// `Some`: the sliding layers' sections were released (`sliding.rs`); the bytes hold the
    /// global layers' sections only, in layer order, and that is all that is charged.
    pub(crate) released: Option<SlidingLayers>,
}

impl Block {
    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when no token is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// True when the bytes are a mapped file region (read-only).
    pub fn is_mapped(&self) -> bool {
        matches!(self.storage, Storage::Mapped { .. })
    }
    /// True when the bytes are read from RAM: an owned block, or a mapped one whose private
    /// copy is made (after that, nothing done to the file can fault a read of it).
    pub fn is_in_ram(&self) -> bool {
        match &self.storage {
            Storage::Owned(_) => true,
            Storage::Mapped { copy, .. } => copy.get().is_some(),
        }
    }
    /// The block's bytes in the layout described in the module doc (the global layers'
    /// sections only, for a released block: [`Block::released`]).
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Owned(v) => v.as_slice(),
            Storage::Mapped { map, offset, copy } => match copy.get() {
                Some(c) => c.as_slice(),
                None => &map[*offset..*offset + self.pool.block_bytes()],
            },
        }
    }
    /// The sliding layers whose sections this block no longer holds (`None`: it holds every layer).
    pub fn released(&self) -> Option<&SlidingLayers> {
        self.released.as_ref()
    }
    /// Bytes this block holds and is charged for.
    pub fn held_bytes(&self) -> usize {
        match &self.storage {
            Storage::Owned(v) => v.len,
            Storage::Mapped { .. } => self.pool.block_bytes(),
        }
    }
    /// Where `layer`'s keys section starts in [`Block::bytes`] (its values section follows),
    /// for sections of `sec` bytes; `None` for a layer this block released.
    pub fn layer_offset(&self, layer: usize, sec: usize) -> Option<usize> {
        match &self.released {
            None => Some(2 * layer * sec),
            Some(g) => g.held_index(layer).map(|i| 2 * i * sec),
        }
    }
    /// `layer`'s keys and values sections (`sec` bytes each), or `None` where released.
    pub(crate) fn layer_sections(&self, layer: usize, sec: usize) -> Option<(&[u8], &[u8])> {
        let at = self.layer_offset(layer, sec)?;
        let b = self.bytes();
        Some((&b[at..at + sec], &b[at + sec..at + 2 * sec]))
    }
    /// A mapped block's private-copy slot and its offset in the map (`None` for owned blocks).
    pub(crate) fn copy_slot(&self) -> Option<(Arc<OnceLock<LineBytes>>, usize)> {
        match &self.storage {
            Storage::Owned(_) => None,
            Storage::Mapped { copy, offset, .. } => Some((copy.clone(), *offset)),
        }
    }
    /// Writable bytes, or `None` for a mapped block.
    pub(crate) fn bytes_mut(&mut self) -> Option<&mut [u8]> {
        match &mut self.storage {
            Storage::Owned(v) => Some(v.as_mut_slice()),
            Storage::Mapped { .. } => None,
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.pool.release(self.held_bytes());
    }
}
