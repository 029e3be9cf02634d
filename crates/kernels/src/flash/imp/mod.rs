//! The tile path on x86-64 (AMX-BF16): [`Flash`], its state and the chunk-by-chunk attention
//! (scores, online softmax, value products). The packers (`pack`), the grouped bf16 path
//! (`grouped`) and the vector helpers (`vector`) have files of their own.

use super::{KeyVisibility, Precision, Rows, CHUNK};
use std::arch::asm;
use std::arch::x86_64::*;

mod grouped;
mod pack;
mod vector;

use grouped::{Queued, GROUP, LAZY_MAX};
use vector::*;

/// One 64-byte, 64-aligned tile row.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

const ZERO: Line = Line([0; 64]);
/// Lines per tile (every tile here is 16 rows × 64 bytes).
const T: usize = 16;

pub(super) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        // AMX-BF16 is CPUID.(7,0):EDX[22]; the tile permission is shared with the INT8 path.
        #[allow(unused_unsafe)]
        let l7 = unsafe { __cpuid_count(7, 0) };
        l7.edx & (1 << 22) != 0
            && crate::simd::Isa::Amx.is_available()
            // A path forced below AMX (`ENGRAM_SIMD`) turns the AMX flash attention off too.
            && crate::simd::Isa::detect() == crate::simd::Isa::Amx
            && is_x86_feature_detected!("avx512bf16")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512dq")
    })
}

/// Online-softmax attention state for any number of query rows (padded to a multiple of 16)
/// of one KV head. Create with [`Flash::new`], feed chunks in position order with
/// [`Flash::add_chunk`], read the result with [`Flash::finish`].
pub struct Flash {
    /// [`Precision::Exact`]: hi and lo tiles; else hi tiles only, scores in log2 units.
    exact: bool,
    /// Bf16 with `head_dim <= 64`: chunks are queued [`GROUP`] at a time and each row block
    /// runs over the whole group with its accumulators held in tiles (see `attend_group`).
    grouped: bool,
    queued: Vec<Queued>,
    /// Scratch of `attend_group`: the (row block, queued chunk) pairs to run, in order.
    items: Vec<(usize, usize)>,
    /// Lines of `k` and `v` per chunk slot.
    k_lines: usize,
    /// Lines per key or value tile pair in `k` and `v`: hi then lo tile (exact), or the hi
    /// tile alone, so a bf16 chunk's tiles lie contiguous and spread over every L1 set.
    pair: usize,
    v_lines: usize,
    hd: usize,
    rows: usize,
    blocks: usize,
    /// Dim halves of 32 for the score product (head dims padded with zeros).
    halves: usize,
    /// Position of every row, per block of 16 (padding rows: `u32::MAX`; they multiply zero
    /// queries and are never read back).
    qpos: Vec<[u32; 16]>,
    /// Queries, per block and half: hi tile then lo tile (VNNI `B` layout).
    q: Vec<Line>,
    m: Vec<f32>,
    l: Vec<f32>,
    /// `Oᵀ` accumulators, per block: `hd` lines of 16 f32 (one per row).
    acc: Vec<f32>,
    /// Keys, per key half (2) and dim half: hi tile then lo tile.
    k: Vec<Line>,
    /// Values transposed, per 16-dim block: hi tile then lo tile.
    v: Vec<Line>,
    /// Scratch, two slots each (of 2 tiles): `Sᵀ` (keys 0–15, 16–31), `Pᵀ` (hi + lo at
    /// exact, hi alone at bf16); `Vᵀ` in f32.
    s: Vec<Line>,
    p: Vec<Line>,
    vt: Vec<f32>,
    /// Lines queued by [`Flash::prefetch`] (address, count), issued a few per row block.
    prefetch: std::collections::VecDeque<(usize, usize)>,
}

