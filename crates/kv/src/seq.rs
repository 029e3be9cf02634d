//! `SeqKv`: one sequence's block table, implementing the model's `KvCache`.
//!
//! ```text
//!  positions: 0 ............................................ len   len+reserved
//!  blocks:    [ shared, full ][ shared, full ][ own, partial  ][ own, empty ]
//!              read-only (refcount > 1        written in place  reserved room
//!              or mapped from a file)
//! ```
//! Invariant: tokens are stored at contiguous slots `0..len`; block `b`
//! holds slots `b*32 .. b*32 + 32`; a token's position is its slot unless the
//! sequence was given explicit positions ([`SeqKv::move_slots`], or a step with
//! positions: `KvCache::place`), which chunks then carry; only heap blocks this sequence owns
//! alone are written (a shared or mapped block is copied first, and the copy
//! is charged before it is made). With a quantized format, the partial last
//! block is also held in f16 (the recent window, `recent_window.rs`) and attention
//! reads that copy while the block is partial.

use std::sync::Arc;

use engram_model::{KvCache, KvChunk, KvData, KvElem};

use crate::block::{Block, LineBytes, BLOCK_TOKENS};
use crate::error::KvError;
use crate::pool::KvPool;
use crate::recent_window::RecentWindow;
use crate::sliding::SlidingLayers;

mod release;
pub use release::{MAX_RESUME_POINTS, RESUME_SLACK};

/// How many blocks ahead [`SeqKv`]'s chunks point attention for prefetching
/// ([`KvChunk::ahead`]): 8 blocks of one head's keys and values are 64 KiB (f16, head dim
/// 64), far enough to cover DRAM latency behind a grouped attention pass, near enough to stay
/// in L2.
pub(crate) const PREFETCH_AHEAD: usize = 8;

/// A sequence's cache.
pub struct SeqKv {
    pool: KvPool,
    blocks: Vec<Arc<Block>>,
    len: usize,
    /// The recent window (quantized formats only): valid for the first `len - 32·block`
    /// tokens of block `window.block`; shared with forks until either side writes.
    window: Option<Arc<RecentWindow>>,
    /// The position of each slot `0..len` when some differ from the slot (moved tokens,
    /// trees of drafts); `None`: slot = position.
    positions: Option<Vec<u32>>,
    /// `Some`: blocks older than the sliding layers' window release those layers
    /// (`sliding.rs`) when room is reserved; only while slots are positions.
    sliding: Option<SlidingLayers>,
    /// Resume points (ascending): positions whose preceding window of sliding-layer rows is
    /// kept, so a later request can continue from there ([`SeqKv::keep_window_at`]).
    keep: Vec<usize>,
    /// Whether the windows before the spaced points of the length are kept too
    /// ([`SeqKv::keep_spaced_windows`]).
    spaced: bool,
}

impl SeqKv {
    /// An empty cache charged to `pool`.
    pub fn new(pool: &KvPool) -> SeqKv {
        SeqKv {
            pool: pool.clone(),
            blocks: Vec::new(),
            len: 0,
            window: None,
            positions: None,
            sliding: None,
            keep: Vec::new(),
            spaced: false,
        }
    }

    /// A cache over existing blocks (shared from an index or restored from
    /// disk) holding `len` tokens. Blocks must come from `pool` and all but the
    /// last must be full.
    pub fn from_blocks(pool: &KvPool, blocks: Vec<Arc<Block>>, len: usize) -> SeqKv {
        debug_assert_eq!(blocks.len(), len.div_ceil(BLOCK_TOKENS));
        SeqKv { pool: pool.clone(), blocks, len, window: None, positions: None, sliding: None, keep: Vec::new(), spaced: false }
    }

