//! `KvPool`: the RAM budget every block is charged to.
//!
//! Invariant: `used() <= budget()` at all times; `try_charge` is the only way
//! bytes are added and it refuses rather than exceed the budget. Mapped
//! blocks are charged too: their pages are resident once attention reads them.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use engram_model::KvElem;
use memmap2::Mmap;

use crate::block::{Block, Storage, BLOCK_TOKENS};
use crate::error::KvError;
use crate::format::KvFormat;

/// The cache shape of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvLayout {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

impl KvLayout {
    /// The layout of `config`'s caches.
    pub fn of(config: &engram_model::ModelConfig) -> KvLayout {
        KvLayout { num_layers: config.num_layers, num_kv_heads: config.num_kv_heads, head_dim: config.head_dim }
    }
}

struct Inner {
    layout: KvLayout,
    format: KvFormat,
    elem: KvElem,
    budget: usize,
    used: AtomicUsize,
}

/// A shared handle to one budget (cheap to clone).
#[derive(Clone)]
pub struct KvPool(Arc<Inner>);

impl KvPool {
    /// A pool for `layout` in `format` that never holds more than `budget_bytes`.
    ///
    /// Panics if the format cannot hold the heads (odd head_dim with q4); use
    /// [`KvPool::try_new`] to get an error instead.
    pub fn new(layout: KvLayout, format: KvFormat, budget_bytes: usize) -> KvPool {
        Self::try_new(layout, format, budget_bytes).expect("KV format fits the model")
    }

    /// Like [`KvPool::new`], with an error for shapes the format cannot store.
    pub fn try_new(layout: KvLayout, format: KvFormat, budget_bytes: usize) -> Result<KvPool, KvError> {
        if layout.head_dim % 2 != 0 {
            return Err(KvError::UnsupportedShape { format: format.name(), head_dim: layout.head_dim });
        }
        let elem = format.elem(layout.head_dim);
        Ok(KvPool(Arc::new(Inner { layout, format, elem, budget: budget_bytes, used: AtomicUsize::new(0) })))
    }

