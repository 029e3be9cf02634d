//! `SeqKv`: one sequence's block table, implementing the model's `KvCache`.
//!
//! ```text
//!  positions: 0 ............................................ len   len+reserved
//!  blocks:    [ shared, full ][ shared, full ][ own, partial  ][ own, empty ]
//!              read-only (refcount > 1)         written in place  reserved room
//! ```
//! Invariant: tokens are stored at contiguous positions `0..len`; block `b`
//! holds positions `b*32 .. b*32 + 32`; only blocks this sequence owns alone
//! are written (a shared block is copied first, and that copy is charged).

use std::sync::Arc;

use engram_model::{KvCache, KvChunk, KvData};

use crate::block::{Block, Data, BLOCK_TOKENS};
use crate::error::KvError;
use crate::pool::KvPool;

/// A sequence's cache.
pub struct SeqKv {
    pool: KvPool,
    blocks: Vec<Arc<Block>>,
    len: usize,
}

impl SeqKv {
    /// An empty cache charged to `pool`.
    pub fn new(pool: &KvPool) -> SeqKv {
        SeqKv { pool: pool.clone(), blocks: Vec::new(), len: 0 }
    }

    /// Tokens stored.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The pool this cache is charged to.
    pub fn pool(&self) -> &KvPool {
        &self.pool
    }

    /// Makes room for `n` more tokens: allocates blocks and un-shares the
    /// partial last block if another sequence holds it. All or nothing.
    pub fn reserve(&mut self, n: usize) -> Result<(), KvError> {
        let need_blocks = (self.len + n).div_ceil(BLOCK_TOKENS);
        let new_blocks = need_blocks.saturating_sub(self.blocks.len());
        let cow = self.len % BLOCK_TOKENS != 0 && n > 0 && Arc::strong_count(&self.blocks[self.len / BLOCK_TOKENS]) > 1;
        self.pool.try_charge((new_blocks + cow as usize) * self.pool.block_bytes())?;
        if cow {
            let idx = self.len / BLOCK_TOKENS;
            let copy = Block { data: self.blocks[idx].data.clone(), len: self.blocks[idx].len, pool: self.pool.clone() };
            self.blocks[idx] = Arc::new(copy);
        }
        for _ in 0..new_blocks {
            self.blocks.push(Arc::new(self.pool.charged_empty_block()));
        }
        Ok(())
    }

    /// A new sequence sharing this one's first `num_tokens` tokens (whole
    /// blocks are shared; a partial block is shared until either side writes).
    pub fn fork(&self, num_tokens: usize) -> SeqKv {
        let n = num_tokens.min(self.len);
        SeqKv { pool: self.pool.clone(), blocks: self.blocks[..n.div_ceil(BLOCK_TOKENS)].to_vec(), len: n }
    }

    /// Forgets tokens from `num_tokens` on (blocks past it are released).
    pub fn truncate(&mut self, num_tokens: usize) {
        if num_tokens >= self.len {
            return;
        }
        self.len = num_tokens;
        // Blocks past the end are released; a partial last block keeps stale
        // tokens past `len`, which `for_each_chunk` hides and the next write overwrites.
        self.blocks.truncate(num_tokens.div_ceil(BLOCK_TOKENS));
    }

    /// Bytes of blocks this sequence references (shared blocks counted in full).
    pub fn num_bytes(&self) -> usize {
        self.blocks.len() * self.pool.block_bytes()
    }

    fn layer_slices(&self, layer: usize) -> (usize, usize) {
        let per = Block::layer_elems(&self.pool.layout());
        (layer * 2 * per, per)
    }
}

impl KvCache for SeqKv {
    fn write(&mut self, layer: usize, first_pos: usize, keys: &[f32], values: &[f32], num_tokens: usize) {
        let layout = self.pool.layout();
        let (hd, nh) = (layout.head_dim, layout.num_kv_heads);
        let (base, per) = self.layer_slices(layer);
        for t in 0..num_tokens {
            let pos = first_pos + t;
            let (bi, slot) = (pos / BLOCK_TOKENS, pos % BLOCK_TOKENS);
            let block = Arc::get_mut(&mut self.blocks[bi]).expect("SeqKv::write: block not reserved or still shared");
            let (krow, vrow) = (&keys[t * nh * hd..(t + 1) * nh * hd], &values[t * nh * hd..(t + 1) * nh * hd]);
            for h in 0..nh {
                let off = h * BLOCK_TOKENS * hd + slot * hd;
                let (ks, vs) = (&krow[h * hd..(h + 1) * hd], &vrow[h * hd..(h + 1) * hd]);
                match &mut block.data {
                    Data::F32(d) => {
                        d[base + off..base + off + hd].copy_from_slice(ks);
                        d[base + per + off..base + per + off + hd].copy_from_slice(vs);
                    }
                    Data::F16(d) => {
                        for i in 0..hd {
                            d[base + off + i] = half::f16::from_f32(ks[i]);
                            d[base + per + off + i] = half::f16::from_f32(vs[i]);
                        }
                    }
                }
            }
            block.len = block.len.max(slot + 1);
        }
        // Layer 0 is written first in every step, so from then on the step's
        // tokens count as stored (later layers' attention must see them).
        if layer == 0 {
            self.len = first_pos + num_tokens;
        }
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        let (base, per) = self.layer_slices(layer);
        for (bi, b) in self.blocks.iter().enumerate() {
            let len = b.len.min(self.len.saturating_sub(bi * BLOCK_TOKENS));
            if len == 0 {
                break;
            }
            let (keys, values) = match &b.data {
                Data::F32(d) => (KvData::F32(&d[base..base + per]), KvData::F32(&d[base + per..base + 2 * per])),
                Data::F16(d) => (KvData::F16(&d[base..base + per]), KvData::F16(&d[base + per..base + 2 * per])),
            };
            let hd = self.pool.layout().head_dim;
            f(&KvChunk { first_pos: bi * BLOCK_TOKENS, len, head_stride: BLOCK_TOKENS * hd, keys, values, mask: None });
        }
    }
}
