//! `KvView`: a sequence's view of the KV as an ordered list of read-only spans (runs of
//! slots of any blocks, each at its own logical positions and for a chosen set of KV heads),
//! followed by the sequence's own [`SeqKv`] that its new tokens are written to.
//!
//! ```text
//!  view keys:  [ span: persistent stream ][ span: turn 3 ][ span: turn 7 ][ own SeqKv: this turn ... ]
//!  positions:    0 .. 120                   120 .. 410      410 .. 530      530 ..   (any, with gaps)
//!  blocks:       shared, mapped             shared          shared          owned, written in place
//! ```
//!
//! A span shares its blocks (an `Arc` per block: the bytes stay charged once, to whoever made
//! them, for as long as any view holds them); it is never written. Leaving a span out of the
//! view masks it for every query of the sequence; a [`engram_model::KeyMask`] on the step masks
//! per query row. Moving a span to new positions is a copy with re-rotated keys
//! ([`SeqKv::extend_shifted`], [`SeqKv::move_slots`]): a span's positions are only what
//! causality compares.
//!
//! Invariant: the view yields the spans in order (those selecting the KV head asked for),
//! then the own sequence's chunks; keys are numbered in that order for every head (a span a
//! head does not select still takes its numbers), so a key mask means the same for every head.

use std::ops::Range;
use std::sync::Arc;

use engram_model::{KvCache, KvChunk, KvData, KvElem, KvRead};

use crate::block::{Block, BLOCK_TOKENS};
use crate::error::KvError;
use crate::pending::PendingRows;
use crate::recent_window::RecentWindow;
use crate::seq::{SeqKv, PREFETCH_AHEAD};

/// Where a span's rows live.
#[derive(Clone)]
enum SpanRows {
    /// A block, in the pool's format.
    Block(Arc<Block>),
    /// A quantized sequence's recent window (f16 rows in the block layout).
    Window(Arc<RecentWindow>),
    /// A block's rows that arrive layer by layer (`pending.rs`); a reader waits for its layer.
    Pending(Arc<PendingRows>),
}

/// Slots `start .. start + len` of one block (or recent window) at logical positions, for a
/// set of KV heads. Made by [`SeqKv::spans`]; read-only.
#[derive(Clone)]
pub struct Span {
    rows: SpanRows,
    start: usize,
    len: usize,
    /// Position of each token (`len` entries).
    positions: Arc<[u32]>,
    /// Bit `h` set: KV head `h` attends to this span.
    heads: u64,
}

impl Span {
    /// Tokens in the span.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a span of no tokens.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The positions of the span's tokens.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// This span for the KV heads whose bits are set in `heads` only (bit `h`: head `h`).
    pub fn for_heads(mut self, heads: u64) -> Span {
        self.heads = heads;
        self
    }

    /// The same rows, re-labelled with new positions (`len` of them). Keys are NOT re-rotated:
    /// this changes only what causality compares (a tree's draft keys, keys whose rotation
    /// was already made right elsewhere). To move keys, see [`SeqKv::move_slots`].
    pub fn at_positions(mut self, positions: &[u32]) -> Span {
        assert_eq!(positions.len(), self.len, "Span::at_positions: one position per token");
        self.positions = positions.into();
        self
    }

    /// Slots `slots` (within one block, `< 32`) of rows still to arrive, at `positions`, for
    /// every head: the reader asks for each layer when it needs it and waits for it.
    pub fn pending(rows: Arc<PendingRows>, slots: Range<usize>, positions: &[u32]) -> Span {
        assert!(
            slots.end <= BLOCK_TOKENS && slots.len() == positions.len() && !slots.is_empty(),
            "Span::pending: one block's slots, one position each"
        );
        Span { rows: SpanRows::Pending(rows), start: slots.start, len: slots.len(), positions: positions.into(), heads: u64::MAX }
    }

    fn selects(&self, head: usize) -> bool {
        head < 64 && self.heads >> head & 1 == 1
    }
}