impl Flash {
    /// `q` holds `rows` query rows of `head_dim` values (already scaled by `1/√head_dim`);
    /// row `r` sits at position `pos0 + r / rows_per_pos` and sees keys at positions up to
    /// its own. Panics unless [`super::supported`]`(head_dim)`.
    pub fn new(q: &[f32], rows: usize, head_dim: usize, pos0: usize, rows_per_pos: usize) -> Flash {
        Flash::with_precision(q, rows, head_dim, pos0, rows_per_pos, Precision::Exact)
    }

    /// [`Flash::new`] at the given [`Precision`].
    pub fn with_precision(q: &[f32], rows: usize, head_dim: usize, pos0: usize, rows_per_pos: usize, precision: Precision) -> Flash {
        let positions: Vec<u32> = (0..rows).map(|r| (pos0 + r / rows_per_pos) as u32).collect();
        Flash::with_positions(q, head_dim, &positions, precision)
    }

    /// Query rows at arbitrary positions: row `r` (of `positions.len()`) sits at
    /// `positions[r]` and sees keys at positions up to its own (and as [`KeyVisibility`]
    /// allows). Positions need not be contiguous or ordered (a tree of drafts). Panics unless
    /// [`super::supported`]`(head_dim)`, or if a position is `u32::MAX` (reserved for padding).
    pub fn with_positions(q: &[f32], head_dim: usize, positions: &[u32], precision: Precision) -> Flash {
        let rows = positions.len();
        assert!(positions.iter().all(|&p| p != u32::MAX), "query position u32::MAX is reserved");
        let exact = precision == Precision::Exact;
        // Bf16 works in log2 units (`2^x` is cheaper than `e^x`): scores are `log2(e)·q·k`.
        let qscale = if exact { 1.0 } else { std::f32::consts::LOG2_E };
        assert!(super::supported(head_dim), "flash attention needs AMX-BF16 and head_dim % 16 == 0");
        assert_eq!(q.len(), rows * head_dim);
        let hd = head_dim;
        let blocks = rows.div_ceil(16);
        let halves = hd.div_ceil(32);
        let mut qp = vec![ZERO; blocks * halves * 2 * T];
        let mut qpos = vec![[u32::MAX; 16]; blocks];
        for (r, &p) in positions.iter().enumerate() {
            qpos[r / 16][r % 16] = p;
        }
        // SAFETY: `supported` checked AVX-512 (F, BW, VL, BF16); `pack_queries` reads `rows`
        // rows of `hd` values of `q` (length asserted above) and writes within `qp`.
        unsafe { pack::pack_queries(q, rows, hd, qscale, &mut qp) };
        let grouped = !exact && hd <= 64;
        let slots = if grouped { GROUP } else { 1 };
        let pair = if exact { 2 * T } else { T };
        let (k_lines, v_lines) = (2 * halves * pair, hd / 16 * pair);
        Flash {
            exact,
            grouped,
            queued: Vec::with_capacity(GROUP),
            items: Vec::new(),
            k_lines,
            pair,
            v_lines,
            hd,
            rows,
            blocks,
            halves,
            qpos,
            q: qp,
            m: vec![f32::NEG_INFINITY; blocks * 16],
            l: vec![0.0; blocks * 16],
            acc: vec![0.0; blocks * hd * 16],
            k: vec![ZERO; slots * k_lines],
            v: vec![ZERO; slots * v_lines],
            s: vec![ZERO; 4 * T],
            p: vec![ZERO; 4 * T],
            vt: vec![0.0; hd * CHUNK],
            prefetch: std::collections::VecDeque::new(),
        }
    }

    /// Attends every row to `n <= CHUNK` tokens at positions `key_pos0 ..`: `keys` and
    /// `values` are `[n, head_dim]` f32; `mask[i] == false` hides token `i`; a token after a
    /// row's own position is hidden from that row (causal). Chunks must come in position
    /// order for the online softmax to be exact, as in the reference.
    pub fn add_chunk(&mut self, keys: &[f32], values: &[f32], n: usize, key_pos0: usize, mask: Option<&[bool]>) {
        self.add_rows(Rows::F32(keys), Rows::F32(values), n, key_pos0, mask);
    }

