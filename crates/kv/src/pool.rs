//! `KvPool`: the RAM budget every block is charged to.
//!
//! Invariant: `used() <= budget()` at all times; `try_charge` is the only way
//! bytes are added and it refuses rather than exceed the budget.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use half::f16;

use crate::block::{Block, Data, BLOCK_TOKENS};
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
    budget: usize,
    used: AtomicUsize,
}

/// A shared handle to one budget (cheap to clone).
#[derive(Clone)]
pub struct KvPool(Arc<Inner>);

impl KvPool {
    /// A pool for `layout` in `format` that never holds more than `budget_bytes`.
    pub fn new(layout: KvLayout, format: KvFormat, budget_bytes: usize) -> KvPool {
        KvPool(Arc::new(Inner { layout, format, budget: budget_bytes, used: AtomicUsize::new(0) }))
    }
    /// The cache shape.
    pub fn layout(&self) -> KvLayout {
        self.0.layout
    }
    /// The storage format.
    pub fn format(&self) -> KvFormat {
        self.0.format
    }
    /// The hard budget in bytes.
    pub fn budget(&self) -> usize {
        self.0.budget
    }
    /// Bytes held by live blocks.
    pub fn used(&self) -> usize {
        self.0.used.load(Ordering::Acquire)
    }
    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        Block::bytes_for(&self.0.layout, self.0.format)
    }
    /// Bytes per cached token (block bytes / tokens per block).
    pub fn bytes_per_token(&self) -> usize {
        self.block_bytes() / BLOCK_TOKENS
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
    pub(crate) fn charged_empty_block(&self) -> Block {
        let elems = 2 * self.0.layout.num_layers * Block::layer_elems(&self.0.layout);
        Block {
            data: match self.0.format {
                KvFormat::F32 => Data::F32(vec![0.0; elems]),
                KvFormat::F16 => Data::F16(vec![f16::ZERO; elems]),
            },
            len: 0,
            pool: self.clone(),
        }
    }
}
