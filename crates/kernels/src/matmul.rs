//! [`matmul`]: dispatch, tiling and threading of `out[t][r] = Σ_k x[t][k] · W[r][k]`.
//!
//! Strategy:
//! * The path for each weight format is `dispatch::kernel_path` (the CPU's best, or what its
//!   measured table row names for that format); the `_with` entry points take one explicitly.
//! * Activations are prepared once per call (quantized to Q8_0 / Q8_K blocks for the integer
//!   kernels, see `quantize.rs` for why), in parallel for large batches.
//! * Work is split over *output rows* into chunks run on [`crate::pool`]; every weight row is
//!   therefore read from memory once per call regardless of `n_tokens`. A chunk's weights are
//!   kept ≲ 256 KiB (`dispatch::chunk_kib`: F16 / BF16 on a CPU whose table row says so, more) so
//!   they stay in L2 while the chunk sweeps all tokens. With one thread (or too little work
//!   to share) the chunks run in turn on the calling thread, the same way.
//! * Inside a chunk: for each group of ≤ 4 tokens (their activations stay in L1), for each group
//!   of ≤ 4 rows, one register-tiled kernel call (`simd::run_tile`), decoding each weight block
//!   once per group and reusing it for all tokens in the group. `n_tokens = 1` is the same code
//!   with a 1-token tile (GEMV), so it streams weights at memory bandwidth.
//! * Exception, `Isa::Amx` with Q4_0/Q8_0: chunks are multiples of 16 rows and go whole to
//!   `simd::amx::run_rows`, which repacks the chunk's weights once into AMX tile layout (from
//!   the matrix's packing when it has one) and sweeps 16-token groups over it (or, for ≤ 3
//!   tokens of an unpacked matrix, runs a VNNI kernel on the weights in place). A packed matrix's
//!   calls below `dispatch::amx_token_min` tokens run the AVX-512 packed kernels instead (the
//!   same bits: both are the scalar reference's); the AMX path's other formats are the AVX-512
//!   path's (`Isa::for_format`).
//! * Exception, `Isa::Avx2` or `Isa::Avx512` ([`Isa::runs_packed`]) with a [`crate::Packed`]
//!   matrix (Q4_0/Q8_0/Q4_1/IQ4_NL/Q4_K/Q6_K repacked at load; Q5_0/Q5_1/MXFP4/IQ4_XS/Q2_K/Q5_K/Q3_K
//!   on AVX2, Q5_K/Q3_K where the dispatch table says, and on AVX-512 where the table's row
//!   names them, `dispatch::packs`; on AVX2 IQ4_XS / Q2_K / Q5_K calls of ≥ 64 tokens take the
//!   panel below, from the packing): chunks are multiples of 8 rows and go whole to `simd::avx2_packed::run_rows` (8 rows × ≤ 4 tokens
//!   per call) or, on `Isa::Avx512` with 2 or more tokens of a format `simd::avx512_packed::takes`,
//!   to `simd::avx512_packed::run_rows` (VNNI, 8 rows × ≤ 16 tokens (K-quants ≤ 8) per
//!   call, the weights unpacked once per call for all of them; one-token calls stay on the AVX2
//!   kernels, which stream from DRAM faster on Zen 4, unless the CPU's table row names the
//!   format in `dispatch::wide_one_token`); both bitwise the scalar reference's result.
//!
//! * Exception, `Isa::Avx512`/`Amx` with Q5_K/Q3_K/Q2_K/IQ4_XS (packed or not), or `Isa::Avx512`
//!   with packed Q4_K/Q6_K, and enough tokens (`simd::vnni_k::takes`: from `dispatch::token_lane_min`,
//!   measured per CPU): chunks of whole 8-row bands go to
//!   `simd::vnni_k::run_rows`, which decodes them once (from the packing if there is one)
//!   into byte codes and sweeps 16-token
//!   groups over them with VNNI (bitwise the scalar reference, as the decode kernels).
//! * Exception, Q5_K/Q3_K/Q2_K/IQ4_XS and ≥ 8 tokens on `Isa::Avx2`, or on `Isa::Avx512`/`Amx`
//!   below the token-lane threshold, unpacked (`simd::k_panel::takes`): chunks (sized so their decoded panel stays in L2) go whole to
//!   `simd::k_panel::run_rows`, which decodes the chunk's weights once and sweeps every token
//!   over them (bitwise the decode tiles' result).
//!
//! * Exception, `Isa::Avx512`/`Amx` with F16/BF16 weights, ≥ 6 tokens and `cols` a multiple
//!   of 16 (`simd::avx512_float_wide::takes`): chunks go whole to
//!   `simd::avx512_float_wide::run_rows`, tiles of 4 rows × 6 tokens over activations
//!   interleaved per 16 columns (bitwise the 4 × 4 tiles' result); the 0–5 tokens left run
//!   the 4 × 4 tiles.
//!
//! * [`matmul_multi`]: several matrices sharing the activations (q/k/v, gate/up) in one
//!   parallel region, activations prepared once.
//! * [`matmul_grouped`]: several matrices each over its own activations (a mixture's experts,
//!   each over the tokens routed to it) in one parallel region.
//!
//! Invariant (relied upon by chunked prefill): for a given CPU path the result for token `t`
//! is **bitwise identical** whatever `n_tokens` is and whichever other tokens share the call,
//! because activation rows are quantized independently and each (row, token) accumulator sees
//! the same operations in the same order in every tile shape.