    /// [`Flash::add_chunk`] for rows as the KV store holds them ([`Rows`]), packed into tiles
    /// straight from the stored format: bitwise the same result as `add_chunk` on their f32
    /// values. Panics if a slice holds fewer than `n` rows.
    pub fn add_rows(&mut self, keys: Rows<'_>, values: Rows<'_>, n: usize, key_pos0: usize, mask: Option<&[bool]>) {
        self.add_visible(keys, values, n, &KeyVisibility { pos0: key_pos0, mask, ..KeyVisibility::default() });
    }

    /// [`Flash::add_rows`] for keys at the positions and with the per-row visibility `vis`
    /// gives (moved spans, trees of drafts). Chunks with explicit positions or row masks are
    /// attended at once, never grouped (each row's arithmetic is the chunk-by-chunk path's).
    /// Panics if a slice holds fewer than `n` rows, or a visibility slice fewer entries than
    /// its doc names.
    pub fn add_visible(&mut self, keys: Rows<'_>, values: Rows<'_>, n: usize, vis: &KeyVisibility<'_>) {
        assert!(n <= CHUNK && keys.holds(n, self.hd) && values.holds(n, self.hd), "add_rows: short or unsupported rows");
        assert!(
            vis.positions.is_none_or(|p| p.len() >= n) && vis.mask.is_none_or(|m| m.len() >= n),
            "add_visible: short positions or mask"
        );
        assert!(vis.row_mask.is_none_or(|m| m.len() >= self.blocks * CHUNK), "add_visible: short row mask");
        if n == 0 {
            return;
        }
        let (key_pos0, mask) = (vis.pos0, vis.mask);
        let simple = vis.positions.is_none() && vis.row_mask.is_none();
        // SAFETY: `new` checked `supported` (AMX-BF16 + AVX-512 BF16/BW and the tile
        // permission); `holds` checked that the packers' reads of `n` rows are in bounds.
        unsafe {
            if self.exact {
                self.pack_chunk::<true>(keys, values, n, 0);
                self.attend_packed::<true>(n, vis);
            } else if !simple {
                // Not grouped: the queue is attended first (chunks stay in order), then this
                // chunk alone in slot 0.
                if !self.queued.is_empty() {
                    self.attend_group();
                }
                self.pack_chunk::<false>(keys, values, n, 0);
                self.attend_packed::<false>(n, vis);
            } else {
                // Grouped: queued in the next slot, attended when the group is full (or
                // at `finish`); else in slot 0, at once.
                let slot = if self.grouped { self.queued.len() } else { 0 };
                self.pack_chunk::<false>(keys, values, n, slot);
                if self.grouped {
                    let mut m = [true; CHUNK];
                    if let Some(mask) = mask {
                        m[..n].copy_from_slice(&mask[..n]);
                    }
                    self.queued.push(Queued { n, key_pos0, mask: mask.map(|_| m) });
                    if self.queued.len() == GROUP {
                        self.attend_group();
                    }
                } else {
                    self.attend_packed::<false>(n, vis);
                }
            }
        }
    }

    /// Queues `bytes` (a later chunk's stored rows) to be prefetched into L2 while the next
    /// chunks are attended: a few lines per row block, not all at once — a burst of a chunk's
    /// 128 prefetches fills the core's queue of outstanding misses and stalls it. A hint only:
    /// the bytes are never read here, and no result depends on it.
    pub fn prefetch(&mut self, bytes: &[u8]) {
        let lines = bytes.len().div_ceil(64);
        if lines > 0 {
            self.prefetch.push_back((bytes.as_ptr() as usize, lines));
        }
    }