impl SeqKv {
    /// Read-only spans over `slots` (`<= len`), one per block touched, at the tokens' current
    /// positions, for every head. They share this sequence's blocks (and recent window, for a
    /// quantized partial block), so writing here later copies first.
    ///
    /// `Err(KvError::Released)` if some of `slots` are in a block whose sliding layers were
    /// released (`sliding.rs`): a span may be attended at other positions, where those rows
    /// matter; the caller recomputes them instead. Panics if `slots` reach past the end.
    pub fn try_spans(&self, slots: Range<usize>) -> Result<Vec<Span>, KvError> {
        assert!(slots.end <= self.len(), "SeqKv::try_spans: slots past the end");
        self.check_held(slots.clone())?;
        Ok(self.spans_unchecked(slots))
    }

    /// [`SeqKv::try_spans`] for a sequence that never released anything (it does not
    /// [`SeqKv::release_sliding`]: a RAG document, a dual-stream turn, a test's sequence).
    /// Panics where `try_spans` errs.
    pub fn spans(&self, slots: Range<usize>) -> Vec<Span> {
        match self.try_spans(slots) {
            Ok(spans) => spans,
            Err(e) => panic!("SeqKv::spans: {e} (use try_spans for a sequence that releases)"),
        }
    }

    fn spans_unchecked(&self, slots: Range<usize>) -> Vec<Span> {
        let mut out = Vec::new();
        let mut s = slots.start;
        while s < slots.end {
            let bi = s / BLOCK_TOKENS;
            let end = slots.end.min((bi + 1) * BLOCK_TOKENS);
            let rows = match self.window_of(bi) {
                Some(t) => SpanRows::Window(t),
                None => SpanRows::Block(self.blocks()[bi].clone()),
            };
            let positions: Arc<[u32]> = (s..end).map(|x| self.position(x) as u32).collect();
            out.push(Span { rows, start: s % BLOCK_TOKENS, len: end - s, positions, heads: u64::MAX });
            s = end;
        }
        out
    }
}

/// A sequence's view: read-only spans, then its own [`SeqKv`]. Implements the model's
/// [`KvCache`]: writes go to the own sequence (at its slots; positions as the step gives).
pub struct KvView {
    spans: Vec<Span>,
    span_keys: usize,
    /// One past the spans' last position: where the own tokens start.
    own_first: usize,
    own: SeqKv,
}

impl KvView {
    /// A view of `spans` (attended in this order) followed by `own`.
    pub fn new(spans: Vec<Span>, own: SeqKv) -> KvView {
        let span_keys = spans.iter().map(|s| s.len).sum();
        let own_first = spans.iter().flat_map(|s| s.positions.iter()).max().map_or(0, |&p| p as usize + 1);
        KvView { spans, span_keys, own_first, own }
    }

    /// The view with its own tokens starting at `first` rather than one past the spans' last
    /// position: a view whose last slots are left out (a tombstoned fact at the end of a
    /// persistent stream) still puts the new tokens after them, where the policy keeps them.
    /// `None` changes nothing. Panics if `first` is below the spans' end (positions would clash).
    pub fn starting_at(mut self, first: Option<usize>) -> KvView {
        if let Some(first) = first {
            assert!(first >= self.own_first, "KvView::starting_at({first}): the spans reach position {}", self.own_first);
            self.own_first = first;
        }
        self
    }

    /// The position of the own sequence's first slot: one past the spans' last position
    /// (0 without spans, where slots are positions). A step on the view stores its tokens at
    /// the own slots and gives them positions from here ([`KvView::step_positions`]).
    pub fn own_first_position(&self) -> usize {
        self.own_first
    }

    /// The positions of `n` tokens stored from own slot `first_slot` on, or `None` where slots
    /// are positions (no spans: the linear fast path).
    pub fn step_positions(&self, first_slot: usize, n: usize) -> Option<Vec<u32>> {
        (self.own_first > 0).then(|| (self.own_first + first_slot..self.own_first + first_slot + n).map(|p| p as u32).collect())
    }

