//! [`SlidingLayers`]: which layers of a model attend over a sliding window, and how wide it
//! is, as the KV store needs it to release keys no later query can see.
//!
//! A query at position `p` of a sliding layer sees keys at `p - window < k <= p`
//! (`engram_model::LayerAttention`). A sequence that only grows (slots are positions) asks its
//! next queries at positions `>= len`, so a block whose last position is below
//! `len - window` holds nothing a sliding layer will read again: [`crate::SeqKv`] releases
//! those layers' sections of such blocks (a released block keeps its global layers only) when
//! the sequence opted in ([`crate::SeqKv::release_sliding`]).
//!
//! ```text
//!  positions:   0 ...................................... len-W ....... len   len+n
//!  global:      [ b0 ][ b1 ][ b2 ][ b3 ][ b4 ][ b5 ][ b6 ][ b7 ][ b8 ][ b9 ]      every block, every layer
//!  sliding:     [ -- ][ -- ][ b2 ][ -- ][ -- ][ -- ][ -- ][ b7 ][ b8 ][ b9 ]      released, except the window
//!                            ^ kept: the window before a resume point (a turn's end)
//! ```
//!
//! Invariant: a released block never again holds its sliding layers' rows; attention never
//! needs them from a sequence whose queries start at a resume point
//! ([`crate::SeqKv::resumable`]): one whose preceding `window` positions are all held.

use std::sync::Arc;

use crate::pool::KvPool;

/// The sliding layers of a model and the widest of their windows (every sliding layer keeps
/// that many positions, which is exact for narrower ones too).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlidingLayers {
    window: usize,
    sliding: Arc<[bool]>,
}

impl SlidingLayers {
    /// The sliding layers of `config`, or `None` when every layer is global.
    pub fn of(config: &engram_model::ModelConfig) -> Option<SlidingLayers> {
        let windows: Vec<Option<usize>> = (0..config.num_layers).map(|l| config.layer_attention(l).window()).collect();
        let window = windows.iter().flatten().copied().max()?;
        Some(SlidingLayers { window, sliding: windows.iter().map(Option::is_some).collect() })
    }

    /// Layers `l` with `sliding[l]` keep `window` positions; `None` when no layer slides or the
    /// window is zero.
    pub fn new(window: usize, sliding: Vec<bool>) -> Option<SlidingLayers> {
        (window > 0 && sliding.iter().any(|&s| s)).then(|| SlidingLayers { window, sliding: sliding.into() })
    }

    /// Positions a sliding layer sees before (and including) a query's own.
    pub fn window(&self) -> usize {
        self.window
    }

    /// Number of layers described.
    pub fn num_layers(&self) -> usize {
        self.sliding.len()
    }

    /// Whether layer `l` slides.
    pub fn is_sliding(&self, l: usize) -> bool {
        self.sliding.get(l).copied().unwrap_or(false)
    }

    /// Number of global layers (those a released block still holds).
    pub fn num_global(&self) -> usize {
        self.sliding.iter().filter(|&&s| !s).count()
    }

    /// Where layer `l`'s sections sit in a released block: its index among the global layers,
    /// or `None` for a sliding layer (not held).
    pub(crate) fn held_index(&self, l: usize) -> Option<usize> {
        (!self.is_sliding(l)).then(|| self.sliding[..l].iter().filter(|&&s| !s).count())
    }

    /// Bytes of a released block of `pool`: its global layers' sections.
    pub fn released_block_bytes(&self, pool: &KvPool) -> usize {
        2 * self.num_global() * pool.section_bytes()
    }

    /// Bytes a sequence of `tokens` tokens holds in `pool` once every block older than the
    /// window (and `step` more tokens) is released: whole blocks for the newest
    /// `window + step +` [`crate::RESUME_SLACK`] positions, global layers only before them, plus the recent window a
    /// quantized format keeps. What [`crate::SeqKv::release_outside_window`] leaves, at most
    /// one block more (the window's start need not be on a block boundary).
    pub fn bytes_for(&self, pool: &KvPool, tokens: usize, step: usize) -> usize {
        let blocks = tokens.div_ceil(crate::BLOCK_TOKENS);
        let full = (self.window + step + crate::RESUME_SLACK).div_ceil(crate::BLOCK_TOKENS) + 1;
        let kept = blocks.min(full);
        let recent = if pool.has_window() && tokens > 0 { pool.window_bytes() } else { 0 };
        kept * pool.block_bytes() + (blocks - kept) * self.released_block_bytes(pool) + recent
    }
}
