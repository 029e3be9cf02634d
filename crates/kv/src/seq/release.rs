//! Releasing sliding layers' rows outside their window (`sliding.rs`), and the resume points
//! that keep a window for a later request.
//!
//! ```text
//!  slots = positions: 0 ................ p-W ..... p ........................ len-W ...... len
//!  sliding rows:      [ released      ][ kept: window of resume point p ][ released ][ kept  ]
//! ```
//! Invariant: only while slots are positions is anything released. A block this sequence
//! holds alone is replaced by its released copy, so its charge drops to its global layers'
//! bytes at once; a shared one (a fork, the prefix index, a save in flight) is replaced in this
//! sequence only, the others keep the whole block, and its bytes return once they let go.

use std::sync::Arc;

use crate::block::{LineBytes, BLOCK_TOKENS};
use crate::error::KvError;
use crate::sliding::SlidingLayers;

use super::SeqKv;

/// Resume points a sequence keeps the window before: the newest ones (the starts of the last
/// turns: where a regenerated answer or an edited last message resumes). Each costs up to a
/// window and two blocks of the sliding layers' rows; a request that diverges before the
/// oldest recomputes from an earlier point whose window is whole: a spaced point
/// ([`SeqKv::keep_spaced_windows`]) near it, or without those at worst the start.
pub const MAX_RESUME_POINTS: usize = 2;

/// Positions kept beyond the window before a sequence's end: a next request that resumes a few
/// tokens short of the end (a token merged across the boundary is tokenized again) still finds
/// the window before its resume point whole. One block: the window is kept in whole blocks anyway.
pub const RESUME_SLACK: usize = BLOCK_TOKENS;

impl SeqKv {
    /// From now on (and in forks of it), blocks older than `g`'s window release their sliding
    /// layers whenever room is reserved. For sequences that only grow (sessions, agents):
    /// a sequence whose tokens were moved (`move_slots`, `place`) releases nothing. Panics if
    /// `g` describes another number of layers than the pool.
    pub fn release_sliding(&mut self, g: SlidingLayers) {
        assert_eq!(g.num_layers(), self.pool.layout().num_layers, "release_sliding: a geometry for another model");
        self.sliding = Some(g);
    }

    /// The sliding geometry this sequence releases by, if it does.
    pub fn sliding(&self) -> Option<&SlidingLayers> {
        self.sliding.as_ref()
    }

    /// Keeps the sliding layers' rows of the `window` positions before `pos`, so a later
    /// request can resume at `pos` ([`SeqKv::resumable`]): a turn's start, or the end of a prompt still being prefilled
    /// (`pos` may lie past `len`: a point the sequence will reach; the next request's template
    /// may render the answer after it differently). The newest [`MAX_RESUME_POINTS`] are kept
    /// (older ones are forgotten: their windows may be released). Forks and truncations keep
    /// every resume point.
    pub fn keep_window_at(&mut self, pos: usize) {
        if let Err(i) = self.keep.binary_search(&pos) {
            self.keep.insert(i, pos);
        }
        if self.keep.len() > MAX_RESUME_POINTS {
            self.keep.drain(..self.keep.len() - MAX_RESUME_POINTS);
        }
    }

    /// The resume points kept ([`SeqKv::keep_window_at`]), ascending.
    pub fn resume_points(&self) -> &[usize] {
        &self.keep
    }

    /// From now on (and in forks of it), the sequence also keeps the window before the spaced
    /// points of its length ([`SlidingLayers::spaced_points`]: block boundaries at
    /// geometrically growing distances from its start and from its end), so a request that
    /// diverges anywhere resumes near the divergence: after half of it, and less than
    /// `max(2·spacing, 3·(tokens after it))` before it. Costs about `3·log2(len / spacing)`
    /// windows of the sliding layers' rows.
    pub fn keep_spaced_windows(&mut self) {
        self.spaced = true;
    }

    /// Whether the sequence keeps spaced windows ([`SeqKv::keep_spaced_windows`]).
    pub fn keeps_spaced_windows(&self) -> bool {
        self.spaced
    }

