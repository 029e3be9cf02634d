//! Dual-head regions (DynaKV paper §5): the file layout where two clusters share
//! one region back to back, one growing forward from the region's start, the other backward
//! from its end, with slack between them. A cluster's new members (flushed when they leave the
//! recent window) are written into its own head's slack, next to its older rows, so a fetch
//! of the cluster stays one contiguous read; appends and splits move no data already written
//! (a split's new half keeps its rows where they are and gets a home of its own at its next
//! flush; a cluster whose region is full gets a new region at the file's end, its old rows
//! stay). Regions are whole 4 KiB pages of rows and start page-aligned, so each region's
//! writes stay within its own pages.
//!
//! Invariant: a row is written at most once, in a region's slack or past the file's end; two
//! clusters never share a row; [`Regions::place`] either plans every token of a flush or the
//! caller discards the plan (a failed write changes nothing recorded).

use std::collections::HashMap;

/// The file layout of an offloaded cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Clusters back to back, new tokens flushed in position-ordered blocks at the end.
    Append,
    /// Dual-head regions with slack (module doc).
    DualHead,
}

impl Layout {
    /// `append` or `dualhead`.
    pub fn name(&self) -> &'static str {
        match self {
            Layout::Append => "append",
            Layout::DualHead => "dualhead",
        }
    }
}

/// Marks a slack row in a row plan.
pub(crate) const SLACK: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Region {
    start: u64,
    len: u64,
    /// Rows used by the forward head (from `start`) and the backward head (from the end).
    fwd: u64,
    bwd: u64,
    /// The backward head has no cluster yet.
    bwd_free: bool,
}

/// The regions of one (layer, KV head) (module doc).
#[derive(Clone, Debug, Default)]
pub(crate) struct Regions {
    regions: Vec<Region>,
    /// Cluster → (region, grows backward).
    home: HashMap<u32, (usize, bool)>,
    /// Rows a region gets besides its clusters' (page rows at least, a quarter more).
    page_rows: u64,
}

/// What one flush writes for a head: member rows into slack (first row, tokens in row
/// order), and a block past the file's end (tokens in row order, [`SLACK`] for slack rows).
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub in_place: Vec<(u64, Vec<u32>)>,
    pub tail: Vec<u32>,
}

impl Regions {
    /// Lays out `clusters` (in file order) from row `first` (page-aligned): pairs back to
    /// back, each pair one region; returns the regions and the tokens by row ([`SLACK`]:
    /// slack).
    pub fn lay_out(clusters: &[(u32, Vec<u32>)], first: u64, page_rows: usize) -> (Regions, Vec<u32>) {
        let mut r = Regions { page_rows: page_rows.max(1) as u64, ..Regions::default() };
        let mut rows = Vec::new();
        for pair in clusters.chunks(2) {
            let (a, b) = (&pair[0], pair.get(1));
            r.new_region(first + rows.len() as u64, (a.0, &a.1), b.map(|b| (b.0, &b.1[..])), &mut rows);
        }
        (r, rows)
    }

    /// Appends to `rows` a new region at row `at` holding `a` forward and `b` backward.
    fn new_region(&mut self, at: u64, a: (u32, &[u32]), b: Option<(u32, &[u32])>, rows: &mut Vec<u32>) {
        let used = (a.1.len() + b.map_or(0, |b| b.1.len())) as u64;
        let len = (used + (used / 4).max(self.page_rows)).div_ceil(self.page_rows) * self.page_rows;
        let kb = b.map_or(0, |b| b.1.len()) as u64;
        rows.extend_from_slice(a.1);
        rows.extend(std::iter::repeat_n(SLACK, (len - used) as usize));
        if let Some(b) = b {
            rows.extend(b.1.iter().rev());
        }
        let i = self.regions.len();
        self.regions.push(Region { start: at, len, fwd: a.1.len() as u64, bwd: kb, bwd_free: b.is_none() });
        self.home.insert(a.0, (i, false));
        if let Some(b) = b {
            self.home.insert(b.0, (i, true));
        }
    }

