//! The grouped bf16 path (head dims up to 64): chunks queued [`GROUP`] at a time, each row
//! block run over all of them with its output accumulators held in tiles 2–5.

use std::arch::asm;
use std::arch::x86_64::*;

use super::{configure, Flash, KeyVisibility, CHUNK, T};

/// Chunks per group in the grouped bf16 path: 8 × 8 KB of packed keys and values, which the
/// row blocks then share from L1.
pub(super) const GROUP: usize = 8;

/// The grouped path moves a row's maximum only when a score exceeds it by more than this
/// (log2 units): probabilities up to 2^8, exact in f32 sums, and accumulators in tiles
/// rescaled rarely (each rescale is a round trip through memory).
pub(super) const LAZY_MAX: f32 = 8.0;

/// A chunk packed and waiting in its slot for [`Flash::attend_group`].
pub(super) struct Queued {
    pub(super) n: usize,
    pub(super) key_pos0: usize,
    pub(super) mask: Option<[bool; CHUNK]>,
}

impl Flash {
    /// The grouped bf16 path over the queued chunks: each row block that sees any of them
    /// loads its accumulators into tiles 2–5 once, runs every chunk (scores into tiles 0–1
    /// from 6–7, the lazy softmax, value products from 6–7), and stores them once — instead
    /// of a load and a store of every accumulator per block and chunk. As in
    /// [`Self::attend_packed`], the next item's scores are issued before this one's softmax.
    /// Per row, the same operations in the same order as chunk by chunk, so the grouping
    /// (and which rows share a tile) never changes a result.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512dq")]
    pub(super) unsafe fn attend_group(&mut self) {
        configure();
        let queued = std::mem::take(&mut self.queued);
        let mut items = std::mem::take(&mut self.items);
        items.clear();
        for b in 0..self.blocks {
            for (c, q) in queued.iter().enumerate() {
                if self.sees(b, q.key_pos0) {
                    items.push((b, c));
                }
            }
        }
        // Per item `i`: the value products of item `i - 1` (its `Pᵀ` long stored), the scores
        // of item `i + 1`, then the softmax of item `i` — so the tile unit always has work
        // queued that does not wait for the softmax running on the vector units.
        let share = self.prefetch_share(items.len());
        let mut held = None;
        if let Some(&(b, c)) = items.first() {
            self.group_scores(b, c, 0);
        }
        for i in 0..items.len() {
            let (b, c) = items[i];
            let slot = i % 2;
            self.issue_prefetches(share);
            if i > 0 {
                self.group_values(items[i - 1].1, 1 - slot);
            }
            if held != Some(b) {
                if let Some(pb) = held {
                    self.acc_tiles::<true>(pb);
                }
                self.acc_tiles::<false>(b);
                held = Some(b);
            }
            if let Some(&(nb, nc)) = items.get(i + 1) {
                self.group_scores(nb, nc, 1 - slot);
            }
            let q = &queued[c];
            let causal = self.causal(b, q.key_pos0 + q.n - 1);
            let vis = KeyVisibility { pos0: q.key_pos0, mask: q.mask.as_ref().map(|m| &m[..]), ..KeyVisibility::default() };
            self.softmax::<false, true, false>(b, slot, q.n, &vis, causal);
        }
        if let Some(&(_, c)) = items.last() {
            self.group_values(c, (items.len() - 1) % 2);
        }
        if let Some(pb) = held {
            self.acc_tiles::<true>(pb);
        }
        self.items = items;
        self.queued = queued;
        self.queued.clear();
    }

    /// Block `b`'s accumulators ↔ tiles 2–5 (dim block `db` in tile `2 + db`): `STORE`
    /// writes them back, else loads them.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn acc_tiles<const STORE: bool>(&mut self, b: usize) {
        let acc = self.acc.as_mut_ptr().add(b * self.hd * 16);
        let (dbs, stride) = (self.hd / 16, 64usize);
        macro_rules! tile {
            ($db:literal, $t:literal) => {
                if $db < dbs {
                    let a = acc.add($db * 16 * 16);
                    if STORE {
                        asm!(concat!("tilestored [{a} + {s}*1], ", $t), a = in(reg) a, s = in(reg) stride, options(nostack));
                    } else {
                        asm!(concat!("tileloadd ", $t, ", [{a} + {s}*1]"), a = in(reg) a, s = in(reg) stride, options(nostack, readonly));
                    }
                }
            };
        }
        tile!(0, "tmm2");
        tile!(1, "tmm3");
        tile!(2, "tmm4");
        tile!(3, "tmm5");
    }

    /// Multiplies the held accumulators (tiles 2–5) of block `b` by `corr` per row, through
    /// memory.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn rescale_tiles(&mut self, b: usize, corr: __m512) {
        self.acc_tiles::<true>(b);
        self.scale_acc(b, corr);
        self.acc_tiles::<false>(b);
    }

    /// `Sᵀ` of block `b` against queued chunk `c` into scratch `slot`: tiles 0–1 from 6–7.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn group_scores(&mut self, b: usize, c: usize, slot: usize) {
        let stride = 64usize;
        asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
        let k = self.k.as_ptr().add(c * self.k_lines);
        for h in 0..self.halves {
            asm!(
                "tileloadd tmm6, [{q} + {s}*1]",
                "tileloadd tmm7, [{k0} + {s}*1]",
                "tdpbf16ps tmm0, tmm7, tmm6",
                "tileloadd tmm7, [{k1} + {s}*1]",
                "tdpbf16ps tmm1, tmm7, tmm6",
                q = in(reg) self.q.as_ptr().add((b * self.halves + h) * 2 * T),
                k0 = in(reg) k.add(h * self.pair),
                k1 = in(reg) k.add((self.halves + h) * self.pair),
                s = in(reg) stride,
                options(nostack, readonly),
            );
        }
        self.store_scores(slot);
    }

    /// `Oᵀ += Vᵀ · Pᵀ` into the held accumulators: `Pᵀ` of scratch `slot` in tile 6, queued
    /// chunk `c`'s values through tile 7.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn group_values(&mut self, c: usize, slot: usize) {
        let stride = 64usize;
        asm!("tileloadd tmm6, [{p} + {s}*1]", p = in(reg) self.p.as_ptr().add(slot * 2 * T), s = in(reg) stride, options(nostack, readonly));
        let v = self.v.as_ptr().add(c * self.v_lines);
        let dbs = self.hd / 16;
        macro_rules! dims {
            ($db:literal, $t:literal) => {
                if $db < dbs {
                    asm!(
                        "tileloadd tmm7, [{v} + {s}*1]",
                        concat!("tdpbf16ps ", $t, ", tmm7, tmm6"),
                        v = in(reg) v.add($db * self.pair),
                        s = in(reg) stride,
                        options(nostack, readonly),
                    );
                }
            };
        }
        dims!(0, "tmm2");
        dims!(1, "tmm3");
        dims!(2, "tmm4");
        dims!(3, "tmm5");
    }
}