    /// How many queued lines to issue per row block so the queue drains over `steps` of them.
    fn prefetch_share(&self, steps: usize) -> usize {
        self.prefetch.iter().map(|&(_, lines)| lines).sum::<usize>().div_ceil(steps.max(1))
    }

    /// Issues up to `lines` queued prefetches (into L2).
    #[inline]
    fn issue_prefetches(&mut self, mut lines: usize) {
        while lines > 0 {
            let Some((addr, count)) = self.prefetch.front_mut() else { return };
            let n = lines.min(*count);
            for i in 0..n {
                // SAFETY: prefetching never faults (not even on an address unmapped since it
                // was queued) and changes no memory.
                unsafe { _mm_prefetch::<_MM_HINT_T1>((*addr + 64 * i) as *const i8) };
            }
            *addr += 64 * n;
            *count -= n;
            lines -= n;
            if *count == 0 {
                self.prefetch.pop_front();
            }
        }
    }

    /// Runs every row block over the packed chunk (`self.k`, `self.v`). `EXACT`: see
    /// [`Flash::exact`]; the const parameters below mean the same.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512dq")]
    unsafe fn attend_packed<const EXACT: bool>(&mut self, n: usize, vis: &KeyVisibility<'_>) {
        configure();
        let (lo, hi) = vis.span(n);
        // Keys at named positions or a per-row mask: the softmax's general instance; else
        // the one for contiguous keys (no per-key position or row-mask work at all).
        let general = vis.positions.is_some() || vis.row_mask.is_some();
        let share = self.prefetch_share(self.blocks);
        // Exact, or bf16 with head dims over 64 (the grouped path takes the rest): the next
        // block's scores are issued before this block's softmax, into the other scratch slot
        // (and at bf16 on tiles apart: scores 0-3, values 4-7), so the tile unit has work
        // queued while the vectors run.
        let mut next = (0..self.blocks).find(|&b| self.sees(b, lo));
        let mut slot = 0;
        if let Some(b) = next {
            self.scores::<EXACT>(b, slot);
        }
        while let Some(b) = next {
            self.issue_prefetches(share);
            next = (b + 1..self.blocks).find(|&b| self.sees(b, lo));
            if let Some(nb) = next {
                self.scores::<EXACT>(nb, 1 - slot);
            }
            let c = self.causal(b, hi);
            if general {
                self.softmax::<EXACT, false, true>(b, slot, n, vis, c);
            } else {
                self.softmax::<EXACT, false, false>(b, slot, n, vis, c);
            }
            self.accumulate::<EXACT>(b, slot);
            slot = 1 - slot;
        }
    }

    /// Whether any row of block `b` sees a chunk whose lowest key position is `lo`. Rows whose
    /// position precedes the whole chunk see none of it: skipping them leaves their state
    /// bitwise as an all-masked update would.
    fn sees(&self, b: usize, lo: usize) -> bool {
        !self.qpos[b].iter().all(|&p| p == u32::MAX || (p as usize) < lo)
    }

    /// Whether a chunk whose highest key position is `hi` has a key after some row of block
    /// `b`, so the softmax must hide keys from that row (causal).
    fn causal(&self, b: usize, hi: usize) -> bool {
        self.qpos[b].iter().any(|&p| (p as usize) < hi)
    }

    /// Attends any chunks still queued, then writes the normalised outputs, `[rows,
    /// head_dim]`. A row that saw no token gets zeros.
    pub fn finish(&mut self, out: &mut [f32]) {
        if !self.queued.is_empty() {
            // SAFETY: as in `add_rows` (only chunks packed there are queued).
            unsafe { self.attend_group() };
        }
        self.prefetch.clear();
        let hd = self.hd;
        assert_eq!(out.len(), self.rows * hd);
        for r in 0..self.rows {
            let (b, n) = (r / 16, r % 16);
            let l = self.l[r];
            let inv = if l > 0.0 { 1.0 / l } else { 0.0 };
            for d in 0..hd {
                out[r * hd + d] = self.acc[(b * hd + d) * 16 + n] * inv;
            }
        }
    }