use crate::dispatch::kernel_path;
use crate::dtype::{DType, WeightMatrix};
use crate::simd::{run_tile, tile_limits, Acts, Isa, TileCtx};

/// `out[t][r] = Σ_k x[t][k] · W[r][k]` for `t in 0..n_tokens`; `x` is `[n_tokens, cols]`,
/// `out` is `[n_tokens, rows]`, both row-major. Uses the format's path on this CPU
/// (`dispatch::kernel_path`) and the global pool.
///
/// Accuracy: F32/F16/BF16 weights are exact up to f32 accumulation rounding. Q4_0/Q8_0/Q4_K/Q6_K
/// quantize the activations to 8 bits per 32/256-element block first (like ggml), adding an
/// error of at most ½·(block max/127) per activation element.
///
/// # Panics
/// If `x.len() != n_tokens * w.cols` or `out.len() != n_tokens * w.rows`.
pub fn matmul(w: &WeightMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    matmul_with(kernel_path(w.dtype), w, x, n_tokens, out)
}

/// [`matmul`] on an explicit kernel path (tests use it to cover every path on one machine).
///
/// # Panics
/// As [`matmul`], and if `isa` is not available on this CPU.
pub fn matmul_with(isa: Isa, w: &WeightMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    matmul_multi_with(isa, &[w], x, n_tokens, &mut [out])
}

/// Several products over the same activations in one parallel region:
/// `outs[i][t][r] = Σ_k x[t][k] · ws[i][r][k]` (e.g. the q, k, v projections, or gate and up).
/// The activations are prepared once per weight format, and all matrices' row chunks are
/// spread over the pool together, so there is one synchronisation instead of one per matrix.
///
/// Invariant: `outs[i]` is bitwise equal to `matmul(ws[i], x, n_tokens, outs[i])` (the same
/// tiles run on the same prepared activations; only their scheduling differs).
///
/// # Panics
/// If the matrices' `cols` differ, or any shape is inconsistent as in [`matmul`].
pub fn matmul_multi(ws: &[&WeightMatrix], x: &[f32], n_tokens: usize, outs: &mut [&mut [f32]]) {
    multi(&kernel_path, ws, x, n_tokens, outs)
}

/// [`matmul_multi`] on an explicit kernel path.
///
/// # Panics
/// As [`matmul_multi`], and if `isa` is not available on this CPU.
pub fn matmul_multi_with(isa: Isa, ws: &[&WeightMatrix], x: &[f32], n_tokens: usize, outs: &mut [&mut [f32]]) {
    assert!(isa.is_available(), "kernel path {isa:?} not supported by this CPU");
    multi(&|_| isa, ws, x, n_tokens, outs)
}