    /// One sequence of `parts` in order, their blocks shared (no copy): the runs of an entry
    /// stored in pieces put back together. `None` unless every part comes from `pool`, none has
    /// moved positions, every part but the last holds whole blocks, and the last part's recent
    /// window (which becomes this sequence's) is not shared with another fork.
    pub fn concat(pool: &KvPool, parts: Vec<SeqKv>) -> Option<SeqKv> {
        let count = parts.len();
        let mut out = SeqKv::new(pool);
        for (i, mut part) in parts.into_iter().enumerate() {
            let last = i + 1 == count;
            if part.positions.is_some() || (!last && part.len % BLOCK_TOKENS != 0) || !part.pool.same_as(pool) {
                return None;
            }
            let first_block = out.len / BLOCK_TOKENS;
            out.blocks.extend_from_slice(part.blocks());
            out.len += part.len;
            if let Some(win) = part.window.take() {
                let mut win = Arc::try_unwrap(win).ok()?;
                win.block += first_block;
                out.window = Some(Arc::new(win));
            }
        }
        Some(out)
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
    /// The blocks covering positions `0..len` (and any reserved room after).
    pub fn blocks(&self) -> &[Arc<Block>] {
        &self.blocks[..self.len.div_ceil(BLOCK_TOKENS)]
    }

    /// The bytes [`SeqKv::reserve`]`(n)` would charge to the pool now: new blocks, a copy of
    /// a shared or mapped partial last block, a recent window of its own. Never more after
    /// other holders of its blocks let go (a copy is then no longer needed), so freeing this
    /// much first always lets the reservation through.
    pub fn reserve_charge(&self, n: usize) -> usize {
        let p = self.reserve_plan(n);
        (p.new_blocks + p.cow as usize) * self.pool.block_bytes() + p.window_charge
    }

    /// What reserving `n` more tokens takes, as things stand.
    fn reserve_plan(&self, n: usize) -> ReservePlan {
        let need_blocks = (self.len + n).div_ceil(BLOCK_TOKENS);
        let new_blocks = need_blocks.saturating_sub(self.blocks.len());
        let cow = n > 0 && self.len % BLOCK_TOKENS != 0 && {
            let b = &self.blocks[self.len / BLOCK_TOKENS];
            Arc::strong_count(b) > 1 || b.is_mapped()
        };
        let end = self.len + n;
        let window_block = (n > 0 && self.pool.has_window() && end % BLOCK_TOKENS != 0).then_some(end / BLOCK_TOKENS);
        let window_charge = match (window_block, &self.window) {
            (None, _) => 0,
            (Some(tb), Some(t)) if t.block == tb && Arc::strong_count(t) == 1 => 0,
            (Some(_), _) => self.pool.window_bytes(),
        };
        ReservePlan { new_blocks, cow, window_block, window_charge }
    }

    /// Makes room for `n` more tokens: allocates blocks and un-shares the
    /// partial last block if it is shared or mapped; with a quantized format,
    /// also makes the recent window (the f16 copy of the block the new tokens
    /// end in, when they leave it partial) this sequence's own. All or nothing.
    pub fn reserve(&mut self, n: usize) -> Result<(), KvError> {
        self.release_outside_window();
        let ReservePlan { new_blocks, cow, window_block, window_charge } = self.reserve_plan(n);
        let partial = self.len / BLOCK_TOKENS;
        let bb = self.pool.block_bytes();
        self.pool.try_charge((new_blocks + cow as usize) * bb + window_charge)?;
        if cow {
            let copy = self.pool.charged_block(LineBytes::copy_of(self.blocks[partial].bytes()), self.len % BLOCK_TOKENS);
            self.blocks[partial] = Arc::new(copy);
        }
        for _ in 0..new_blocks {
            self.blocks.push(Arc::new(self.pool.charged_block(LineBytes::zeroed(bb), 0)));
        }
        match window_block {
            None if n > 0 => self.window = None,
            None => {}
            Some(tb) => {
                let current = self.window.take().filter(|t| t.block == tb);
                let win = match current {
                    Some(t) if window_charge == 0 => t,
                    Some(t) => Arc::new(t.charged_copy()),
                    None => Arc::new(self.tail_from_block(tb)),
                };
                self.window = Some(win);
            }
        }
        Ok(())
    }

    /// A charged window for block `tb`, its rows for the tokens this sequence
    /// already holds there decoded from the block (they were quantized before).
    fn tail_from_block(&self, tb: usize) -> RecentWindow {
        let mut win = RecentWindow::charged(&self.pool, tb);
        let held = self.len.saturating_sub(tb * BLOCK_TOKENS).min(BLOCK_TOKENS);
        if held > 0 {
            let layout = self.pool.layout();
            let (hd, elem) = (layout.head_dim, self.pool.elem());
            let (rb, rb16) = (elem.row_bytes(hd), KvElem::F16.row_bytes(hd));
            let (sec, tsec) = (self.pool.section_bytes(), self.pool.window_section_bytes());
            let src = self.blocks[tb].bytes();
            let mut row = vec![0f32; hd];
            for section in 0..2 * layout.num_layers {
                for h in 0..layout.num_kv_heads {
                    for slot in 0..held {
                        let i = h * BLOCK_TOKENS + slot;
                        elem.decode_row(&src[section * sec + i * rb..section * sec + (i + 1) * rb], &mut row);
                        let at = section * tsec + i * rb16;
                        KvElem::F16.encode_row(&row, &mut win.bytes[at..at + rb16]);
                    }
                }
            }
        }
        win
    }

    /// A new sequence sharing this one's first `num_tokens` tokens (whole
    /// blocks are shared; a partial block is shared until either side writes).
    pub fn fork(&self, num_tokens: usize) -> SeqKv {
        let n = num_tokens.min(self.len);
        let win = self.window.clone().filter(|t| n % BLOCK_TOKENS != 0 && t.block == n / BLOCK_TOKENS);
        let positions = self.positions.as_ref().map(|p| p[..n].to_vec());
        // Resume points past `n` stay: a fork continues from there (a checkout's prompt end).
        let keep = self.keep.clone();
        let blocks = self.blocks[..n.div_ceil(BLOCK_TOKENS)].to_vec();
        SeqKv { pool: self.pool.clone(), blocks, len: n, window: win, positions, sliding: self.sliding.clone(), keep, spaced: self.spaced }
    }

    /// A fork of the whole sequence that describes its tokens as sitting at their slots: the
    /// same blocks (shared) and bytes, keys not re-rotated, the moved positions forgotten. For
    /// writing a moved sequence (a ring's turn) to an entry file, which records slot positions
    /// only; the reader gives the tokens their positions back with `KvCache::place` (the
    /// caller records them beside the entry).
    pub fn fork_at_slot_positions(&self) -> SeqKv {
        SeqKv { positions: None, ..self.fork(self.len) }
    }

    /// Forgets tokens from `num_tokens` on and releases blocks past it,
    /// including reserved room that was never written.
    pub fn truncate(&mut self, num_tokens: usize) {
        self.len = self.len.min(num_tokens);
        let num_tokens = self.len;
        if let Some(p) = self.positions.as_mut() {
            p.truncate(num_tokens);
        }
        // A partial last block keeps stale tokens past `len`, which
        // `for_each_chunk` hides and the next write overwrites.
        self.blocks.truncate(num_tokens.div_ceil(BLOCK_TOKENS));
        if self.window.as_ref().is_some_and(|t| num_tokens % BLOCK_TOKENS == 0 || t.block != num_tokens / BLOCK_TOKENS) {
            self.window = None;
        }
    }

    /// Keeps, of the slots from `first` on, only those in `keep` (ascending, each `>= first`),
    /// moved down to slots `first, first + 1, ..` with their positions, and forgets the rest:
    /// how the accepted path of a verified tree of drafts becomes the sequence's next tokens,
    /// the rejected branches dropped whole. Rows are copied byte for byte, so every kept token
    /// holds exactly what was written for it. The slots must have been written since the last
    /// [`SeqKv::reserve`] (blocks this sequence owns alone). With a quantized format, a row
    /// moved into the recent window's block from another block leaves that block without its
    /// window (attention then reads its quantized rows): callers that need exactness keep a
    /// step within one block (the scheduler does).
    pub fn keep_slots(&mut self, first: usize, keep: &[usize]) {
        assert!(keep.windows(2).all(|w| w[0] < w[1]), "keep_slots: slots must ascend");
        assert!(keep.iter().all(|&k| k >= first && k < self.len), "keep_slots: slots outside {first}..{}", self.len);
        let layout = self.pool.layout();
        let (elem, sec, tsec) = (self.pool.elem(), self.pool.section_bytes(), self.pool.window_section_bytes());
        let (rb, rb16) = (elem.row_bytes(layout.head_dim), KvElem::F16.row_bytes(layout.head_dim));
        let rows = 2 * layout.num_layers * layout.num_kv_heads;
        let row_at = |section_bytes: usize, row_bytes: usize, r: usize, slot: usize| {
            let (section, h) = (r / layout.num_kv_heads, r % layout.num_kv_heads);
            section * section_bytes + (h * BLOCK_TOKENS + slot % BLOCK_TOKENS) * row_bytes
        };
        let mut row = vec![0u8; rb];
        for (i, &src) in keep.iter().enumerate() {
            let dst = first + i;
            if dst == src {
                continue;
            }
            let (sb, db) = (src / BLOCK_TOKENS, dst / BLOCK_TOKENS);
            for r in 0..rows {
                let at = row_at(sec, rb, r, src);
                row.copy_from_slice(&self.blocks[sb].bytes()[at..at + rb]);
                let block = Arc::get_mut(&mut self.blocks[db]).expect("keep_slots: a slot not written since reserve");
                let at = row_at(sec, rb, r, dst);
                block.bytes_mut().expect("keep_slots: a mapped block")[at..at + rb].copy_from_slice(&row);
            }
            match self.window.as_mut() {
                Some(t) if t.block == db && t.block == sb => {
                    let t = Arc::get_mut(t).expect("keep_slots: a shared window");
                    for r in 0..rows {
                        let (from, to) = (row_at(tsec, rb16, r, src), row_at(tsec, rb16, r, dst));
                        t.bytes.copy_within(from..from + rb16, to);
                    }
                }
                Some(t) if t.block == db => self.window = None,
                _ => {}
            }
            if let Some(p) = self.positions.as_mut() {
                p[dst] = p[src];
            }
        }
        self.truncate(first + keep.len());
        if self.positions.is_some() && self.linear_prefix() == self.len {
            self.positions = None;
        }
    }

    /// Appends tokens `range` of `src` at this sequence's end, moving them to
    /// new positions: keys are re-rotated by the position shift (keys are
    /// stored after RoPE), values copied. This is how a cached chunk (a
    /// document in RAG) is reused at another position. The result equals
    /// the chunk's keys computed at the new positions up to float rounding;
    /// deeper layers still carry the chunk's original context (that is the
    /// approximation chunk reuse makes, and callers must measure it). `rope` says each
    /// layer's RoPE: pass the `ModelConfig` for a model whose layers differ (Gemma 3), a
    /// `RopeConfig` where one serves every layer.
    pub fn extend_shifted(
        &mut self,
        src: &SeqKv,
        range: std::ops::Range<usize>,
        rope: &(impl engram_model::rope::LayerRopes + ?Sized),
    ) -> Result<(), KvError> {
        let n = range.len();
        if n == 0 {
            return Ok(());
        }
        assert!(range.end <= src.len(), "extend_shifted: range past the source's end");
        src.check_held(range.clone())?;
        let layout = self.pool.layout();
        let (hd, w) = (layout.head_dim, layout.num_kv_heads * layout.head_dim);
        let first = self.len;
        self.reserve(n)?;
        for layer in 0..layout.num_layers {
            let rope = rope.rope_of(layer);
            let (cos, sin) = engram_model::rope::shift(rope, first as i64 - range.start as i64);
            let (mut k, v) = src.read_rows(layer, range.clone());
            for head in k.chunks_exact_mut(hd) {
                engram_model::rope::rotate_head(rope.style, head, &cos, &sin);
            }
            debug_assert_eq!(k.len(), n * w);
            self.write(layer, first, &k, &v, n);
        }
        Ok(())
    }

    /// The position of the token in `slot` (`< len`).
    pub fn position(&self, slot: usize) -> usize {
        self.positions.as_ref().map_or(slot, |p| p[slot] as usize)
    }

    /// Whether some token sits at a position other than its slot. Entry files store slot
    /// positions only, so such a sequence is not persisted (`persist::write_entry` refuses).
    pub fn has_moved_positions(&self) -> bool {
        self.linear_prefix() < self.len
    }

    /// How many leading tokens sit at their slot's position (all of them unless moved): the
    /// part of the cache that equals a plain prefill of its tokens.
    pub fn linear_prefix(&self) -> usize {
        self.positions.as_ref().map_or(self.len, |p| p.iter().enumerate().take_while(|&(i, &x)| x as usize == i).count())
    }

    /// Gives the tokens in `slots` the positions `new_first ..`: keys are re-rotated by each
    /// token's shift (keys are stored after RoPE; projections are not recomputed), values are
    /// untouched. Blocks that are shared or mapped are copied first (charged; all or
    /// nothing), so no other sequence sees the move. f32/f16 keys equal keys computed at the
    /// new positions to float rounding; q8/q4 keys are decoded, rotated and quantized again
    /// (one more rounding step: `kv/tests/views_model.rs` measures it). `rope` says each
    /// layer's RoPE, as for [`SeqKv::extend_shifted`].
    pub fn move_slots(
        &mut self,
        slots: std::ops::Range<usize>,
        new_first: usize,
        rope: &(impl engram_model::rope::LayerRopes + ?Sized),
    ) -> Result<(), KvError> {
        assert!(slots.end <= self.len, "move_slots: slots past the end");
        if slots.is_empty() {
            return Ok(());
        }
        self.unshare(slots.clone())?;
        let layout = self.pool.layout();
        let (hd, w) = (layout.head_dim, layout.num_kv_heads * layout.head_dim);
        let deltas: Vec<i64> = slots.clone().enumerate().map(|(i, s)| (new_first + i) as i64 - self.position(s) as i64).collect();
        // One table of shifts per distinct RoPE (usually one for the whole model).
        type Shifts = std::collections::HashMap<i64, (Vec<f32>, Vec<f32>)>;
        let mut tables: Vec<(&engram_model::RopeConfig, Shifts)> = Vec::new();
        let (elem, sec, tsec) = (self.pool.elem(), self.pool.section_bytes(), self.pool.window_section_bytes());
        for layer in 0..layout.num_layers {
            let rope = rope.rope_of(layer);
            let at = match tables.iter().position(|(r, _)| *r == rope) {
                Some(i) => i,
                None => {
                    let mut shifts = std::collections::HashMap::new();
                    for &d in &deltas {
                        shifts.entry(d).or_insert_with(|| engram_model::rope::shift(rope, d));
                    }
                    tables.push((rope, shifts));
                    tables.len() - 1
                }
            };
            let shifts = &tables[at].1;
            let (mut k, _) = self.read_rows(layer, slots.clone());
            for (t, row) in k.chunks_exact_mut(w).enumerate() {
                let (cos, sin) = &shifts[&deltas[t]];
                for head in row.chunks_exact_mut(hd) {
                    engram_model::rope::rotate_head(rope.style, head, cos, sin);
                }
            }
            // Keys only: values do not depend on position, and re-encoding a q4 row is not
            // idempotent (its scale comes from the decoded maximum).
            for (t, slot) in slots.clone().enumerate() {
                let (bi, at) = (slot / BLOCK_TOKENS, slot % BLOCK_TOKENS);
                let ks = &k[t * w..(t + 1) * w];
                let block = Arc::get_mut(&mut self.blocks[bi]).expect("un-shared above");
                encode_keys(block.bytes_mut().expect("un-mapped above"), elem, sec, layer, at, ks, hd);
                if let Some(win) = self.window.as_mut().filter(|t| t.block == bi) {
                    let win = Arc::get_mut(win).expect("un-shared above");
                    encode_keys(&mut win.bytes, KvElem::F16, tsec, layer, at, ks, hd);
                }
            }
        }
        let len = self.len;
        let p = self.positions.get_or_insert_with(|| (0..len as u32).collect());
        for (i, s) in slots.enumerate() {
            p[s] = (new_first + i) as u32;
        }
        Ok(())
    }

    /// Makes the blocks (and the recent window) holding `slots` this sequence's own: shared or
    /// mapped ones are copied (charged; all or nothing), so writing them in place changes no
    /// other sequence. Invariant: afterwards [`SeqKv::overwrite`] of those slots cannot panic.
    pub fn unshare(&mut self, slots: std::ops::Range<usize>) -> Result<(), KvError> {
        assert!(slots.end <= self.len, "unshare: slots past the end");
        if slots.is_empty() {
            return Ok(());
        }
        self.check_held(slots.clone())?;
        let (b0, b1) = (slots.start / BLOCK_TOKENS, (slots.end - 1) / BLOCK_TOKENS);
        // Which blocks to copy is decided once, and exactly those are copied: another thread
        // dropping its handle of a block between a count and a copy (a writer done with a
        // fork) must not leave a block's charge without its block.
        let copies: Vec<usize> = (b0..=b1).filter(|&bi| Arc::strong_count(&self.blocks[bi]) > 1 || self.blocks[bi].is_mapped()).collect();
        let window_copy = self.window.as_ref().is_some_and(|t| (b0..=b1).contains(&t.block) && Arc::strong_count(t) > 1);
        self.pool.try_charge(copies.len() * self.pool.block_bytes() + if window_copy { self.pool.window_bytes() } else { 0 })?;
        for bi in copies {
            let len = self.blocks[bi].len;
            self.blocks[bi] = Arc::new(self.pool.charged_block(LineBytes::copy_of(self.blocks[bi].bytes()), len));
        }
        if window_copy {
            let t = self.window.take().expect("checked above");
            self.window = Some(Arc::new(t.charged_copy()));
        }
        Ok(())
    }

    /// Replaces the keys and values of `layer` for the stored slots `first_slot ..
    /// first_slot + num_tokens` (token-major f32, keys already rotated for the slots'
    /// positions), leaving the length and positions as they are: selective recomputation
    /// writes fresh KV over reused rows. Panics if a slot is past the end or its block is
    /// shared (call [`SeqKv::unshare`] first).
    pub fn overwrite(&mut self, layer: usize, first_slot: usize, keys: &[f32], values: &[f32], num_tokens: usize) {
        assert!(first_slot + num_tokens <= self.len, "overwrite: slots past the end");
        let w = self.pool.layout().num_kv_heads * self.pool.layout().head_dim;
        for t in 0..num_tokens {
            self.encode_slot(layer, first_slot + t, &keys[t * w..(t + 1) * w], &values[t * w..(t + 1) * w]);
        }
    }

    /// Encodes one token's rows of `layer` into its block (and the recent window holding it).
    fn encode_slot(&mut self, layer: usize, pos: usize, ks: &[f32], vs: &[f32]) {
        let layout = self.pool.layout();
        let hd = layout.head_dim;
        let elem = self.pool.elem();
        let (sec, tsec) = (self.pool.section_bytes(), self.pool.window_section_bytes());
        let (bi, slot) = (pos / BLOCK_TOKENS, pos % BLOCK_TOKENS);
        let block = Arc::get_mut(&mut self.blocks[bi]).expect("SeqKv::write: block not reserved or still shared");
        assert!(block.released.is_none(), "SeqKv::write: slot {pos} is in a block whose sliding layers were released");
        let bytes = block.bytes_mut().expect("SeqKv::write: reserve() un-maps the block it writes");
        encode_token(bytes, elem, sec, layer, slot, ks, vs, hd);
        block.len = block.len.max(slot + 1);
        if self.window.as_mut().is_some_and(|tl| tl.block == bi && Arc::get_mut(tl).is_none()) {
            // Shared since `reserve` (a fork taken mid-step): fall back to the quantized
            // block, which holds every row, rather than write into the other's window.
            self.window = None;
        }
        if let Some(win) = self.window.as_mut().filter(|tl| tl.block == bi) {
            let win = Arc::get_mut(win).expect("unshared just above");
            encode_token(&mut win.bytes, KvElem::F16, tsec, layer, slot, ks, vs, hd);
        }
    }

    /// Keys and values of slots `range` (positions, unless moved) for `layer`, token-major
    /// f32 `[n, num_kv_heads * head_dim]`.
    pub fn read_rows(&self, layer: usize, range: std::ops::Range<usize>) -> (Vec<f32>, Vec<f32>) {
        let layout = self.pool.layout();
        let (hd, nh) = (layout.head_dim, layout.num_kv_heads);
        let w = nh * hd;
        let (mut k, mut v) = (vec![0f32; range.len() * w], vec![0f32; range.len() * w]);
        self.for_each_chunk(layer, &mut |c| {
            let rb = c.keys.elem.row_bytes(hd);
            for t in 0..c.len {
                let slot = c.key_index + t;
                if !range.contains(&slot) {
                    continue;
                }
                let i = slot - range.start;
                for h in 0..nh {
                    let off = (h * c.capacity + t) * rb;
                    c.keys.elem.decode_row(&c.keys.bytes[off..off + rb], &mut k[i * w + h * hd..i * w + (h + 1) * hd]);
                    c.values.elem.decode_row(&c.values.bytes[off..off + rb], &mut v[i * w + h * hd..i * w + (h + 1) * hd]);
                }
            }
        });
        (k, v)
    }

    /// The recent window when it holds block `bi`'s attended rows (a quantized partial block).
    pub(crate) fn window_of(&self, bi: usize) -> Option<Arc<RecentWindow>> {
        self.window.as_ref().filter(|t| t.block == bi && self.len < (bi + 1) * BLOCK_TOKENS).cloned()
    }

    /// The recent window's bytes (f16 rows in the block layout, `recent_window.rs`)
    /// when this sequence holds one for its partial last block: rows
    /// `0..len % BLOCK_TOKENS` of every layer and head are the attended values.
    pub fn window(&self) -> Option<&[u8]> {
        let t = self.window.as_ref()?;
        (self.len % BLOCK_TOKENS != 0 && t.block == self.len / BLOCK_TOKENS).then_some(&t.bytes[..])
    }

    /// Gives the partial last block a recent window copied from `bytes`, as
    /// [`SeqKv::window`] returned them (a restored file's), charging it.
    /// Errors: a format without a window, no partial last block, a size other
    /// than the pool's window, or the RAM budget.
    pub fn set_window(&mut self, bytes: &[u8]) -> Result<(), KvError> {
        if !self.pool.has_window() || self.len % BLOCK_TOKENS == 0 || bytes.len() != self.pool.window_bytes() {
            return Err(KvError::BadMapping(format!(
                "a {}-byte recent window for {} tokens of {} KV (expected {} bytes, a quantized format and a partial last block)",
                bytes.len(),
                self.len,
                self.pool.format(),
                self.pool.window_bytes()
            )));
        }
        self.pool.try_charge(bytes.len())?;
        let mut win = RecentWindow::charged(&self.pool, self.len / BLOCK_TOKENS);
        win.bytes.copy_from_slice(bytes);
        self.window = Some(Arc::new(win));
        Ok(())
    }

    /// Bytes of blocks (and the recent window) this sequence references, shared ones counted in
    /// full, released blocks (`sliding.rs`) as the global layers they still hold.
    pub fn num_bytes(&self) -> usize {
        self.blocks.iter().map(|b| b.held_bytes()).sum::<usize>() + self.window.as_ref().map_or(0, |t| t.bytes.len())
    }
}

impl KvCache for SeqKv {
    fn write(&mut self, layer: usize, first_pos: usize, keys: &[f32], values: &[f32], num_tokens: usize) {
        let layout = self.pool.layout();
        let w = layout.num_kv_heads * layout.head_dim;
        for t in 0..num_tokens {
            self.encode_slot(layer, first_pos + t, &keys[t * w..(t + 1) * w], &values[t * w..(t + 1) * w]);
        }
        // Layer 0 is written first in every step, so from then on the step's
        // tokens count as stored (later layers' attention must see them).
        if layer == 0 {
            self.len = first_pos + num_tokens;
            if let Some(p) = self.positions.as_mut() {
                // Tokens written without `place` sit at their slots.
                p.truncate(self.len);
                let have = p.len();
                p.extend((have..self.len).map(|s| s as u32));
            }
        }
    }