    /// `Sᵀ` of block `b` into `self.s` (2 tiles: keys 0–15, 16–31).
    #[target_feature(enable = "avx512f")]
    unsafe fn scores<const EXACT: bool>(&mut self, b: usize, slot: usize) {
        let stride = 64usize;
        asm!("tilezero tmm0", "tilezero tmm1", options(nostack, nomem));
        for h in 0..self.halves {
            let q = self.q.as_ptr().add((b * self.halves + h) * 2 * T);
            let k0 = self.k.as_ptr().add(h * self.pair);
            let k1 = self.k.as_ptr().add((self.halves + h) * self.pair);
            if !EXACT {
                // Tiles 0-3 only: [`Self::accumulate`] keeps to 4-7 at this precision.
                asm!(
                    "tileloadd tmm2, [{qh} + {s}*1]",
                    "tileloadd tmm3, [{k0h} + {s}*1]",
                    "tdpbf16ps tmm0, tmm3, tmm2",
                    "tileloadd tmm3, [{k1h} + {s}*1]",
                    "tdpbf16ps tmm1, tmm3, tmm2",
                    qh = in(reg) q,
                    k0h = in(reg) k0,
                    k1h = in(reg) k1,
                    s = in(reg) stride,
                    options(nostack, readonly),
                );
                continue;
            }
            asm!(
                "tileloadd tmm2, [{qh} + {s}*1]",
                "tileloadd tmm3, [{ql} + {s}*1]",
                "tileloadd tmm4, [{k0h} + {s}*1]",
                "tileloadd tmm5, [{k0l} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm2",
                "tdpbf16ps tmm0, tmm4, tmm3",
                "tdpbf16ps tmm0, tmm5, tmm2",
                "tileloadd tmm6, [{k1h} + {s}*1]",
                "tileloadd tmm7, [{k1l} + {s}*1]",
                "tdpbf16ps tmm1, tmm6, tmm2",
                "tdpbf16ps tmm1, tmm6, tmm3",
                "tdpbf16ps tmm1, tmm7, tmm2",
                qh = in(reg) q,
                ql = in(reg) q.add(T),
                k0h = in(reg) k0,
                k0l = in(reg) k0.add(T),
                k1h = in(reg) k1,
                k1l = in(reg) k1.add(T),
                s = in(reg) stride,
                options(nostack, readonly),
            );
        }
        self.store_scores(slot);
    }

    /// Stores the score tiles (0: keys 0–15, 1: keys 16–31) into scratch `slot`.
    #[target_feature(enable = "avx512f")]
    unsafe fn store_scores(&mut self, slot: usize) {
        let s = self.s.as_mut_ptr().add(slot * 2 * T);
        asm!(
            "tilestored [{s0} + {st}*1], tmm0",
            "tilestored [{s1} + {st}*1], tmm1",
            s0 = in(reg) s,
            s1 = in(reg) s.add(T),
            st = in(reg) 64usize,
            options(nostack),
        );
    }