    /// Plans one flush: `groups` (cluster, its flushed tokens) go into their home's slack
    /// where it has room, else into a new region (pairs of homeless clusters, or the free
    /// backward head of the last region made); `loose` tokens (in no cluster) go to the
    /// block at the end as they are. `end` is the file's row count.
    pub fn place(&mut self, groups: Vec<(u32, Vec<u32>)>, loose: Vec<u32>, end: u64) -> Plan {
        let mut plan = Plan::default();
        let mut homeless = Vec::new();
        for (c, ts) in groups {
            let k = ts.len() as u64;
            match self.home.get(&c).copied() {
                Some((i, back)) if self.regions[i].len - self.regions[i].fwd - self.regions[i].bwd >= k => {
                    let r = &mut self.regions[i];
                    if back {
                        r.bwd += k;
                        plan.in_place.push((r.start + r.len - r.bwd, ts.into_iter().rev().collect()));
                    } else {
                        plan.in_place.push((r.start + r.fwd, ts));
                        r.fwd += k;
                    }
                }
                _ => homeless.push((c, ts)),
            }
        }
        let mut homeless = homeless.into_iter();
        while let Some(a) = homeless.next() {
            // The free backward head of the last region made, if it has room.
            if let Some(i) = self.regions.len().checked_sub(1).filter(|&i| {
                let r = &self.regions[i];
                r.bwd_free && r.len - r.fwd >= a.1.len() as u64
            }) {
                let r = &mut self.regions[i];
                r.bwd_free = false;
                r.bwd = a.1.len() as u64;
                plan.in_place.push((r.start + r.len - r.bwd, a.1.into_iter().rev().collect()));
                self.home.insert(a.0, (i, true));
                continue;
            }
            let b = homeless.next();
            let at = end + plan.tail.len() as u64;
            self.new_region(at, (a.0, &a.1), b.as_ref().map(|b| (b.0, &b.1[..])), &mut plan.tail);
        }
        plan.tail.extend(loose);
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_grow_toward_each_other_then_move_to_a_new_region() {
        let clusters = vec![(0, vec![10, 11, 12]), (1, vec![20, 21]), (2, vec![30])];
        let (mut r, rows) = Regions::lay_out(&clusters, 0, 4);
        // Pair (0, 1): 5 rows + 4 slack = 9 → 12 (whole pages); cluster 2 alone: 1 + 4 → 8.
        assert_eq!(rows.len(), 20);
        assert_eq!(&rows[..3], &[10, 11, 12]);
        assert_eq!(&rows[10..12], &[21, 20]);
        assert_eq!(&rows[12..13], &[30]);
        assert!(rows[3..10].iter().chain(&rows[13..]).all(|&t| t == SLACK));
        let plan = r.place(vec![(0, vec![13, 14]), (1, vec![22])], vec![], 20);
        assert_eq!(plan.in_place, vec![(3, vec![13, 14]), (9, vec![22])]);
        assert!(plan.tail.is_empty());
        // Region 0 has 4 rows of slack left: 5 more tokens of cluster 0 take the free
        // backward head of region 1 (cluster 2's); cluster 3 (a split's new half) gets a new
        // region at the end; loose tokens follow it. Nothing written moves.
        let plan = r.place(vec![(0, (40..45).collect()), (3, vec![50])], vec![60], 20);
        assert_eq!(plan.in_place, vec![(15, vec![44, 43, 42, 41, 40])]);
        assert_eq!(plan.tail.len(), 9);
        assert_eq!((plan.tail[0], plan.tail[8]), (50, 60));
        assert!(plan.tail[1..8].iter().all(|&t| t == SLACK));
        // Cluster 0 now grows in region 1's backward head.
        let plan = r.place(vec![(0, vec![70])], vec![], 29);
        assert_eq!(plan.in_place, vec![(14, vec![70])]);
    }
}
