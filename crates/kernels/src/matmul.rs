//! [`matmul`]: dispatch, tiling and threading of `out[t][r] = Σ_k x[t][k] · W[r][k]`.
//!
//! Strategy:
//! * Activations are prepared once per call (quantized to Q8_0 / Q8_K blocks for the integer
//!   kernels, see `quantize.rs` for why), in parallel for large batches.
//! * Work is split over *output rows* into chunks run on [`crate::pool`]; every weight row is
//!   therefore read from memory once per call regardless of `n_tokens`. A chunk's weights are
//!   kept ≲ 256 KiB so they stay in L2 while the chunk sweeps all tokens.
//! * Inside a chunk: for each group of ≤ 4 tokens (their activations stay in L1), for each group
//!   of ≤ 4 rows, one register-tiled kernel call (`simd::run_tile`), decoding each weight block
//!   once per group and reusing it for all tokens in the group. `n_tokens = 1` is the same code
//!   with a 1-token tile (GEMV), so it streams weights at memory bandwidth.
//! * Exception, `Isa::Amx` with Q4_0/Q8_0: chunks are multiples of 16 rows and go whole to
//!   `simd::amx::run_rows`, which repacks the chunk's weights once into AMX tile layout and
//!   sweeps 16-token groups over it (or, for ≤ 3 tokens, runs a VNNI kernel on the weights in
//!   place).
//!
//! Invariant (relied upon by chunked prefill): for a given CPU path the result for token `t`
//! is **bitwise identical** whatever `n_tokens` is and whichever other tokens share the call,
//! because activation rows are quantized independently and each (row, token) accumulator sees
//! the same operations in the same order in every tile shape.

use crate::dtype::WeightMatrix;
use crate::simd::{run_tile, tile_limits, Acts, Isa, TileCtx};
use rayon::prelude::*;

/// `out[t][r] = Σ_k x[t][k] · W[r][k]` for `t in 0..n_tokens`; `x` is `[n_tokens, cols]`,
/// `out` is `[n_tokens, rows]`, both row-major. Uses the best SIMD path of this CPU and the
/// global pool.
///
/// Accuracy: F32/F16/BF16 weights are exact up to f32 accumulation rounding. Q4_0/Q8_0/Q4_K/Q6_K
/// quantize the activations to 8 bits per 32/256-element block first (like ggml), adding an
/// error of at most ½·(block max/127) per activation element.
///
/// # Panics
/// If `x.len() != n_tokens * w.cols` or `out.len() != n_tokens * w.rows`.
pub fn matmul(w: &WeightMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    matmul_with(Isa::detect(), w, x, n_tokens, out)
}

/// [`matmul`] on an explicit kernel path (tests use it to cover every path on one machine).
///
/// # Panics
/// As [`matmul`], and if `isa` is not available on this CPU.
pub fn matmul_with(isa: Isa, w: &WeightMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    assert!(isa.is_available(), "kernel path {isa:?} not supported by this CPU");
    assert_eq!(x.len(), n_tokens * w.cols, "matmul: x must be n_tokens x cols");
    assert_eq!(out.len(), n_tokens * w.rows, "matmul: out must be n_tokens x rows");
    if n_tokens == 0 || w.rows == 0 {
        return;
    }
    if w.cols == 0 {
        out.iter_mut().for_each(|v| *v = 0.0);
        return;
    }
    let acts = Acts::prepare(w.dtype, x, n_tokens, w.cols);
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let (mut nr_max, nt_max) = tile_limits(isa, w.dtype);
    let ctx = TileCtx { w, acts: &acts, out: out.as_mut_ptr(), ldo: w.rows };
    let rows = w.rows;
    #[cfg(target_arch = "x86_64")]
    let amx_acts = match (isa, &acts) {
        (Isa::Amx, Acts::Q8(a)) => {
            nr_max = crate::simd::amx::GROUP;
            Some(a)
        }
        _ => None,
    };

    let run_rows = |r0: usize, r1: usize| {
        #[cfg(target_arch = "x86_64")]
        if let Some(a) = amx_acts {
            // SAFETY: isa checked above; chunks start at multiples of nr_max = GROUP and own
            // disjoint rows.
            unsafe { crate::simd::amx::run_rows(&ctx, a, r0, r1, n_tokens) };
            return;
        }
        let mut t0 = 0;
        while t0 < n_tokens {
            let nt = nt_max.min(n_tokens - t0);
            let mut r = r0;
            while r < r1 {
                let nr = nr_max.min(r1 - r);
                // SAFETY: isa checked above; tile in bounds; chunks own disjoint rows.
                unsafe { run_tile(isa, &ctx, r, nr, t0, nt) };
                r += nr;
            }
            t0 += nt;
        }
    };

    let threads = crate::pool::num_threads();
    let work = rows as u64 * w.cols as u64 * n_tokens as u64;
    if threads <= 1 || work < (1 << 18) {
        run_rows(0, rows);
        return;
    }
    // ~8 chunks per thread for balance, rounded to the row tile, capped so a chunk's weights
    // fit in L2 while they are reused across token groups.
    let rb = w.row_bytes();
    let mut chunk = rows.div_ceil(threads * 8).max(1);
    if n_tokens > 1 {
        chunk = chunk.min((256 * 1024 / rb.max(1)).max(1));
    }
    chunk = chunk.div_ceil(nr_max) * nr_max;
    let nchunks = rows.div_ceil(chunk);
    crate::pool::pool().install(|| {
        (0..nchunks).into_par_iter().for_each(|c| {
            run_rows(c * chunk, ((c + 1) * chunk).min(rows));
        })
    });
}