    /// Online softmax of block `b` over the scores in `self.s`: masks, updates `m` and `l`,
    /// rescales the block's accumulators by `e^(m_old - m_new)` where a maximum moved, and
    /// leaves `Pᵀ` (hi, lo) for [`Self::accumulate`]. `LAZY` (the grouped path): a row's
    /// maximum moves only past [`LAZY_MAX`], and the accumulators are the ones held in
    /// tiles ([`Self::rescale_tiles`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512dq")]
    unsafe fn softmax<const EXACT: bool, const LAZY: bool, const GENERAL: bool>(
        &mut self,
        b: usize,
        slot: usize,
        n: usize,
        vis: &KeyVisibility<'_>,
        causal: bool,
    ) {
        let mask = vis.mask;
        let row_mask = if GENERAL { vis.row_mask.map(|m| &m[b * CHUNK..(b + 1) * CHUNK]) } else { None };
        let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
        let s = self.s.as_mut_ptr().add(slot * 2 * T) as *mut f32;
        let qpos = _mm512_loadu_si512(self.qpos[b].as_ptr() as *const _);
        // Every key visible to every row (a full chunk of history, the common case): no score
        // is -inf, so nothing is rewritten and `exp` needs no guard for it.
        let all_visible = n == CHUNK && mask.is_none() && !causal && row_mask.is_none();
        if LAZY && all_visible {
            // The maxima as they stand, without looking for the chunk's own: if no row's sum
            // reaches 2^LAZY_MAX, no score passed its row's maximum by LAZY_MAX, so none
            // would move, and these are the probabilities and sums the full path below
            // computes (bitwise: it also leaves `corr` = 1 and `l` = l + sum for such rows).
            let m_old = _mm512_loadu_ps(self.m.as_ptr().add(b * 16));
            if _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m_old, ninf) == 0 {
                let sum = self.probabilities_bf16::<false>(slot, m_old);
                if _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(sum, _mm512_set1_ps(LAZY_MAX.exp2())) == 0 {
                    let l = self.l.as_mut_ptr().add(b * 16);
                    _mm512_storeu_ps(l, _mm512_add_ps(_mm512_loadu_ps(l), sum));
                    return;
                }
            }
        }
        // Four running maxima, combined at the end: one chain of 32 dependent `vmaxps` would
        // hold every `exp` below back by its latency (max is exact, so the order is free).
        let mut mx = [ninf; 4];
        for i in 0..CHUNK {
            let row = s.add(i * 16);
            let mut x = _mm512_load_ps(row);
            if !all_visible {
                let hidden = i >= n || mask.is_some_and(|m| !m[i]);
                if hidden {
                    x = ninf;
                } else if !GENERAL {
                    if causal {
                        // Visible to a row iff key position <= row position (unsigned compare).
                        let kp = _mm512_set1_epi32((vis.pos0 + i) as i32);
                        let seen = _mm512_cmple_epu32_mask(kp, qpos);
                        x = _mm512_mask_blend_ps(seen, ninf, x);
                    }
                } else {
                    let mut seen: __mmask16 = row_mask.map_or(0xffff, |m| m[i]);
                    if causal {
                        let kp = _mm512_set1_epi32(vis.position(i) as i32);
                        seen &= _mm512_cmple_epu32_mask(kp, qpos);
                    }
                    if seen != 0xffff {
                        x = _mm512_mask_blend_ps(seen, ninf, x);
                    }
                }
                _mm512_store_ps(row, x);
            }
            mx[i % 4] = _mm512_max_ps(mx[i % 4], x);
        }
        let mx = _mm512_max_ps(_mm512_max_ps(mx[0], mx[1]), _mm512_max_ps(mx[2], mx[3]));
        let m_old = _mm512_loadu_ps(self.m.as_ptr().add(b * 16));
        let m_new = if LAZY {
            // -inf + LAZY_MAX is -inf: a row's first visible score always moves it.
            let moving = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(mx, _mm512_add_ps(m_old, _mm512_set1_ps(LAZY_MAX)));
            _mm512_mask_blend_ps(moving, m_old, _mm512_max_ps(m_old, mx))
        } else {
            _mm512_max_ps(m_old, mx)
        };
        // A row that has seen nothing yet keeps m = -inf; subtract 0 instead so exp gives 0.
        let m_safe = _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_EQ_OQ>(m_new, ninf), m_new, _mm512_setzero_ps());
        let corr = if EXACT { exp16::<true>(_mm512_sub_ps(m_old, m_safe)) } else { exp2_16::<true>(_mm512_sub_ps(m_old, m_safe)) };
        let sum =
            if all_visible { self.probabilities::<EXACT, false>(slot, m_safe) } else { self.probabilities::<EXACT, true>(slot, m_safe) };
        let l_old = _mm512_loadu_ps(self.l.as_ptr().add(b * 16));
        _mm512_storeu_ps(self.l.as_mut_ptr().add(b * 16), _mm512_fmadd_ps(l_old, corr, sum));
        _mm512_storeu_ps(self.m.as_mut_ptr().add(b * 16), m_new);
        // Rescale the block's accumulators only when some row's maximum moved (rare once a
        // row has seen a few hundred keys); multiplying the other rows by exactly 1.0 would
        // leave them unchanged, so a row's arithmetic still does not depend on its neighbours.
        let moved = _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(corr, _mm512_set1_ps(1.0));
        if LAZY {
            // A row with l = 0 has accumulated only zeros: scaling it changes nothing.
            if moved & _mm512_cmp_ps_mask::<_CMP_NEQ_UQ>(l_old, _mm512_setzero_ps()) != 0 {
                self.rescale_tiles(b, corr);
            }
        } else if moved != 0 {
            self.scale_acc(b, corr);
        }
    }

    /// Multiplies block `b`'s accumulators in memory by `corr` per row.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn scale_acc(&mut self, b: usize, corr: __m512) {
        let acc = self.acc.as_mut_ptr().add(b * self.hd * 16);
        for d in 0..self.hd {
            let a = acc.add(d * 16);
            _mm512_storeu_ps(a, _mm512_mul_ps(_mm512_loadu_ps(a), corr));
        }
    }

    /// `Pᵀ = e^(Sᵀ - m)` (hi, lo) into `self.p` from the scores in `self.s`; returns the
    /// per-row sums. `GUARD`: some scores may be -inf (see [`exp16`]). Not `EXACT`: `2^(Sᵀ - m)`
    /// into the hi tile only.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512dq")]
    unsafe fn probabilities<const EXACT: bool, const GUARD: bool>(&mut self, slot: usize, m_safe: __m512) -> __m512 {
        if !EXACT {
            return self.probabilities_bf16::<GUARD>(slot, m_safe);
        }
        let s = self.s.as_ptr().add(slot * 2 * T) as *const f32;
        let p = self.p.as_mut_ptr().add(slot * 2 * T);
        let (ph, pl) = (p as *mut __m512i, p.add(T) as *mut __m512i);
        let mut sum = _mm512_setzero_ps();
        for j in 0..CHUNK / 2 {
            // Line j of `Pᵀ` pairs keys j and j + 16 (see the module doc).
            let pa = exp16::<GUARD>(_mm512_sub_ps(_mm512_load_ps(s.add(j * 16)), m_safe));
            let pb = exp16::<GUARD>(_mm512_sub_ps(_mm512_load_ps(s.add((j + 16) * 16)), m_safe));
            sum = _mm512_add_ps(sum, pa);
            sum = _mm512_add_ps(sum, pb);
            let (hi, lo) = split_interleaved(pa, pb);
            _mm512_store_si512(ph.add(j), hi);
            _mm512_store_si512(pl.add(j), lo);
        }
        sum
    }

    /// [`Self::probabilities`] at [`Precision::Bf16`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512dq")]
    unsafe fn probabilities_bf16<const GUARD: bool>(&mut self, slot: usize, m_safe: __m512) -> __m512 {
        let s = self.s.as_ptr().add(slot * 2 * T) as *const f32;
        let ph = self.p.as_mut_ptr().add(slot * 2 * T) as *mut __m512i;
        // Row sums of the rounded probabilities, as the tile unit weighs the values: one
        // `vdpbf16ps` by (1, 1) per line, over two chains.
        let ones = std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(0x3F80_3F80));
        let line = |j: usize| {
            let pa = exp2_16::<GUARD>(_mm512_sub_ps(_mm512_load_ps(s.add(j * 16)), m_safe));
            let pb = exp2_16::<GUARD>(_mm512_sub_ps(_mm512_load_ps(s.add((j + 16) * 16)), m_safe));
            let line = bf16_interleaved(pa, pb);
            _mm512_store_si512(ph.add(j), line);
            std::mem::transmute::<__m512i, __m512bh>(line)
        };
        let (mut s0, mut s1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for j in (0..CHUNK / 2).step_by(2) {
            s0 = _mm512_dpbf16_ps(s0, line(j), ones);
            s1 = _mm512_dpbf16_ps(s1, line(j + 1), ones);
        }
        _mm512_add_ps(s0, s1)
    }

    /// `Oᵀ += Vᵀ · Pᵀ` for block `b`, accumulated by the tile unit straight into the block's
    /// accumulators (loaded as the product tiles, stored back), four 16-dim blocks per pass.
    #[target_feature(enable = "avx512f")]
    unsafe fn accumulate<const EXACT: bool>(&mut self, b: usize, slot: usize) {
        let stride = 64usize;
        let dbs = self.hd / 16;
        let p = self.p.as_ptr().add(slot * 2 * T);
        if !EXACT {
            asm!("tileloadd tmm4, [{ph} + {s}*1]", ph = in(reg) p, s = in(reg) stride, options(nostack, readonly));
            let acc = self.acc.as_mut_ptr().add(b * self.hd * 16);
            // Tiles 4-7 only (scores keep to 0-3): accumulators alternate between tmm5 and
            // tmm6 so one dim block's store overlaps the next one's load and product.
            macro_rules! dims {
                ($db:expr, $acc:literal) => {
                    asm!(
                        concat!("tileloadd ", $acc, ", [{a} + {s}*1]"),
                        "tileloadd tmm7, [{vh} + {s}*1]",
                        concat!("tdpbf16ps ", $acc, ", tmm7, tmm4"),
                        concat!("tilestored [{a} + {s}*1], ", $acc),
                        a = in(reg) acc.add($db * 16 * 16),
                        vh = in(reg) self.v.as_ptr().add($db * self.pair),
                        s = in(reg) stride,
                        options(nostack),
                    )
                };
            }
            for db in 0..dbs {
                if db % 2 == 0 {
                    dims!(db, "tmm5");
                } else {
                    dims!(db, "tmm6");
                }
            }
            return;
        }
        asm!(
            "tileloadd tmm4, [{ph} + {s}*1]",
            "tileloadd tmm5, [{pl} + {s}*1]",
            ph = in(reg) p,
            pl = in(reg) p.add(T),
            s = in(reg) stride,
            options(nostack, readonly),
        );
        let acc = self.acc.as_mut_ptr().add(b * self.hd * 16);
        for db in 0..dbs {
            let v = self.v.as_ptr().add(db * self.pair);
            asm!(
                "tileloadd tmm0, [{a} + {s}*1]",
                "tileloadd tmm6, [{vh} + {s}*1]",
                "tileloadd tmm7, [{vl} + {s}*1]",
                "tdpbf16ps tmm0, tmm6, tmm4",
                "tdpbf16ps tmm0, tmm6, tmm5",
                "tdpbf16ps tmm0, tmm7, tmm4",
                "tilestored [{a} + {s}*1], tmm0",
                a = in(reg) acc.add(db * 16 * 16),
                vh = in(reg) v,
                vl = in(reg) v.add(T),
                s = in(reg) stride,
                options(nostack),
            );
        }
    }
}

/// Loads the one tile configuration this module uses: all eight tiles 16 rows × 64 bytes.
#[target_feature(enable = "avx512f")]
unsafe fn configure() {
    let mut cfg = ZERO;
    cfg.0[0] = 1; // palette 1
    for t in 0..8 {
        cfg.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
        cfg.0[48 + t] = 16;
    }
    asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
}