/// [`matmul_multi`] with each matrix's kernel path `pick(format)`: the same products as a
/// grouped call whose items share `x`, which prepares the activations once per format (Q4_K
/// and Q6_K share Q8_K blocks) and runs every matrix's row chunks in one parallel region.
fn multi(pick: &dyn Fn(DType) -> Isa, ws: &[&WeightMatrix], x: &[f32], n_tokens: usize, outs: &mut [&mut [f32]]) {
    check_multi(ws, x, n_tokens, outs);
    let mut items: Vec<MatmulItem> = ws.iter().zip(outs.iter_mut()).map(|(w, out)| MatmulItem { w, x, n_tokens, out }).collect();
    grouped(pick, &mut items);
}

/// The shapes of a [`matmul_multi`] call.
fn check_multi(ws: &[&WeightMatrix], x: &[f32], n_tokens: usize, outs: &[&mut [f32]]) {
    assert_eq!(ws.len(), outs.len(), "matmul_multi: one output per matrix");
    let Some(cols) = ws.first().map(|w| w.cols) else { return };
    assert!(ws.iter().all(|w| w.cols == cols), "matmul_multi: every matrix must have the same cols");
    assert_eq!(x.len(), n_tokens * cols, "matmul: x must be n_tokens x cols");
    for (w, out) in ws.iter().zip(outs.iter()) {
        assert_eq!(out.len(), n_tokens * w.rows, "matmul: out must be n_tokens x rows");
    }
}

/// One product of a [`matmul_grouped`] call: `out[t][r] = Σ_k x[t][k] · w[r][k]` for `t in
/// 0..n_tokens`, shapes as in [`matmul`].
pub struct MatmulItem<'a> {
    pub w: &'a WeightMatrix<'a>,
    pub x: &'a [f32],
    pub n_tokens: usize,
    pub out: &'a mut [f32],
}