    /// Whether `other` is this pool (a clone of the same handle), not merely one alike.
    pub fn same_as(&self, other: &KvPool) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
    /// The cache shape.
    pub fn layout(&self) -> KvLayout {
        self.0.layout
    }
    /// The storage format.
    pub fn format(&self) -> KvFormat {
        self.0.format
    }
    /// The row encoding attention reads.
    pub fn elem(&self) -> KvElem {
        self.0.elem
    }
    /// The hard budget in bytes.
    pub fn budget(&self) -> usize {
        self.0.budget
    }
    /// Bytes held by live blocks.
    pub fn used(&self) -> usize {
        self.0.used.load(Ordering::Acquire)
    }
    /// Bytes of one keys-or-values section of one layer in a block.
    pub fn section_bytes(&self) -> usize {
        self.0.layout.num_kv_heads * BLOCK_TOKENS * self.0.elem.row_bytes(self.0.layout.head_dim)
    }
    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        2 * self.0.layout.num_layers * self.section_bytes()
    }
    /// True when sequences keep an f16 recent window beside their partial last block
    /// (the quantized formats; see `recent_window.rs`).
    pub fn has_window(&self) -> bool {
        !self.0.format.is_exact()
    }
    /// Bytes of one keys-or-values section of one layer in a recent-window copy (f16 rows).
    pub(crate) fn window_section_bytes(&self) -> usize {
        self.0.layout.num_kv_heads * BLOCK_TOKENS * KvElem::F16.row_bytes(self.0.layout.head_dim)
    }
    /// Bytes of one recent-window copy (charged per sequence that has one).
    pub fn window_bytes(&self) -> usize {
        2 * self.0.layout.num_layers * self.window_section_bytes()
    }
    /// Bytes per cached token (block bytes / tokens per block).
    pub fn bytes_per_token(&self) -> usize {
        self.block_bytes() / BLOCK_TOKENS
    }

    /// Bytes a fresh sequence of `tokens` tokens takes from this pool when it keeps every layer
    /// of every token: its whole blocks, plus the recent window a quantized format keeps
    /// beside them (at most one per sequence). Invariant: `SeqKv::reserve(tokens)` on an empty
    /// sequence charges no more than this. A sequence that releases its sliding layers holds
    /// less: [`crate::SlidingLayers::bytes_held`], [`crate::SeqKv::bytes_held_at`].
    pub fn bytes_for(&self, tokens: usize) -> usize {
        let window = if self.has_window() && tokens > 0 { self.window_bytes() } else { 0 };
        tokens.div_ceil(BLOCK_TOKENS) * self.block_bytes() + window
    }

    /// A released block (`sliding.rs`): `bytes` are the global layers' sections of `g`,
    /// already charged by the caller.
    pub(crate) fn charged_released_block(&self, bytes: crate::block::LineBytes, len: usize, g: &crate::SlidingLayers) -> Block {
        debug_assert_eq!(bytes.as_slice().len(), g.released_block_bytes(self));
        Block { storage: Storage::Owned(bytes), len, pool: self.clone(), released: Some(g.clone()) }
    }

    /// Charges `bytes` or refuses without charging anything.
    pub(crate) fn try_charge(&self, bytes: usize) -> Result<(), KvError> {
        let budget = self.0.budget;
        self.0
            .used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| u.checked_add(bytes).filter(|&n| n <= budget))
            .map(|_| ())
            .map_err(|used| KvError::OutOfMemory { needed: bytes, used, budget })
    }

    pub(crate) fn release(&self, bytes: usize) {
        self.0.used.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// An empty block whose bytes the caller has already charged with `try_charge`.
    pub(crate) fn charged_block(&self, bytes: crate::block::LineBytes, len: usize) -> Block {
        debug_assert_eq!(bytes.as_slice().len(), self.block_bytes());
        Block { storage: Storage::Owned(bytes), len, pool: self.clone(), released: None }
    }

    /// A block holding a copy of `bytes` (one block's bytes in the block layout) with `len`
    /// tokens, charged to this pool. The caller has validated the contents.
    pub fn owned_block(&self, bytes: &[u8], len: usize) -> Result<Block, KvError> {
        if bytes.len() != self.block_bytes() || len == 0 || len > BLOCK_TOKENS {
            return Err(KvError::BadMapping(format!(
                "{} bytes with {len} tokens are not one block ({} bytes, 1..={BLOCK_TOKENS} tokens)",
                bytes.len(),
                self.block_bytes()
            )));
        }
        self.try_charge(self.block_bytes())?;
        Ok(self.charged_block(crate::block::LineBytes::copy_of(bytes), len))
    }

    /// A released block (`sliding.rs`) holding a copy of `bytes`, `g`'s global layers'
    /// sections, with `len` tokens, charged to this pool. The caller has validated the contents.
    pub fn released_block(&self, bytes: &[u8], len: usize, g: &crate::SlidingLayers) -> Result<Block, KvError> {
        if bytes.len() != g.released_block_bytes(self) || g.num_layers() != self.0.layout.num_layers || len == 0 || len > BLOCK_TOKENS {
            return Err(KvError::BadMapping(format!("{} bytes with {len} tokens are not one released block", bytes.len())));
        }
        self.try_charge(bytes.len())?;
        Ok(self.charged_released_block(crate::block::LineBytes::copy_of(bytes), len, g))
    }

    /// Wraps `block_bytes()` bytes of `map` at `offset` holding `len` tokens as a
    /// read-only block, charging it. The caller has validated the contents.
    pub fn mapped_block(&self, map: &Arc<Mmap>, offset: usize, len: usize) -> Result<Block, KvError> {
        let end = offset.checked_add(self.block_bytes()).filter(|&e| e <= map.len());
        if end.is_none() || len == 0 || len > BLOCK_TOKENS {
            return Err(KvError::BadMapping(format!(
                "block at offset {offset} with {len} tokens does not fit a {}-byte mapping",
                map.len()
            )));
        }
        self.try_charge(self.block_bytes())?;
        Ok(Block {
            storage: Storage::Mapped { map: map.clone(), offset, copy: Default::default() },
            len,
            pool: self.clone(),
            released: None,
        })
    }
}
