//! Attention on AMX-BF16 tiles: the online-softmax ("flash") accumulation of one group of query
//! rows over a sequence of key/value chunks of up to [`CHUNK`] tokens.
//!
//! Layout (transposed, so that every softmax step is a vertical vector op over 16 query rows):
//! * scores `Sᵀ[key][row] = K · Qᵀ`: `A` = the chunk's keys (16 keys × 32 dims per tile, as
//!   stored), `B` = the queries in the VNNI layout (packed once in [`Flash::new`]);
//! * output `Oᵀ[dim][row] += Vᵀ · Pᵀ`: `A` = the chunk's values transposed (16 dims × 32 keys),
//!   `B` = the probabilities, interleaved in key pairs straight from the softmax registers. The
//!   tile unit sums pairs of the reduction dimension together; here pair `j` is keys `j` and
//!   `j + 16` (not `2j`, `2j + 1`), so that f16 values can be paired by interleaving two rows
//!   ([`Flash::add_rows`] with [`Rows::F16`]) instead of transposing them word by word.
//!
//! Precision: bf16 keeps 8 significant bits, so every operand is split as `x = hi + lo` (both
//! bf16, round-to-nearest) and each product is `hi·hi + hi·lo + lo·hi`, accumulated in f32 by
//! the tile unit. An f16 key or value splits exactly; an f32 query or probability keeps ~16
//! bits; the dropped `lo·lo` term is below 2⁻¹⁶ of `|x||y|`. Scores and outputs agree with the
//! f32 reference to about 1e-5 relative (`engram-model`'s attention tests compare the two
//! paths), at several times its speed.
//!
//! [`Precision::Bf16`] (opt-in) drops the `lo` halves: one product per tile pair, operands
//! rounded to bf16 (8 significant bits) and accumulated in f32 — the precision of GPU
//! flash attention, where `P` is bf16 — with a cheaper `2^x` (relative error < 1e-4, below the
//! bf16 rounding of `P`). 4–8e-3 of the f32 reference at the output (tests), a mean KL of
//! ~5e-6 nats on a trained model (`engram bench kv-quality`). With head dims up to 64 it is
//! grouped: chunks are queued eight at a time and each row block runs over all of them
//! with its accumulators held in tiles (`attend_group`); outputs are complete after
//! [`Flash::finish`].
//!
//! Invariant: every operation on one query row's scores, running max, sum and output
//! accumulator depends only on that row's query, its position and the chunks it sees — never
//! on the other rows sharing the tile — so a row's result is bitwise the same whether it is
//! computed alone (decode) or with any number of other rows (prefill).

/// Keys per chunk that one [`Flash::add_chunk`] call accepts (the K depth of one `Pᵀ` tile).
pub const CHUNK: usize = 32;

/// Whether the tile path runs on this machine for `head_dim`: AMX-BF16 tiles (with the OS
/// granting tile state), AVX-512 BF16/BW/DQ, and a head dimension that is a multiple of 16 up to 256.
pub fn supported(head_dim: usize) -> bool {
    head_dim % 16 == 0 && head_dim > 0 && head_dim <= 256 && imp::available()
}

pub use imp::Flash;

/// How exactly the tile path multiplies; chosen per model load, part of its fingerprint (a cache
/// computed one way is a miss for the other).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    /// Every operand split into two bf16 halves (three products): ~1e-5 of the f32 reference.
    #[default]
    Exact,
    /// Operands rounded to bf16, one product, f32 accumulation: ~5e-3 of the reference at the
    /// output, about twice as fast at long context.
    Bf16,
}

impl Precision {
    /// The name the CLI and fingerprints use: `exact` or `bf16`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::Exact => "exact",
            Precision::Bf16 => "bf16",
        }
    }
}

impl std::str::FromStr for Precision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exact" => Ok(Precision::Exact),
            "bf16" => Ok(Precision::Bf16),
            _ => Err(format!("unknown attention precision {s:?} (expected exact or bf16)")),
        }
    }
}

