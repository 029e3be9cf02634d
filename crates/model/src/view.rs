//! What attention asks a cache for, and which keys each query row may see.
//!
//! A sequence's *view* of the KV is whatever its [`crate::KvCache`] yields: an ordered list
//! of chunks, each with its own logical positions (not necessarily contiguous with the
//! chunk before, not necessarily the order the keys were written in), possibly a different
//! subset per KV head ([`KvRead::kv_head`]). Keys in the view are numbered in the order the
//! cache yields them (a chunk's [`crate::KvChunk::key_index`] is its first key's number);
//! a [`KeyMask`] addresses keys by that number.
//!
//! Invariant (the view contract): a query row at position `p` attends exactly to the keys
//! the view yields for its KV head whose position is `<= p`, whose chunk mask is set, and
//! whose bit in the step's [`KeyMask`] row (if any) is set, and, in a sliding layer of window
//! `W`, whose position is `> p - W` — whatever order the chunks come in and however they
//! are split.

/// What one attention task reads: one layer, one KV head, the task's queries.
///
/// A cache may use the queries to choose what to yield (per-head cluster selection, seed
/// 002); it must yield the same keys for the same request, and it never sees the result.
#[derive(Clone, Copy, Debug)]
pub struct KvRead<'a> {
    pub layer: usize,
    pub kv_head: usize,
    /// `[query tokens × group, head_dim]`, rotated and scaled by the model's attention scale
    /// (`1/√head_dim` unless the model says otherwise): row
    /// `t * group + j` is query token `t`'s `j`-th head of this KV head's group.
    pub queries: &'a [f32],
    /// Query heads per KV head.
    pub group: usize,
    /// Logical position of each query token.
    pub positions: &'a [u32],
}

/// Per query token of a step, the keys of its sequence's view it may see: one bit per key
/// (numbered as in the module doc), a row of bits per query token. Keys past [`KeyMask::keys`]
/// are visible (a mask speaks for the keys it was made for; later keys are the caller's to
/// add). A tree of drafts costs one bit per (draft, key).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyMask {
    rows: usize,
    keys: usize,
    words: usize,
    bits: Vec<u64>,
}

impl KeyMask {
    /// `rows` query tokens that see all of `keys` keys.
    pub fn all(rows: usize, keys: usize) -> KeyMask {
        let words = keys.div_ceil(64);
        KeyMask { rows, keys, words, bits: vec![u64::MAX; rows * words] }
    }

    /// `rows` query tokens that see none of `keys` keys.
    pub fn none(rows: usize, keys: usize) -> KeyMask {
        let words = keys.div_ceil(64);
        KeyMask { rows, keys, words, bits: vec![0; rows * words] }
    }

    /// Query tokens (rows).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Keys the mask covers.
    pub fn keys(&self) -> usize {
        self.keys
    }

    /// Lets `row` see `key` (`on`) or hides it. Panics outside `rows × keys`.
    pub fn set(&mut self, row: usize, key: usize, on: bool) {
        assert!(row < self.rows && key < self.keys, "KeyMask::set({row}, {key}) outside {} x {}", self.rows, self.keys);
        let w = &mut self.bits[row * self.words + key / 64];
        if on {
            *w |= 1 << (key % 64);
        } else {
            *w &= !(1 << (key % 64));
        }
    }

    /// Sets `keys` (a range) for `row` to `on`.
    pub fn set_range(&mut self, row: usize, keys: std::ops::Range<usize>, on: bool) {
        for k in keys {
            self.set(row, k, on);
        }
    }

    /// Whether `row` may see `key` (keys past [`KeyMask::keys`] are visible).
    #[inline]
    pub fn sees(&self, row: usize, key: usize) -> bool {
        key >= self.keys || self.bits[row * self.words + key / 64] >> (key % 64) & 1 == 1
    }

    /// The mask of a step of `n` tokens stored from slot `first` on, hiding the slots of
    /// `hidden` (segments kept in a cache but left out of every view) from every row outside
    /// the range; a row inside one still sees it. Slot `s` is key `key_offset + s`; keys past
    /// the step's last are not covered (visible). `None` when no row has anything hidden.
    pub fn hiding(hidden: &[std::ops::Range<usize>], key_offset: usize, first: usize, n: usize) -> Option<KeyMask> {
        let end = first + n;
        let mut mask = KeyMask::all(n, key_offset + end);
        let mut any = false;
        for r in hidden.iter().filter(|r| r.start < end) {
            let r = r.start..r.end.min(end);
            for row in 0..n {
                if !r.contains(&(first + row)) {
                    any = true;
                    mask.set_range(row, key_offset + r.start..key_offset + r.end, false);
                }
            }
        }
        any.then_some(mask)
    }
}

#[cfg(test)]
mod tests {
    use super::KeyMask;

    #[test]
    fn hidden_slots_are_masked_only_for_rows_outside_their_range() {
        // One key before the slots; slots 2..4 hidden; a step of three rows at slots 3..6.
        let m = KeyMask::hiding(&[2..4], 1, 3, 3).expect("rows 1 and 2 have keys hidden");
        // Row 0 is slot 3, inside the range: it sees the range's keys (offset 1).
        assert!(m.sees(0, 3) && m.sees(0, 4));
        // Rows 1 and 2 (slots 4, 5) do not; every other key stays visible.
        assert!(!m.sees(1, 3) && !m.sees(1, 4) && !m.sees(2, 3) && !m.sees(2, 4));
        assert!(m.sees(1, 0) && m.sees(1, 2) && m.sees(2, 5) && m.sees(2, 6));
        // A range wholly after the step hides nothing: no mask.
        assert!(KeyMask::hiding(&[7..9], 0, 3, 3).is_none());
    }
}