/// Several products, each over its own activations, in one parallel region: the experts a
/// mixture's tokens were routed to, each over its own rows, with one synchronisation instead
/// of one per expert. Activations are prepared once per distinct slice and format.
///
/// Invariant: each item's `out` is bitwise equal to `matmul(w, x, n_tokens, out)` (the same
/// tiles on the same prepared activations; only their scheduling differs).
///
/// # Panics
/// If an item's shapes are inconsistent as in [`matmul`].
pub fn matmul_grouped(items: &mut [MatmulItem<'_>]) {
    grouped(&kernel_path, items)
}

/// [`matmul_grouped`] on an explicit kernel path.
///
/// # Panics
/// As [`matmul_grouped`], and if `isa` is not available on this CPU.
pub fn matmul_grouped_with(isa: Isa, items: &mut [MatmulItem<'_>]) {
    assert!(isa.is_available(), "kernel path {isa:?} not supported by this CPU");
    grouped(&|_| isa, items)
}

/// [`matmul_grouped`] with each item's kernel path `pick(format)` (a path this CPU runs).
fn grouped(pick: &dyn Fn(DType) -> Isa, items: &mut [MatmulItem<'_>]) {
    for it in items.iter_mut() {
        assert_eq!(it.x.len(), it.n_tokens * it.w.cols, "matmul: x must be n_tokens x cols");
        assert_eq!(it.out.len(), it.n_tokens * it.w.rows, "matmul: out must be n_tokens x rows");
        if it.w.cols == 0 {
            it.out.fill(0.0);
        }
    }
    let runs = |it: &MatmulItem<'_>| it.n_tokens > 0 && it.w.rows > 0 && it.w.cols > 0;
    // Activations once per (slice, preparation): gate and up of one expert share theirs.
    let mut prepared: Vec<(*const f32, usize, DType, Acts)> = Vec::new();
    let mut which = Vec::with_capacity(items.len());
    for it in items.iter() {
        if !runs(it) {
            which.push(usize::MAX);
            continue;
        }
        let k = acts_key(it.w.dtype);
        let at = prepared.iter().position(|(p, n, d, _)| std::ptr::eq(*p, it.x.as_ptr()) && *n == it.x.len() && *d == k);
        which.push(at.unwrap_or_else(|| {
            prepared.push((it.x.as_ptr(), it.x.len(), k, Acts::prepare(it.w.dtype, it.x, it.n_tokens, it.w.cols)));
            prepared.len() - 1
        }));
    }
    let threads = crate::pool::num_threads();
    let work: u64 = items.iter().filter(|it| runs(it)).map(|it| it.w.rows as u64 * it.w.cols as u64 * it.n_tokens as u64).sum();
    let jobs: Vec<Job> = items
        .iter_mut()
        .zip(&which)
        .filter(|(_, &at)| at != usize::MAX)
        .map(|(it, &at)| Job::new(pick(it.w.dtype), it.w, &prepared[at].3, it.out, it.n_tokens, threads))
        .collect();
    run_jobs(&jobs, work, threads);
}

/// Activations are prepared once per key: Q4_K and Q6_K (and the other K-quants) share Q8_K
/// blocks, Q5_1 shares Q4_1's, IQ4_NL and MXFP4 share Q8_0's, F16 and BF16 share f32.
fn acts_key(d: DType) -> DType {
    match d {
        DType::Q6K | DType::Q2K | DType::Q3K | DType::Q5K | DType::IQ4XS | DType::IQ3XXS | DType::IQ3S => DType::Q4K,
        DType::Q5_1 => DType::Q4_1,
        DType::IQ4NL | DType::MXFP4 => DType::Q8_0,
        DType::F16 | DType::BF16 => DType::F32,
        d => d,
    }
}

/// Runs `jobs` (their row chunks spread over the kernel threads together by
/// [`crate::parallel_for`]; alone on this thread when there is one thread or too little `work`
/// to share).
fn run_jobs(jobs: &[Job], work: u64, threads: usize) {
    if threads <= 1 || work < (1 << 18) {
        // Chunk by chunk, as the pool would: a chunk's weights stay in L2 while all the
        // call's tokens pass over them (one call over every row would stream the whole
        // matrix once per token group).
        jobs.iter().for_each(|j| (0..j.nchunks).for_each(|c| j.run_rows(c * j.chunk, ((c + 1) * j.chunk).min(j.rows))));
        return;
    }
    let pieces: Vec<(usize, usize)> = jobs.iter().enumerate().flat_map(|(i, j)| (0..j.nchunks).map(move |c| (i, c))).collect();
    crate::pool::parallel_for(pieces.len(), &|p| {
        let (i, c) = pieces[p];
        let j = &jobs[i];
        j.run_rows(c * j.chunk, ((c + 1) * j.chunk).min(j.rows));
    });
}

/// Row chunks per kernel thread of a call of several tokens: enough for the threads to even
/// out.
const CHUNKS_PER_THREAD: usize = 8;

/// Row chunks per kernel thread of a one-token call, which reads every weight once: each
/// thread's rows in two long runs stream faster than eight short ones taken in turn by both
/// threads. On SmolLM2-135M (576-wide matrices, Zen 4, 2 threads) decode went from 230–249
/// to 287–321 tok/s; llama-1b's one-row step was unchanged or faster (docs/cpu-kernels.md).
const ONE_TOKEN_CHUNKS_PER_THREAD: usize = 2;

/// One matrix of a [`matmul_multi_with`] call: its tile context and row chunking.
struct Job<'a> {
    isa: Isa,
    ctx: TileCtx<'a>,
    rows: usize,
    n_tokens: usize,
    nr_max: usize,
    nt_max: usize,
    chunk: usize,
    nchunks: usize,
    #[cfg(target_arch = "x86_64")]
    amx_acts: Option<&'a crate::quantize::ActQ8>,
    /// AVX2 with a packed matrix: whole 8-row groups go to `avx2_packed::run_rows`.
    #[cfg(target_arch = "x86_64")]
    packed: Option<&'a crate::Packed>,
    /// Q5_K/Q3_K/Q2_K/IQ4_XS prefill: whole chunks go to `k_panel::run_rows`.
    #[cfg(target_arch = "x86_64")]
    panel: bool,
    /// K-quant / IQ4_XS prefill on AVX-512 VNNI: whole chunks go to `vnni_k::run_rows`.
    #[cfg(target_arch = "x86_64")]
    vnni: bool,
    /// F16 / BF16 weights and ≥ 6 tokens on AVX-512: whole chunks go to `avx512_float_wide::run_rows`.
    #[cfg(target_arch = "x86_64")]
    float_wide: bool,
}

impl<'a> Job<'a> {
    fn new(isa: Isa, w: &'a WeightMatrix<'a>, acts: &'a Acts<'a>, out: &mut [f32], n_tokens: usize, threads: usize) -> Job<'a> {
        let isa = isa.for_format(w.dtype);
        // AMX with a packed Q4_0 / Q8_0 matrix: calls of fewer tokens than the tiles pay for run
        // the AVX-512 packed kernels; both give the scalar reference's bits.
        let isa =
            if isa == Isa::Amx && w.packed.is_some() && n_tokens < crate::dispatch::amx_token_min(w.dtype) { Isa::Avx512 } else { isa };
        #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
        let (mut nr_max, nt_max) = tile_limits(isa, w.dtype, n_tokens);
        #[cfg(target_arch = "x86_64")]
        let amx_acts = match (isa, acts) {
            // AMX tiles are written for Q4_0 / Q8_0 only; the other Q8-activation formats run
            // the AVX-512 tile kernels on this path.
            (Isa::Amx, Acts::Q8(a)) if matches!(w.dtype, DType::Q4_0 | DType::Q8_0) => {
                nr_max = crate::simd::amx::GROUP;
                Some(a)
            }
            _ => None,
        };
        #[cfg(target_arch = "x86_64")]
        let packed = match (isa, w.packed) {
            (isa, Some(p)) if isa.runs_packed() => {
                // The AMX tiles read the packing 16 rows (two groups) at a time.
                if amx_acts.is_none() {
                    nr_max = crate::repack::GROUP_ROWS;
                }
                Some(p)
            }
            _ => None,
        };
        #[cfg(target_arch = "x86_64")]
        let vnni = amx_acts.is_none() && crate::simd::vnni_k::takes(isa, w.dtype, n_tokens, packed.is_some());
        #[cfg(target_arch = "x86_64")]
        if vnni {
            nr_max = crate::simd::vnni_k::BAND;
        }
        #[cfg(target_arch = "x86_64")]
        let panel = !vnni
            && amx_acts.is_none()
            && crate::simd::k_panel::takes(isa, w.dtype, n_tokens)
            && match packed {
                None => true,
                Some(p) => crate::simd::k_panel::reads_packing(p.dtype(), n_tokens),
            };
        #[cfg(target_arch = "x86_64")]
        let float_wide = crate::simd::avx512_float_wide::takes(isa, w.dtype, n_tokens, w.cols);
        // A panel decoded from the packing (IQ4_XS, Q2_K, Q5_K) replaces the packed kernels for the call.
        #[cfg(target_arch = "x86_64")]
        let packed = if panel { None } else { packed };
        let rows = w.rows;
        // ~8 chunks per thread for balance (2 for one token), rounded to the row tile, capped
        // so a chunk's weights fit in L2 while they are reused across token groups.
        let rb = w.row_bytes();
        let per_thread = if n_tokens == 1 { ONE_TOKEN_CHUNKS_PER_THREAD } else { CHUNKS_PER_THREAD };
        let mut chunk = rows.div_ceil(threads.max(1) * per_thread).max(1);
        if n_tokens > 1 {
            chunk = chunk.min((crate::dispatch::chunk_kib(w.dtype) * 1024 / rb.max(1)).max(1));
        }
        chunk = chunk.div_ceil(nr_max) * nr_max;
        #[cfg(target_arch = "x86_64")]
        if panel {
            // The decoded panel (~3× the weight bytes) is what must stay in L2.
            chunk = chunk.min(crate::simd::k_panel::chunk_rows(w.cols));
        }

        let nchunks = rows.div_ceil(chunk);
        let ctx = TileCtx { w, acts, out: out.as_mut_ptr(), ldo: rows };
        Job {
            isa,
            ctx,
            rows,
            n_tokens,
            nr_max,
            nt_max,
            chunk,
            nchunks,
            #[cfg(target_arch = "x86_64")]
            amx_acts,
            #[cfg(target_arch = "x86_64")]
            packed,
            #[cfg(target_arch = "x86_64")]
            panel,
            #[cfg(target_arch = "x86_64")]
            vnni,
            #[cfg(target_arch = "x86_64")]
            float_wide,
        }
    }

    /// Computes output rows `r0..r1` for every token.
    fn run_rows(&self, r0: usize, r1: usize) {
        #[cfg(target_arch = "x86_64")]
        if let Some(a) = self.amx_acts {
            // SAFETY: isa checked by the caller; chunks start at multiples of nr_max = GROUP
            // and own disjoint rows.
            unsafe { crate::simd::amx::run_rows(&self.ctx, a, self.packed, r0, r1, self.n_tokens) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.vnni {
            // SAFETY: `vnni_k::takes` checked the isa (available, checked by the caller), format,
            // token count and packing; chunks start at multiples of nr_max = BAND = GROUP_ROWS
            // and own disjoint rows.
            unsafe { crate::simd::vnni_k::run_rows(&self.ctx, self.packed, r0, r1, self.n_tokens) };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(p) = self.packed {
            // SAFETY: isa (AVX2, or AVX-512, which implies it) checked by the caller; chunks start at multiples of
            // nr_max = GROUP_ROWS, rows are a whole number of groups, chunks own disjoint rows.
            // One-token calls run the AVX2 kernels on AVX-512 CPUs unless the CPU's table row
            // says otherwise (`dispatch::wide_one_token`): they read a group-block at a time in
            // address order, which the hardware prefetchers follow; from DRAM the 512-bit
            // kernels' one-token calls were 1.3-6x slower on Zen 4 and 1.1-1.7x faster on the
            // Intel Xeon measured (`bench kernels --tokens 1`; docs/cpu-kernels.md).
            unsafe {
                let wide = self.n_tokens > 1 || crate::dispatch::wide_one_token(p.dtype());
                if self.isa == Isa::Avx512 && wide && crate::simd::avx512_packed::takes(p.dtype()) {
                    crate::simd::avx512_packed::run_rows(&self.ctx, p, r0, r1, self.n_tokens)
                } else {
                    crate::simd::avx2_packed::run_rows(&self.ctx, p, r0, r1, self.n_tokens)
                }
            };
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.float_wide {
            // SAFETY: `avx512_float_wide::takes` checked the isa (available, checked by the
            // caller), format, token count and columns; chunks own disjoint rows.
            let done = unsafe { crate::simd::avx512_float_wide::run_rows(&self.ctx, r0, r1, self.n_tokens) };
            self.run_tiles(r0, r1, done);
            return;
        }
        #[cfg(target_arch = "x86_64")]
        if self.panel {
            // SAFETY: `k_panel::takes` checked the isa (available, checked by the caller), format
            // and token count; chunks own disjoint rows.
            unsafe { crate::simd::k_panel::run_rows(&self.ctx, r0, r1, self.n_tokens) };
            return;
        }
        self.run_tiles(r0, r1, 0);
    }

    /// Computes output rows `r0..r1` for tokens `t0..` with the path's register tiles.
    fn run_tiles(&self, r0: usize, r1: usize, mut t0: usize) {
        while t0 < self.n_tokens {
            let nt = crate::simd::even_pass(self.n_tokens - t0, self.nt_max);
            let mut r = r0;
            while r < r1 {
                let nr = self.nr_max.min(r1 - r);
                // SAFETY: isa checked by the caller; tile in bounds; chunks own disjoint rows.
                unsafe { run_tile(self.isa, &self.ctx, r, nr, t0, nt) };
                r += nr;
            }
            t0 += nt;
        }
    }
}