/// A chunk's keys or values as one KV head stores them: `n` rows of `head_dim` values, in one
/// of the KV formats. The tiles are packed straight from these rows (no f32 copy of the chunk).
#[derive(Clone, Copy, Debug)]
pub enum Rows<'a> {
    /// `[n * head_dim]` floats.
    F32(&'a [f32]),
    /// `[n * head_dim]` little-endian IEEE half floats.
    F16(&'a [u8]),
    /// ggml Q8_0 blocks of 32 (`head_dim % 32 == 0`): per block an f16 scale and 32 `i8`.
    Q8_0(&'a [u8]),
    /// ggml Q4_0 blocks of 32 (`head_dim % 32 == 0`): per block an f16 scale and 16 bytes of
    /// nibbles (byte `j`: value `j` low, value `j + 16` high, both offset by 8).
    Q4_0(&'a [u8]),
}

impl Rows<'_> {
    /// Whether the slice holds at least `n` rows of `head_dim` values (and the format can).
    fn holds(&self, n: usize, head_dim: usize) -> bool {
        match *self {
            Rows::F32(x) => x.len() >= n * head_dim,
            Rows::F16(x) => x.len() >= n * head_dim * 2,
            Rows::Q8_0(x) => head_dim % 32 == 0 && x.len() >= n * head_dim / 32 * 34,
            Rows::Q4_0(x) => head_dim % 32 == 0 && x.len() >= n * head_dim / 32 * 18,
        }
    }
}

/// Hints the CPU to bring `bytes` into L2 (one prefetch per 64-byte line); no effect on
/// results, a no-op where there is no prefetch instruction.
#[inline]
pub fn prefetch_l2(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in bytes.chunks(64) {
        // SAFETY: prefetching never faults and does not change memory; SSE is baseline on x86-64.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T1 }>(line.as_ptr() as *const i8) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

#[cfg(target_arch = "x86_64")]
mod imp {
    use super::{Precision, Rows, CHUNK};
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// One 64-byte, 64-aligned tile row.
    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Line([u8; 64]);

    const ZERO: Line = Line([0; 64]);
    /// Chunks per group in the grouped bf16 path: 8 × 8 KB of packed keys and values, which the
    /// row blocks then share from L1.
    const GROUP: usize = 8;
    /// The grouped path moves a row's maximum only when a score exceeds it by more than this
    /// (log2 units): probabilities up to 2^8, exact in f32 sums, and accumulators in tiles
    /// rescaled rarely (each rescale is a round trip through memory).
    const LAZY_MAX: f32 = 8.0;

    /// A chunk packed and waiting in its slot for [`Flash::attend_group`].
    struct Queued {
        n: usize,
        key_pos0: usize,
        mask: Option<[bool; CHUNK]>,
    }
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
        /// Scratch, two slots each (of 2 tiles): `Sᵀ`, `Pᵀ` (hi + lo, or two blocks' hi); `Vᵀ`
        /// in f32.
        s: Vec<Line>,
        p: Vec<Line>,
        vt: Vec<f32>,
    }

    /// `x = hi + lo`, both bf16 rounded to nearest even (as the hardware's `vcvtneps2bf16`).
    fn split(x: f32) -> (u16, u16) {
        let hi = half::bf16::from_f32(x);
        (hi.to_bits(), half::bf16::from_f32(x - hi.to_f32()).to_bits())
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
            for r in 0..rows {
                let (b, n) = (r / 16, r % 16);
                qpos[b][n] = (pos0 + r / rows_per_pos) as u32;
                for d in 0..hd {
                    let (hi, lo) = split(q[r * hd + d] * qscale);
                    let (h, j, e) = (d / 32, (d % 32) / 2, d % 2);
                    let base = (b * halves + h) * 2 * T;
                    let at = n * 4 + e * 2;
                    qp[base + j].0[at..at + 2].copy_from_slice(&hi.to_le_bytes());
                    qp[base + T + j].0[at..at + 2].copy_from_slice(&lo.to_le_bytes());
                }
            }
            let grouped = !exact && hd <= 64;
            let slots = if grouped { GROUP } else { 1 };
            let (k_lines, v_lines) = (2 * halves * 2 * T, hd / 16 * 2 * T);
            Flash {
                exact,
                grouped,
                queued: Vec::with_capacity(GROUP),
                items: Vec::new(),
                k_lines,
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
            assert!(n <= CHUNK && keys.holds(n, self.hd) && values.holds(n, self.hd), "add_rows: short or unsupported rows");
            if n == 0 {
                return;
            }
            // SAFETY: `new` checked `supported` (AMX-BF16 + AVX-512 BF16/BW and the tile
            // permission); `holds` checked that the packers' reads of `n` rows are in bounds.
            unsafe {
                if self.exact {
                    self.pack_keys::<true>(keys, n, 0);
                    match values {
                        Rows::F16(v) => self.pack_values_f16::<true>(v, n, 0),
                        _ => self.pack_values::<true>(values, n, 0),
                    }
                    self.attend_packed::<true>(n, key_pos0, mask);
                } else {
                    // Grouped: queued in the next slot, attended when the group is full (or
                    // at `finish`); else in slot 0, at once.
                    let slot = if self.grouped { self.queued.len() } else { 0 };
                    self.pack_keys::<false>(keys, n, slot);
                    match values {
                        Rows::F16(v) => self.pack_values_f16::<false>(v, n, slot),
                        _ => self.pack_values::<false>(values, n, slot),
                    }
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
                        self.attend_packed::<false>(n, key_pos0, mask);
                    }
                }
            }
        }

        /// Runs every row block over the packed chunk (`self.k`, `self.v`). `EXACT`: see
        /// [`Flash::exact`]; the const parameters below mean the same.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512dq")]
        unsafe fn attend_packed<const EXACT: bool>(&mut self, n: usize, key_pos0: usize, mask: Option<&[bool]>) {
            configure();
            let last_key = (key_pos0 + n - 1) as u32;
            // Rows whose position precedes the whole chunk see none of it: skipping them leaves
            // their state bitwise as an all-masked update would.
            let sees = |qpos: &[u32; 16]| !qpos.iter().all(|&p| p == u32::MAX || (p as usize) < key_pos0);
            let causal = |qpos: &[u32; 16]| qpos.iter().any(|&p| p < last_key);
            if EXACT {
                for b in 0..self.blocks {
                    if !sees(&self.qpos[b]) {
                        continue;
                    }
                    let c = causal(&self.qpos[b]);
                    self.scores::<EXACT>(b, 0);
                    self.softmax::<EXACT, false>(b, 0, n, key_pos0, c, mask);
                    self.accumulate::<EXACT>(b, 0);
                }
                return;
            }
            // Bf16 with head dims over 64 (the grouped path takes the rest): the next block's
            // scores are issued before this block's softmax, on tiles apart (scores 0-3, values
            // 4-7) and scratch slots apart, so the tile unit works while the vectors do.
            let mut next = (0..self.blocks).find(|&b| sees(&self.qpos[b]));
            let mut slot = 0;
            if let Some(b) = next {
                self.scores::<EXACT>(b, slot);
            }
            while let Some(b) = next {
                next = (b + 1..self.blocks).find(|&b| sees(&self.qpos[b]));
                if let Some(nb) = next {
                    self.scores::<EXACT>(nb, 1 - slot);
                }
                let c = causal(&self.qpos[b]);
                self.softmax::<EXACT, false>(b, slot, n, key_pos0, c, mask);
                self.accumulate::<EXACT>(b, slot);
                slot = 1 - slot;
            }
        }

        /// Attends any chunks still queued, then writes the normalised outputs, `[rows,
        /// head_dim]`. A row that saw no token gets zeros.
        pub fn finish(&mut self, out: &mut [f32]) {
            if !self.queued.is_empty() {
                // SAFETY: as in `add_rows` (only chunks packed there are queued).
                unsafe { self.attend_group() };
            }
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

        /// Keys as `A` tiles: line `i` of (key half `kh`, dim half `h`) = key `16·kh + i`'s
        /// dims `32h .. 32h + 32`, split into hi and lo tiles; missing keys and dims are zero.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c")]
        unsafe fn pack_keys<const EXACT: bool>(&mut self, keys: Rows<'_>, n: usize, slot: usize) {
            let (hd, halves) = (self.hd, self.halves);
            let kp = self.k.as_mut_ptr().add(slot * self.k_lines);
            for key in 0..CHUNK {
                let (kh, i) = (key / 16, key % 16);
                for h in 0..halves {
                    let base = (kh * halves + h) * 2 * T;
                    let (a, b) = match keys {
                        _ if key >= n => (_mm512_setzero_ps(), _mm512_setzero_ps()),
                        // One 64-byte load per line.
                        Rows::F16(x) => halves_to_ps(load_halves((x.as_ptr() as *const u16).add(key * hd + h * 32), hd - h * 32)),
                        _ => (load16(keys, key, 2 * h, hd), load16(keys, key, 2 * h + 1, hd)),
                    };
                    store_bf16::<EXACT, false>(kp.add(base), i, a, b);
                }
            }
        }

        /// Values as `A` tiles of `Vᵀ`: line `r` of dim block `db` = dim `16·db + r` over the
        /// chunk's 32 keys (missing keys zero), split into hi and lo tiles, keys paired
        /// (`j`, `j + 16`).
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c")]
        unsafe fn pack_values<const EXACT: bool>(&mut self, values: Rows<'_>, n: usize, slot: usize) {
            let hd = self.hd;
            let vp = self.v.as_mut_ptr().add(slot * self.v_lines);
            let vt = &mut self.vt;
            for kb in 0..CHUNK / 16 {
                for db in 0..hd / 16 {
                    let mut r = [_mm512_setzero_ps(); 16];
                    for (i, row) in r.iter_mut().enumerate() {
                        let key = kb * 16 + i;
                        if key < n {
                            *row = load16(values, key, db, hd);
                        }
                    }
                    transpose16(&mut r);
                    for (i, row) in r.iter().enumerate() {
                        _mm512_storeu_ps(vt.as_mut_ptr().add((db * 16 + i) * CHUNK + kb * 16), *row);
                    }
                }
            }
            for d in 0..hd {
                let (db, r) = (d / 16, d % 16);
                // Word pairs (key j, key j + 16): the pairing the softmax writes `Pᵀ` in.
                let (x0, x1) = (_mm512_loadu_ps(vt.as_ptr().add(d * CHUNK)), _mm512_loadu_ps(vt.as_ptr().add(d * CHUNK + 16)));
                store_bf16::<EXACT, true>(vp.add(db * 2 * T), r, x0, x1);
            }
        }

        /// [`Self::pack_values`] from f16 rows, without a word-by-word transpose: rows `j` and
        /// `j + 16` are interleaved into dword pairs (one `vpunpck` per 16 dims), which a 16×16
        /// dword transpose turns into `Vᵀ` lines already in the (key j, key j + 16) pairing.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c")]
        unsafe fn pack_values_f16<const EXACT: bool>(&mut self, values: &[u8], n: usize, slot: usize) {
            let hd = self.hd;
            let vp = self.v.as_mut_ptr().add(slot * self.v_lines);
            let parts = self.halves;
            let src = values.as_ptr() as *const u16;
            let row = |key: usize, part: usize| {
                if key < n {
                    load_halves(src.add(key * hd + part * 32), hd - part * 32)
                } else {
                    _mm512_setzero_si512()
                }
            };
            // Pair vectors, per (part, low/high interleave): 16 dwords for 16 dims, one per j.
            let mut r = [_mm512_setzero_ps(); 16];
            for part in 0..parts {
                for upper in [false, true] {
                    for (j, rj) in r.iter_mut().enumerate() {
                        let (a, b) = (row(j, part), row(j + 16, part));
                        let w = if upper { _mm512_unpackhi_epi16(a, b) } else { _mm512_unpacklo_epi16(a, b) };
                        *rj = _mm512_castsi512_ps(w);
                    }
                    transpose16(&mut r);
                    // Line i of the transpose holds the dims that dword i of the pair vectors
                    // held: within each 128-bit lane L, words 0-3 (low) or 4-7 (high) of 8.
                    for (i, line) in r.iter().enumerate() {
                        let d = part * 32 + (i / 4) * 8 + usize::from(upper) * 4 + i % 4;
                        if d >= hd {
                            continue;
                        }
                        let (a, b) = halves_to_ps(_mm512_castps_si512(*line));
                        let (db, rr) = (d / 16, d % 16);
                        store_bf16::<EXACT, false>(vp.add(db * 2 * T), rr, a, b);
                    }
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
                let k0 = self.k.as_ptr().add(h * 2 * T);
                let k1 = self.k.as_ptr().add((self.halves + h) * 2 * T);
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

        /// The grouped bf16 path over the queued chunks: each row block that sees any of them
        /// loads its accumulators into tiles 2–5 once, runs every chunk (scores into tiles 0–1
        /// from 6–7, the lazy softmax, value products from 6–7), and stores them once — instead
        /// of a load and a store of every accumulator per block and chunk. As in
        /// [`Self::attend_packed`], the next item's scores are issued before this one's softmax.
        /// Per row, the same operations in the same order as chunk by chunk, so the grouping
        /// (and which rows share a tile) never changes a result.
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512dq")]
        unsafe fn attend_group(&mut self) {
            configure();
            let queued = std::mem::take(&mut self.queued);
            let mut items = std::mem::take(&mut self.items);
            items.clear();
            for b in 0..self.blocks {
                for (c, q) in queued.iter().enumerate() {
                    // Rows whose position precedes the whole chunk see none of it (skipping
                    // leaves them bitwise as an all-masked update would).
                    if !self.qpos[b].iter().all(|&p| p == u32::MAX || (p as usize) < q.key_pos0) {
                        items.push((b, c));
                    }
                }
            }
            // Per item `i`: the value products of item `i - 1` (its `Pᵀ` long stored), the scores
            // of item `i + 1`, then the softmax of item `i` — so the tile unit always has work
            // queued that does not wait for the softmax running on the vector units.
            let mut held = None;
            if let Some(&(b, c)) = items.first() {
                self.group_scores(b, c, 0);
            }
            for i in 0..items.len() {
                let (b, c) = items[i];
                let slot = i % 2;
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
                let last_key = (q.key_pos0 + q.n - 1) as u32;
                let causal = self.qpos[b].iter().any(|&p| p < last_key);
                self.softmax::<false, true>(b, slot, q.n, q.key_pos0, causal, q.mask.as_ref().map(|m| &m[..]));
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
        unsafe fn acc_tiles<const STORE: bool>(&mut self, b: usize) {
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
        unsafe fn rescale_tiles(&mut self, b: usize, corr: __m512) {
            self.acc_tiles::<true>(b);
            let acc = self.acc.as_mut_ptr().add(b * self.hd * 16);
            for d in 0..self.hd {
                let a = acc.add(d * 16);
                _mm512_storeu_ps(a, _mm512_mul_ps(_mm512_loadu_ps(a), corr));
            }
            self.acc_tiles::<false>(b);
        }

        /// `Sᵀ` of block `b` against queued chunk `c` into scratch `slot`: tiles 0–1 from 6–7.
        #[target_feature(enable = "avx512f")]
        unsafe fn group_scores(&mut self, b: usize, c: usize, slot: usize) {
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
                    k0 = in(reg) k.add(h * 2 * T),
                    k1 = in(reg) k.add((self.halves + h) * 2 * T),
                    s = in(reg) stride,
                    options(nostack, readonly),
                );
            }
            self.store_scores(slot);
        }

        /// `Oᵀ += Vᵀ · Pᵀ` into the held accumulators: `Pᵀ` of scratch `slot` in tile 6, queued
        /// chunk `c`'s values through tile 7.
        #[target_feature(enable = "avx512f")]
        unsafe fn group_values(&mut self, c: usize, slot: usize) {
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
                            v = in(reg) v.add($db * 2 * T),
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

        /// Online softmax of block `b` over the scores in `self.s`: masks, updates `m` and `l`,
        /// rescales the block's accumulators by `e^(m_old - m_new)` where a maximum moved, and
        /// leaves `Pᵀ` (hi, lo) for [`Self::accumulate`]. `LAZY` (the grouped path): a row's
        /// maximum moves only past [`LAZY_MAX`], and the accumulators are the ones held in
        /// tiles ([`Self::rescale_tiles`]).
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,avx512dq")]
        unsafe fn softmax<const EXACT: bool, const LAZY: bool>(
            &mut self,
            b: usize,
            slot: usize,
            n: usize,
            key_pos0: usize,
            causal: bool,
            mask: Option<&[bool]>,
        ) {
            let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
            let s = self.s.as_mut_ptr().add(slot * 2 * T) as *mut f32;
            let qpos = _mm512_loadu_si512(self.qpos[b].as_ptr() as *const _);
            // Four running maxima, combined at the end: one chain of 32 dependent `vmaxps` would
            // hold every `exp` below back by its latency (max is exact, so the order is free).
            let mut mx = [ninf; 4];
            // Every key visible to every row (a full chunk of history, the common case): no score
            // is -inf, so nothing is rewritten and `exp` needs no guard for it.
            let all_visible = n == CHUNK && mask.is_none() && !causal;
            for i in 0..CHUNK {
                let row = s.add(i * 16);
                let mut x = _mm512_load_ps(row);
                if !all_visible {
                    let hidden = i >= n || mask.is_some_and(|m| !m[i]);
                    if hidden {
                        x = ninf;
                    } else if causal {
                        // Visible to a row iff key position <= row position (unsigned compare).
                        let kp = _mm512_set1_epi32((key_pos0 + i) as i32);
                        let vis = _mm512_cmple_epu32_mask(kp, qpos);
                        x = _mm512_mask_blend_ps(vis, ninf, x);
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
            let sum = if all_visible {
                self.probabilities::<EXACT, false>(slot, m_safe)
            } else {
                self.probabilities::<EXACT, true>(slot, m_safe)
            };
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
                let acc = self.acc.as_mut_ptr().add(b * self.hd * 16);
                for d in 0..self.hd {
                    let a = acc.add(d * 16);
                    _mm512_storeu_ps(a, _mm512_mul_ps(_mm512_loadu_ps(a), corr));
                }
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
            let (ph, pl) = (self.p.as_mut_ptr() as *mut __m512i, self.p.as_mut_ptr().add(T) as *mut __m512i);
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
            let mut sum = _mm512_setzero_ps();
            for j in 0..CHUNK / 2 {
                let pa = exp2_16::<GUARD>(_mm512_sub_ps(_mm512_load_ps(s.add(j * 16)), m_safe));
                let pb = exp2_16::<GUARD>(_mm512_sub_ps(_mm512_load_ps(s.add((j + 16) * 16)), m_safe));
                sum = _mm512_add_ps(sum, _mm512_add_ps(pa, pb));
                _mm512_store_si512(ph.add(j), bf16_interleaved(pa, pb));
            }
            sum
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
                            vh = in(reg) self.v.as_ptr().add($db * 2 * T),
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
                let v = self.v.as_ptr().add(db * 2 * T);
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

    /// Stores two 16-float vectors as line `r` of the bf16 tile at `tile`: words `a` then `b`,
    /// or with `INTERLEAVED` dword `j` = `[a[j], b[j]]`. `EXACT`: split into hi (this tile) and
    /// lo (the tile after it), else rounded once into this tile.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn store_bf16<const EXACT: bool, const INTERLEAVED: bool>(tile: *mut Line, r: usize, a: __m512, b: __m512) {
        if EXACT {
            let (hi, lo) = if INTERLEAVED { split_interleaved(a, b) } else { split_pair(a, b) };
            _mm512_store_si512(tile.add(r) as *mut __m512i, hi);
            _mm512_store_si512(tile.add(T + r) as *mut __m512i, lo);
        } else {
            let hi = if INTERLEAVED { bf16_interleaved(a, b) } else { bf16_pair(a, b) };
            _mm512_store_si512(tile.add(r) as *mut __m512i, hi);
        }
    }

    /// 32 halves (f16 bits) → two 16-float vectors (exact), word order kept.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn halves_to_ps(halves: __m512i) -> (__m512, __m512) {
        (_mm512_cvtph_ps(_mm512_castsi512_si256(halves)), _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(halves)))
    }

    /// Two 16-float vectors → one 32-word bf16 line, `a` then `b`, rounded to nearest even: the
    /// `hi` of [`split_pair`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn bf16_pair(a: __m512, b: __m512) -> __m512i {
        std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(b, a))
    }

    /// The `hi` line of [`split_interleaved`]: dword `r` is `[bf16(x0[r]), bf16(x1[r])]`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn bf16_interleaved(x0: __m512, x1: __m512) -> __m512i {
        let inter = _mm512_loadu_si512(INTERLEAVE_IDX.as_ptr() as *const _);
        _mm512_permutexvar_epi16(inter, std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(x1, x0)))
    }

    /// Two 16-float vectors → one (hi, lo) pair of 32-word bf16 lines, `a` then `b`: `hi` is
    /// `x` rounded to nearest even (as `vcvtneps2bf16`), `lo` the rest rounded the same way, so
    /// `x ≈ hi + lo` to ~16 bits (exactly for f16 values).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn split_pair(a: __m512, b: __m512) -> (__m512i, __m512i) {
        let hi = _mm512_cvtne2ps_pbh(b, a);
        let hi_bits = std::mem::transmute::<__m512bh, __m512i>(hi);
        let ha = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(hi_bits))));
        let hb = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64::<1>(hi_bits))));
        let lo = _mm512_cvtne2ps_pbh(_mm512_sub_ps(b, hb), _mm512_sub_ps(a, ha));
        (hi_bits, std::mem::transmute::<__m512bh, __m512i>(lo))
    }

    /// Two 16-float vectors → (hi, lo) bf16 lines whose dword `r` is `[x0[r], x1[r]]` (a `B` or
    /// `A` operand's pair layout), split into hi and lo as in [`split_pair`].
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    unsafe fn split_interleaved(x0: __m512, x1: __m512) -> (__m512i, __m512i) {
        let inter = _mm512_loadu_si512(INTERLEAVE_IDX.as_ptr() as *const _);
        // dword r = bf16(x1[r]) << 16 | bf16(x0[r]).
        let hi = _mm512_permutexvar_epi16(inter, std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(x1, x0)));
        let f0 = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(hi));
        let f1 = _mm512_castsi512_ps(_mm512_and_si512(hi, _mm512_set1_epi32(0xFFFF_0000u32 as i32)));
        let lo = _mm512_cvtne2ps_pbh(_mm512_sub_ps(x1, f1), _mm512_sub_ps(x0, f0));
        (hi, _mm512_permutexvar_epi16(inter, std::mem::transmute::<__m512bh, __m512i>(lo)))
    }

    /// Loads 32 halves from `src`, of which the first `avail` exist (the rest read as zero).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn load_halves(src: *const u16, avail: usize) -> __m512i {
        if avail >= 32 {
            _mm512_loadu_si512(src as *const _)
        } else {
            _mm512_maskz_loadu_epi16((1u32 << avail) - 1, src as *const i16)
        }
    }

    /// Dims `16·c .. 16·c + 16` of row `key` of `rows` as floats (dims past `hd` read as
    /// zero), exactly the values `dequantize_row` gives for the stored format.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn load16(rows: super::Rows<'_>, key: usize, c: usize, hd: usize) -> __m512 {
        use super::Rows;
        let d0 = 16 * c;
        if d0 >= hd {
            return _mm512_setzero_ps();
        }
        match rows {
            Rows::F32(x) => _mm512_loadu_ps(x.as_ptr().add(key * hd + d0)),
            Rows::F16(x) => _mm512_cvtph_ps(_mm256_loadu_si256(x.as_ptr().add((key * hd + d0) * 2) as *const __m256i)),
            Rows::Q8_0(x) => {
                let block = x.as_ptr().add((key * hd / 32 + c / 2) * 34);
                let d = _mm512_set1_ps(half::f16::from_bits(u16::from_le_bytes([*block, *block.add(1)])).to_f32());
                let q = _mm512_cvtepi8_epi32(_mm_loadu_si128(block.add(2 + 16 * (c % 2)) as *const __m128i));
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(q))
            }
            Rows::Q4_0(x) => {
                let block = x.as_ptr().add((key * hd / 32 + c / 2) * 18);
                let d = _mm512_set1_ps(half::f16::from_bits(u16::from_le_bytes([*block, *block.add(1)])).to_f32());
                let bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(block.add(2) as *const __m128i));
                let nib = if c % 2 == 0 { _mm512_and_si512(bytes, _mm512_set1_epi32(0xF)) } else { _mm512_srli_epi32::<4>(bytes) };
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(nib, _mm512_set1_epi32(8))))
            }
        }
    }

    /// Transposes a 16×16 f32 matrix held as 16 row vectors: four butterfly stages, each
    /// swapping the off-diagonal `s × s` sub-blocks (s = 8, 4, 2, 1) with two-source permutes.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn transpose16(r: &mut [__m512; 16]) {
        for (k, s) in [8usize, 4, 2, 1].into_iter().enumerate() {
            let lo = _mm512_loadu_si512(TRANSPOSE_IDX[k][0].as_ptr() as *const _);
            let hi = _mm512_loadu_si512(TRANSPOSE_IDX[k][1].as_ptr() as *const _);
            for i in 0..16 {
                if i & s == 0 {
                    let (a, b) = (r[i], r[i + s]);
                    r[i] = _mm512_permutex2var_ps(a, lo, b);
                    r[i + s] = _mm512_permutex2var_ps(a, hi, b);
                }
            }
        }
    }

    /// `permutex2var` indices of [`transpose16`]'s stages (s = 8, 4, 2, 1): for the upper row of
    /// a pair, lane `j` keeps its own element if `j & s == 0`, else takes the lower row's `j - s`;
    /// the lower row takes the upper's `j + s`, or keeps its own.
    static TRANSPOSE_IDX: [[[i32; 16]; 2]; 4] = transpose_idx();

    const fn transpose_idx() -> [[[i32; 16]; 2]; 4] {
        let mut t = [[[0i32; 16]; 2]; 4];
        let mut k = 0;
        while k < 4 {
            let s = 8 >> k;
            let mut j = 0;
            while j < 16 {
                if j & s == 0 {
                    t[k][0][j] = j as i32;
                    t[k][1][j] = (j + s) as i32;
                } else {
                    t[k][0][j] = (j - s) as i32 | 16;
                    t[k][1][j] = j as i32 | 16;
                }
                j += 1;
            }
            k += 1;
        }
        t
    }

    /// Word permutation taking `[a0..a15, b0..b15]` to `[a0, b0, a1, b1, ..]`.
    static INTERLEAVE_IDX: [i16; 32] = {
        let mut idx = [0i16; 32];
        let mut r = 0;
        while r < 16 {
            idx[2 * r] = r as i16;
            idx[2 * r + 1] = 16 + r as i16;
            r += 1;
        }
        idx
    };

    /// `e^x` on 16 lanes for softmax arguments (`x <= 0`): the same range reduction and degree-6
    /// polynomial as the model's scalar `exp_approx`, with `vscalefps` for `2^n`. `GUARD` maps
    /// `-inf` (and anything below -87) to exactly 0, as `exp_approx` does; without it the
    /// arguments must be finite, and those below -87 give at most a denormal, which adds nothing
    /// to a row sum of at least 1 and which the tile unit reads as zero — the same result bits.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn exp16<const GUARD: bool>(x: __m512) -> __m512 {
        let xc = if GUARD { _mm512_max_ps(x, _mm512_set1_ps(-87.0)) } else { x };
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
            xc,
            _mm512_set1_ps(std::f32::consts::LOG2_E),
        ));
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), xc);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm512_set1_ps(0.001_393_3);
        for c in [0.008_333_452f32, 0.041_666_51, 0.166_666_67, 0.5, 1.0, 1.0] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_scalef_ps(p, n);
        if GUARD {
            _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(-87.0)), y)
        } else {
            y
        }
    }

    /// `2^x` on 16 lanes for the bf16 softmax (`x <= 0`): `x - floor(x)` by `vreduceps`, a
    /// degree-3 polynomial on [0, 1) with `p(0) = 1` exactly (so an unmoved maximum rescales by
    /// exactly 1), relative error < 9e-5, and `vscalefps` for `2^floor(x)`. `GUARD` as in
    /// [`exp16`] (below -126: exactly 0).
    #[inline]
    #[target_feature(enable = "avx512f,avx512dq")]
    unsafe fn exp2_16<const GUARD: bool>(x: __m512) -> __m512 {
        let xc = if GUARD { _mm512_max_ps(x, _mm512_set1_ps(-126.0)) } else { x };
        let f = _mm512_reduce_ps::<{ _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC }>(xc);
        let mut p = _mm512_set1_ps(0.077_067_085);
        for c in [0.227_644_95f32, 0.695_116_8, 1.0] {
            p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
        }
        let y = _mm512_scalef_ps(p, xc);
        if GUARD {
            _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(-126.0)), y)
        } else {
            y
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod imp {
    pub(super) fn available() -> bool {
        false
    }

    /// Not available on this architecture ([`super::supported`] is always false).
    pub struct Flash(());

    impl Flash {
        pub fn new(_q: &[f32], _rows: usize, _head_dim: usize, _pos0: usize, _rows_per_pos: usize) -> Flash {
            panic!("flash attention needs x86-64 AMX-BF16")
        }
        pub fn with_precision(_q: &[f32], _r: usize, _hd: usize, _p: usize, _g: usize, _x: super::Precision) -> Flash {
            panic!("flash attention needs x86-64 AMX-BF16")
        }
        pub fn add_chunk(&mut self, _k: &[f32], _v: &[f32], _n: usize, _key_pos0: usize, _mask: Option<&[bool]>) {}
        pub fn add_rows(&mut self, _k: super::Rows<'_>, _v: super::Rows<'_>, _n: usize, _key_pos0: usize, _mask: Option<&[bool]>) {}
        pub fn finish(&mut self, _out: &mut [f32]) {}
    }
}
