//! F16 / BF16 weights on AVX-512 in calls of [`TOKENS`] or more tokens: tiles of 4 rows × 6
//! tokens over a copy of the tokens' activations interleaved per 16 columns.
//!
//! Why: the tokens' rows of activations, read side by side, sit at strides of whole 4 KiB
//! pages in the usual row-major layout and compete for the same L1 sets with the weight rows;
//! interleaved (16 columns of token 0, then of token 1, … then the next 16 columns) they are
//! one sequential stream, and six tokens share each weight row's pass through L1 (and each
//! 16 weights' conversion, two µops on the FMA ports). On L1-resident data the two loop bodies
//! run at the same rate (`benches/isa_probe.rs`); over the model's matrices these tiles ran
//! 10-30% faster (docs/cpu-kernels.md). F32 weights keep the 4 × 4 tiles: their
//! 256 KiB chunks hold 8 rows of 8192 columns, and six tokens' activations beside them ran
//! the 2048 × 8192 matrix slower (`docs/cpu-kernels.md`).
//!
//! Invariant: each (row, token) accumulator sees exactly `avx512::float_tile`'s operations —
//! zero, one FMA per 16 columns in column order, `_mm512_reduce_add_ps` — so every output is
//! bitwise what the 4 × 4 tiles (and the one-token tiles of decode) give. Calls take this
//! path only when `cols` is a multiple of 16, so no masked tail is needed; the tokens left
//! over after the last group of 6 the matmul runs in its 4 × 4 tiles.

use super::{Acts, TileCtx};
use crate::dtype::DType;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Tokens per tile (and per interleaved group).
pub(crate) const TOKENS: usize = 6;

/// Rows per tile.
const ROWS: usize = 4;

thread_local! {
    /// One group's interleaved activations: `cols / 16 × TOKENS` registers. Grown, never
    /// shrunk; every register a tile reads is written first.
    static GROUP: RefCell<Vec<__m512>> = const { RefCell::new(Vec::new()) };
}

/// Whether a call of `n_tokens` tokens of `dtype` weights with `cols` columns on path `isa`
/// runs here.
pub(crate) fn takes(isa: super::Isa, dtype: DType, n_tokens: usize, cols: usize) -> bool {
    matches!(isa, super::Isa::Avx512 | super::Isa::Amx)
        && matches!(dtype, DType::F16 | DType::BF16)
        && n_tokens >= TOKENS
        && cols > 0
        && cols % 16 == 0
}

/// Computes output rows `r0..r1` for the call's whole groups of [`TOKENS`] tokens and returns
/// how many tokens that was (the rest, fewer than [`TOKENS`], are the caller's).
///
/// # Safety
/// AVX-512 F/BW/VL must be available; [`takes`] must hold for the call; rows `r0..r1` are in
/// bounds and no other thread writes them.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn run_rows(c: &TileCtx, r0: usize, r1: usize, n_tokens: usize) -> usize {
    let Acts::F32(x) = c.acts else { unreachable!("activations prepared for the wrong dtype") };
    let cols = c.w.cols;
    let steps = cols / 16;
    let rb = c.w.row_bytes();
    let f16 = c.w.dtype == DType::F16;
    GROUP.with(|cell| {
        let buf = &mut *cell.borrow_mut();
        if buf.len() < steps * TOKENS {
            buf.resize(steps * TOKENS, _mm512_setzero_ps());
        }
        let mut t0 = 0;
        while n_tokens - t0 >= TOKENS {
            interleave(x.as_ptr().add(t0 * cols), cols, buf.as_mut_ptr());
            let mut r = r0;
            while r < r1 {
                let nr = ROWS.min(r1 - r);
                let w = c.w.data.as_ptr().add(r * rb);
                let out = c.out.add(t0 * c.ldo + r);
                match (f16, nr) {
                    (true, 4) => tile::<1, 4>(w, rb, buf.as_ptr(), steps, out, c.ldo),
                    (true, 3) => tile::<1, 3>(w, rb, buf.as_ptr(), steps, out, c.ldo),
                    (true, 2) => tile::<1, 2>(w, rb, buf.as_ptr(), steps, out, c.ldo),
                    (true, _) => tile::<1, 1>(w, rb, buf.as_ptr(), steps, out, c.ldo),
                    (false, 4) => tile::<2, 4>(w, rb, buf.as_ptr(), steps, out, c.ldo),
                    (false, 3) => tile::<2, 3>(w, rb, buf.as_ptr(), steps, out, c.ldo),
                    (false, 2) => tile::<2, 2>(w, rb, buf.as_ptr(), steps, out, c.ldo),
                    (false, _) => tile::<2, 1>(w, rb, buf.as_ptr(), steps, out, c.ldo),
                }
                r += nr;
            }
            t0 += TOKENS;
        }
        t0
    })
}

/// Copies `TOKENS` rows of `cols` activations (row-major at `x`) to `buf` as `cols / 16`
/// groups of `TOKENS` registers: group `s` holds columns `16s..16s+16` of each token in turn.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn interleave(x: *const f32, cols: usize, buf: *mut __m512) {
    for s in 0..cols / 16 {
        for t in 0..TOKENS {
            *buf.add(s * TOKENS + t) = _mm512_loadu_ps(x.add(t * cols + 16 * s));
        }
    }
}

/// `NR` rows (kind `K`: 1 = f16, 2 = bf16, as `avx512::load16`; row stride `rb` bytes) × `TOKENS` tokens
/// over the interleaved activations `xg` (`steps` groups); writes `out[t * ldo + r]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const K: u8, const NR: usize>(w: *const u8, rb: usize, xg: *const __m512, steps: usize, out: *mut f32, ldo: usize) {
    let mut acc = [[_mm512_setzero_ps(); TOKENS]; NR];
    for s in 0..steps {
        let mut wv = [_mm512_setzero_ps(); NR];
        for r in 0..NR {
            wv[r] = super::avx512::load16::<K, false>(w.add(r * rb), 16 * s, 0);
        }
        let xs = xg.add(s * TOKENS);
        for t in 0..TOKENS {
            let xv = *xs.add(t);
            for r in 0..NR {
                acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
            }
        }
    }
    for r in 0..NR {
        for t in 0..TOKENS {
            *out.add(t * ldo + r) = _mm512_reduce_add_ps(acc[r][t]);
        }
    }
}