    /// Every position whose window this sequence keeps now: its resume points and, if it keeps
    /// spaced windows, the spaced points of its length; ascending.
    pub fn kept_points(&self) -> Vec<usize> {
        let mut points = self.keep.clone();
        if let (true, Some(g)) = (self.spaced, &self.sliding) {
            points.extend(g.spaced_points(self.len));
            points.sort_unstable();
            points.dedup();
        }
        points
    }

    /// The bytes this sequence would hold at rest with `tokens` tokens, releasing as it does now
    /// ([`SlidingLayers::bytes_held`] with its resume points and spacing); the pool's
    /// [`crate::KvPool::bytes_for`] (every layer, every token) when it releases nothing.
    pub fn bytes_held_at(&self, tokens: usize) -> usize {
        match (&self.sliding, self.positions.is_some()) {
            (Some(g), false) => g.bytes_held(&self.pool, tokens, 0, &self.keep, self.spaced),
            _ => self.pool.bytes_for(tokens),
        }
    }

    /// Releases the sliding layers of every block no query at a position `>= len -`
    /// [`RESUME_SLACK`] sees and no resume point needs (module doc); returns the bytes this
    /// sequence stops holding (they return to the pool at once unless others share the whole
    /// block). A block whose smaller copy the budget refuses stays whole.
    pub fn release_outside_window(&mut self) -> usize {
        let Some(g) = self.sliding.clone() else { return 0 };
        if self.positions.is_some() {
            return 0;
        }
        let w = g.window();
        let sec = self.pool.section_bytes();
        let small = g.released_block_bytes(&self.pool);
        let points = self.kept_points();
        let mut freed = 0;
        for bi in 0..self.blocks.len() {
            if (bi + 1) * BLOCK_TOKENS + w + RESUME_SLACK > self.len {
                break;
            }
            let b = &self.blocks[bi];
            // A resume point `p` reads positions `p - w .. p`.
            if b.released.is_some() || !g.releases(bi, self.len, &points) {
                continue;
            }
            if self.pool.try_charge(small).is_err() {
                break;
            }
            let mut bytes = LineBytes::zeroed(small);
            let src = b.bytes();
            for l in (0..g.num_layers()).filter(|&l| !g.is_sliding(l)) {
                let (from, to) = (2 * l * sec, 2 * g.held_index(l).expect("a global layer") * sec);
                bytes[to..to + 2 * sec].copy_from_slice(&src[from..from + 2 * sec]);
            }
            let before = b.held_bytes();
            let len = b.len;
            self.blocks[bi] = Arc::new(self.pool.charged_released_block(bytes, len, &g));
            freed += before - small;
        }
        freed
    }

    /// The longest prefix of the first `n` tokens (`<= len`) a request can resume from:
    /// `n` itself unless some of the sliding-layer rows of the window before it were released,
    /// else the latest earlier point whose window is whole (a resume point, or 0). What a
    /// request that diverges at `n` reuses; it recomputes from there.
    pub fn resumable(&self, n: usize) -> usize {
        let mut m = n.min(self.len);
        // Walk back: each released block overlapping the window before `m` moves `m` to its start.
        for (bi, b) in self.blocks[..m.div_ceil(BLOCK_TOKENS)].iter().enumerate().rev() {
            let Some(g) = b.released.as_ref() else { continue };
            let (start, end) = (bi * BLOCK_TOKENS, (bi + 1) * BLOCK_TOKENS);
            if start < m && end + g.window() > m {
                m = start;
            }
        }
        m
    }

    /// Blocks whose sliding layers are released.
    pub fn num_released_blocks(&self) -> usize {
        self.blocks.iter().filter(|b| b.released.is_some()).count()
    }

    /// `Err(Released)` when some of `slots` lie in a released block (their sliding rows are gone).
    pub(crate) fn check_held(&self, slots: std::ops::Range<usize>) -> Result<(), KvError> {
        if slots.is_empty() {
            return Ok(());
        }
        let (b0, b1) = (slots.start / BLOCK_TOKENS, (slots.end - 1) / BLOCK_TOKENS);
        match (b0..=b1).find(|&bi| self.blocks[bi].released.is_some()) {
            Some(bi) => Err(KvError::Released { slot: (bi * BLOCK_TOKENS).max(slots.start) }),
            None => Ok(()),
        }
    }
}
