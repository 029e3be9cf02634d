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

/// How many windows apart the nearest spaced points lie ([`SlidingLayers::spacing`]): the
/// trade between the bytes their windows keep (about `3·log2(len / spacing)` windows) and the
/// tokens a divergence recomputes (less than twice the spacing past the nearest point).
pub const SPACING_WINDOWS: usize = 4;

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

    /// The spacing of the windows a sequence keeps at block boundaries
    /// ([`crate::SeqKv::keep_spaced_windows`]): [`SPACING_WINDOWS`] windows, rounded up to
    /// whole blocks. No two spaced points of one distance lie closer, so their windows keep at
    /// most a quarter of the sliding layers' rows between them.
    pub fn spacing(&self) -> usize {
        (SPACING_WINDOWS * self.window).next_multiple_of(crate::BLOCK_TOKENS)
    }

    /// The positions a sequence of `len` tokens that keeps spaced windows
    /// ([`crate::SeqKv::keep_spaced_windows`]) keeps the window before, ascending, `s` being
    /// [`SlidingLayers::spacing`]: every `s·2^k <= len` (anchored: a request diverging at
    /// `p >= s` resumes after `p / 2`), and for every `k` the last two multiples of `s·2^k`
    /// at or below `len` (trailing: a request diverging `d` tokens before the end resumes
    /// less than `max(2s, 3d)` tokens before the divergence). About `3·log2(len / s)` points.
    ///
    /// Invariant: a point that leaves the set as `len` grows never comes back (anchored points
    /// never leave; a trailing one is a multiple of `s·2^k` that two later multiples passed),
    /// so no window released is asked for again.
    pub fn spaced_points(&self, len: usize) -> Vec<usize> {
        let s = self.spacing();
        let mut points = Vec::new();
        let mut step = s;
        while step <= len {
            let last = len / step * step;
            points.extend([step, last, last - step]);
            step = match step.checked_mul(2) {
                Some(x) => x,
                None => break,
            };
        }
        points.sort_unstable();
        points.dedup();
        points.retain(|&p| p > 0);
        points
    }

    /// Whether block `bi` of a sequence of `len` tokens gives up its sliding layers' rows: no
    /// query at a position `>= len -` [`crate::RESUME_SLACK`] sees it and no point of
    /// `points` (resume points: each reads the window before it) needs it. The one rule
    /// [`crate::SeqKv::release_outside_window`] releases by and [`SlidingLayers::bytes_held`]
    /// counts by.
    pub(crate) fn releases(&self, bi: usize, len: usize, points: &[usize]) -> bool {
        let (start, end) = (bi * crate::BLOCK_TOKENS, (bi + 1) * crate::BLOCK_TOKENS);
        end + self.window + crate::RESUME_SLACK <= len && !points.iter().any(|&p| start < p && end + self.window > p)
    }

    /// Bytes of the sliding layers' rows one resume point's window keeps in blocks that would
    /// otherwise be released: the window in whole blocks, one more where it does not start on a
    /// block boundary. What a resume point whose position is not known yet costs at most.
    pub fn resume_window_bytes(&self, pool: &KvPool) -> usize {
        (self.window.div_ceil(crate::BLOCK_TOKENS) + 1) * (pool.block_bytes() - self.released_block_bytes(pool))
    }

    /// The bytes a sequence of `tokens` tokens that releases by this geometry holds in `pool`
    /// at most while its last `step` tokens are written (`step` 0: at rest after
    /// [`crate::SeqKv::release_outside_window`]), with resume points `keep` and, if `spaced`,
    /// the spaced windows ([`SlidingLayers::spaced_points`]): global layers for every token,
    /// sliding layers for the blocks [`crate::SeqKv::reserve`] has not released by then (the
    /// window, the slack, the step and the windows before the points), plus the recent window a
    /// quantized format keeps. Exact at rest for a sequence that released with those points;
    /// an upper bound of the pool's charge while it is prefilled in steps of at most `step`.
    pub fn bytes_held(&self, pool: &KvPool, tokens: usize, step: usize, keep: &[usize], spaced: bool) -> usize {
        let len = tokens.saturating_sub(step);
        let mut points = keep.to_vec();
        if spaced {
            points.extend(self.spaced_points(len));
        }
        let blocks = tokens.div_ceil(crate::BLOCK_TOKENS);
        let released = (0..blocks).filter(|&bi| self.releases(bi, len, &points)).count();
        let recent = if pool.has_window() && tokens > 0 { pool.window_bytes() } else { 0 };
        (blocks - released) * pool.block_bytes() + released * self.released_block_bytes(pool) + recent
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
