//! One block: `BLOCK_TOKENS` tokens of keys and values for every layer.
//!
//! NOTE: 32 tokens per block. It is seed 001's finest prefix granularity, so
//! prefix sharing loses at most 31 tokens; one head's 32 f16 keys of dim 64
//! are 4 KiB, which stays in L1 while a step's queries read them; and a
//! partial last block wastes under 32 tokens per sequence. Larger blocks
//! would cut per-chunk overhead in attention, which measures negligible.

use half::f16;

use crate::format::KvFormat;
use crate::pool::{KvLayout, KvPool};

/// Tokens per block.
pub const BLOCK_TOKENS: usize = 32;

/// Element storage of a block.
#[derive(Clone)]
pub(crate) enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

/// A block of cached keys and values. Its bytes are charged to the pool from
/// creation until drop; copy-on-write copies are charged before they are made.
pub struct Block {
    pub(crate) data: Data,
    /// Tokens filled, `0..=BLOCK_TOKENS`.
    pub(crate) len: usize,
    pub(crate) pool: KvPool,
}

impl Block {
    /// Elements per layer per kind (keys or values).
    pub(crate) fn layer_elems(layout: &KvLayout) -> usize {
        layout.num_kv_heads * BLOCK_TOKENS * layout.head_dim
    }

    /// Bytes one block occupies in `format`.
    pub fn bytes_for(layout: &KvLayout, format: KvFormat) -> usize {
        2 * layout.num_layers * Self::layer_elems(layout) * format.elem_bytes()
    }

    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when no token is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.pool.release(Block::bytes_for(&self.pool.layout(), self.pool.format()));
    }
}