    fn place(&mut self, first_slot: usize, positions: &[u32]) -> Result<(), String> {
        if first_slot > self.len {
            return Err(format!("positions for slot {first_slot} of a sequence of {} tokens", self.len));
        }
        let len = self.len;
        let p = self.positions.get_or_insert_with(|| (0..len as u32).collect());
        p.truncate(first_slot);
        p.extend_from_slice(positions);
        Ok(())
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        let sec = self.pool.section_bytes();
        let elem = self.pool.elem();
        // Tokens of block `bi` this sequence holds.
        let held = |bi: usize| self.blocks.get(bi).map_or(0, |b| b.len.min(self.len.saturating_sub(bi * BLOCK_TOKENS)));
        for (bi, b) in self.blocks.iter().enumerate() {
            let len = held(bi);
            if len == 0 {
                break;
            }
            // A full block PREFETCH_AHEAD further on (never the window: it is small and hot).
            let ahead =
                if held(bi + PREFETCH_AHEAD) == BLOCK_TOKENS { self.blocks[bi + PREFETCH_AHEAD].layer_sections(layer, sec) } else { None };
            let window = self.window.as_ref().filter(|t| t.block == bi && len < BLOCK_TOKENS);
            let (elem, (k, v)) = match window {
                Some(t) => (KvElem::F16, layer_sections(&t.bytes, layer, self.pool.window_section_bytes())),
                // A block whose sliding layers were released lies outside every window a
                // query of this sequence can have (`sliding.rs`): nothing to attend.
                None => match b.layer_sections(layer, sec) {
                    Some(kv) => (elem, kv),
                    None => continue,
                },
            };
            let (keys, values) = (KvData { elem, bytes: k }, KvData { elem, bytes: v });
            let positions = self.positions.as_ref().map(|p| &p[bi * BLOCK_TOKENS..bi * BLOCK_TOKENS + len]);
            f(&KvChunk {
                first_pos: bi * BLOCK_TOKENS,
                positions,
                key_index: bi * BLOCK_TOKENS,
                len,
                capacity: BLOCK_TOKENS,
                keys,
                values,
                mask: None,
                ahead,
            });
        }
    }
}

/// A block's (or window's) keys and values of `layer`, whose sections are `sec` bytes each.
fn layer_sections(bytes: &[u8], layer: usize, sec: usize) -> (&[u8], &[u8]) {
    (&bytes[2 * layer * sec..(2 * layer + 1) * sec], &bytes[(2 * layer + 1) * sec..(2 * layer + 2) * sec])
}

/// Encodes one token's keys and values (`[num_kv_heads * head_dim]` each) as `elem` rows at
/// `slot` of `layer` in `bytes`, a buffer in the block layout (`block.rs`) with `sec`-byte sections.
#[allow(clippy::too_many_arguments)]
fn encode_token(bytes: &mut [u8], elem: KvElem, sec: usize, layer: usize, slot: usize, keys: &[f32], values: &[f32], hd: usize) {
    let rb = elem.row_bytes(hd);
    for (h, (ks, vs)) in keys.chunks_exact(hd).zip(values.chunks_exact(hd)).enumerate() {
        let off = (h * BLOCK_TOKENS + slot) * rb;
        let (k0, v0) = (2 * layer * sec + off, (2 * layer + 1) * sec + off);
        elem.encode_row(ks, &mut bytes[k0..k0 + rb]);
        elem.encode_row(vs, &mut bytes[v0..v0 + rb]);
    }
}

/// Encodes one token's keys (`[num_kv_heads * head_dim]`) as `elem` rows at `slot` of `layer`
/// in `bytes` (block layout, `sec`-byte sections), leaving its values as they are.
fn encode_keys(bytes: &mut [u8], elem: KvElem, sec: usize, layer: usize, slot: usize, keys: &[f32], hd: usize) {
    let rb = elem.row_bytes(hd);
    for (h, ks) in keys.chunks_exact(hd).enumerate() {
        let k0 = 2 * layer * sec + (h * BLOCK_TOKENS + slot) * rb;
        elem.encode_row(ks, &mut bytes[k0..k0 + rb]);
    }
}

/// What [`SeqKv::reserve`] allocates: blocks after the last, a private copy of the partial
/// last block, and the recent window of the block the new tokens end in (charged or kept).
struct ReservePlan {
    new_blocks: usize,
    cow: bool,
    window_block: Option<usize>,
    window_charge: usize,
}