    /// The spans.
    pub fn spans(&self) -> &[Span] {
        &self.spans
    }

    /// Keys in the spans (the own sequence's keys are numbered from here).
    pub fn span_keys(&self) -> usize {
        self.span_keys
    }

    /// Keys in the whole view.
    pub fn num_keys(&self) -> usize {
        self.span_keys + self.own.len()
    }

    /// The own sequence.
    pub fn own(&self) -> &SeqKv {
        &self.own
    }

    /// The own sequence, to reserve room in or truncate.
    pub fn own_mut(&mut self) -> &mut SeqKv {
        &mut self.own
    }

    /// The own sequence back, dropping the spans.
    pub fn into_own(self) -> SeqKv {
        self.own
    }

    /// The keys and values of `layer` in the span [`PREFETCH_AHEAD`] spans after span `si`, for
    /// attention to prefetch ([`KvChunk::ahead`]): whole sections (row `h * 32` is head `h`'s
    /// first), only where that span's rows are a block in RAM.
    fn ahead_of(&self, si: usize, layer: usize, sec: usize) -> Option<(&[u8], &[u8])> {
        match &self.spans.get(si + PREFETCH_AHEAD)?.rows {
            SpanRows::Block(b) => b.layer_sections(layer, sec),
            _ => None,
        }
    }

    fn emit(&self, layer: usize, head: Option<usize>, f: &mut dyn FnMut(&KvChunk<'_>)) {
        let layout = self.own.pool().layout();
        let (sec, tsec) = (self.own.pool().section_bytes(), self.own.pool().window_section_bytes());
        let mut key = 0;
        for (si, span) in self.spans.iter().enumerate() {
            let key_index = key;
            key += span.len;
            if head.is_some_and(|h| !span.selects(h)) || span.len == 0 {
                continue;
            }
            let fetched;
            let (elem, bytes, sec, first) = match &span.rows {
                // A block whose sliding layers were released (`sliding.rs`) has none of this
                // layer's rows: outside every window of the sequence that released it.
                SpanRows::Block(b) => match b.layer_offset(layer, sec) {
                    Some(first) => (self.own.pool().elem(), b.bytes(), sec, first),
                    None => continue,
                },
                SpanRows::Window(t) => (KvElem::F16, &t.bytes[..], tsec, 2 * layer * tsec),
                SpanRows::Pending(p) => {
                    fetched = p.wait(layer);
                    (self.own.pool().elem(), &fetched[..], sec, 0)
                }
            };
            let rb = elem.row_bytes(layout.head_dim);
            // Row `h * 32 + start + t` of the block is row `h * 32 + t` of the slice.
            let k = &bytes[first + span.start * rb..first + sec];
            let v = &bytes[first + sec + span.start * rb..first + 2 * sec];
            f(&KvChunk {
                first_pos: span.positions[0] as usize,
                positions: Some(&span.positions),
                key_index,
                len: span.len,
                capacity: BLOCK_TOKENS,
                keys: KvData { elem, bytes: k },
                values: KvData { elem, bytes: v },
                mask: None,
                ahead: self.ahead_of(si, layer, sec),
            });
        }
        let offset = self.span_keys;
        self.own.for_each_chunk(layer, &mut |c| f(&KvChunk { key_index: c.key_index + offset, ..*c }));
    }
}

impl KvCache for KvView {
    fn write(&mut self, layer: usize, first_slot: usize, keys: &[f32], values: &[f32], num_tokens: usize) {
        self.own.write(layer, first_slot, keys, values, num_tokens)
    }

    fn place(&mut self, first_slot: usize, positions: &[u32]) -> Result<(), String> {
        self.own.place(first_slot, positions)
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        self.emit(layer, None, f)
    }

    fn for_each_chunk_of(&self, read: &KvRead<'_>, f: &mut dyn FnMut(&KvChunk<'_>)) {
        self.emit(read.layer, Some(read.kv_head), f)
    }
}
