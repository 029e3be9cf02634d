//! Instruction-set selection ([`Isa`]) and the tile interface every kernel implements.
//!
//! A *tile kernel* computes `out[t][r]` for `nr` consecutive weight rows × `nt` consecutive
//! tokens (at most [`tile_limits`]), decoding each weight block once and reusing it for every
//! token in the tile. Invariant (the "n_tokens independence" guarantee): for a fixed `Isa`, the
//! floating-point operations applied to one (row, token) accumulator are the same whatever
//! `nr`/`nt` are, so a token's output is bitwise identical whether it is computed alone (GEMV)
//! or inside any batch (GEMM).
//!
//! Paths: `scalar` (portable, any target, also the reference), `avx2` (AVX2+FMA+F16C,
//! `vpmaddubsw` integer dots), `avx512` (AVX-512F/BW/VL + VNNI `vpdpbusd` for Q4_0/Q8_0 and
//! 16-lane float kernels, F16/BF16 calls of ≥ 6 tokens `avx512_float_wide`'s 4 × 6 tiles over
//! interleaved activations; packed Q4_0/Q8_0/Q4_1/Q4_K run `avx512_packed*`, the packed
//! layout's 512-bit kernels of up to 16 tokens a pass (K-quants 8; packed Q6_K too; one-token packed calls: the AVX2 kernels, unless `dispatch::wide_one_token`); `avx512_q32` for Q4_1/Q5_0/Q5_1/IQ4_NL/MXFP4; K-quants and the
//! formats of `avx2_k` reuse the AVX2 kernels, except one-token Q3_K/IQ4_XS calls, which run
//! `avx512_k`'s VNNI row tiles; calls of Q5_K/Q3_K/Q2_K/IQ4_XS from
//! `dispatch::token_lane_min` tokens (8 unless the CPU's table row says otherwise), and of
//! packed Q4_K/Q6_K from 16, run `vnni_k`'s token-lane VNNI kernel, and calls of 8 tokens up to
//! that threshold `k_panel`'s decoded-once panels; on the AVX2 path Q5_K/Q3_K/Q2_K/IQ4_XS calls
//! of ≥ 8 tokens run the panels, packed ones as `k_panel::reads_packing` says), `amx` (AMX-INT8 tiles for
//! Q4_0/Q8_0, driven per row chunk by `amx::run_rows` instead of `run_tile`; other formats on
//! that path use `avx512`), `neon` (aarch64: integer dots of the quantized formats with
//! widening multiplies, bitwise the scalar reference; float formats and Q4_1, Q5_0, Q5_1,
//! IQ4_NL, MXFP4, Q2_K, Q3_K, Q5_K, IQ4_XS run the scalar integer dots through the same recipe).

use crate::dtype::{DType, WeightMatrix};
use crate::quantize::{ActQ8, ActQ8K};

#[cfg(target_arch = "x86_64")]
pub(crate) mod act_q8;
#[cfg(target_arch = "x86_64")]
pub(crate) mod amx;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_packed;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_packed_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_q32;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_float_wide;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_iq3;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_packed;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_packed_k;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512_q32;
#[cfg(target_arch = "x86_64")]
pub(crate) mod k_panel;
#[cfg(target_arch = "aarch64")]
pub(crate) mod neon;
#[cfg(target_arch = "x86_64")]
pub(crate) mod prefetch;
pub(crate) mod scalar;
#[cfg(target_arch = "x86_64")]
pub(crate) mod vnni_k;

/// A kernel implementation family. `Isa::detect()` picks the best one the CPU supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust; compiles everywhere.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// x86-64 AVX-512 F/BW/VL + VNNI (plus AVX2/FMA/F16C).
    Avx512,
    /// [`Isa::Avx512`] plus AMX-INT8 tiles for Q4_0/Q8_0 (other formats run the AVX-512
    /// kernels). Needs OS support (Linux `arch_prctl` permission, requested on detection).
    Amx,
    /// aarch64 NEON (Advanced SIMD, part of every ARMv8-A core) for Q4_0/Q8_0/Q4_K/Q6_K (other
    /// formats: the scalar kernels' integer dots).
    Neon,
}

impl Isa {
    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512.is_available() && amx::available(),
            Isa::Neon => cfg!(target_arch = "aarch64"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The path [`matmul`](crate::matmul) and the AMX flash attention use (cached after the
    /// first call): the one `ENGRAM_SIMD` forces ([`Isa::forced`]) if set, else the best
    /// available.
    ///
    /// # Panics
    /// If `ENGRAM_SIMD` is set to an unknown path or one this CPU lacks (programs check
    /// [`Isa::forced`] at start-up to report it as an error instead).
    pub fn detect() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| match Isa::forced() {
            Ok(Some(isa)) => isa,
            Ok(None) => Isa::best(),
            Err(e) => panic!("{e}"),
        })
    }

    /// Whether matrices are repacked at load for this path, and their products run the packed
    /// kernels (8 rows per register lane) instead of this path's tiles: AVX2 (`avx2_packed*`),
    /// and AVX-512 (`avx512_packed*`: the same layout with VNNI `vpdpbusd`, bitwise the AVX2
    /// kernels' results) — measured on Zen 4 the packed layout beats the AVX-512 tiles (Q4_1
    /// llama-1b, 2 threads: prefill 3.3×, decode 2.1×; `docs/cpu-kernels.md`). AMX: packed
    /// Q4_0 / Q8_0 calls of few tokens run the AVX-512 packed kernels and larger ones its tiles,
    /// which read their blocks from the packing (`simd/amx.rs`); its other formats are the
    /// AVX-512 path's ([`Isa::for_format`]).
    pub fn runs_packed(self) -> bool {
        matches!(self, Isa::Avx2 | Isa::Avx512 | Isa::Amx)
    }

    /// The path whose kernels multiply `dtype` when `self` is asked for: `self`, except that the
    /// AMX path has tiles for Q4_0 / Q8_0 only and runs every other format as the AVX-512 path
    /// does (its packings, packed and token-lane kernels included). Every caller that chooses
    /// kernels or packings for a format goes through this, so the AMX path's other formats are
    /// bitwise the AVX-512 path's.
    pub fn for_format(self, dtype: DType) -> Isa {
        if self == Isa::Amx && !matches!(dtype, DType::Q4_0 | DType::Q8_0) {
            Isa::Avx512
        } else {
            self
        }
    }

    /// The best path this CPU can run, ignoring `ENGRAM_SIMD`.
    pub fn best() -> Isa {
        [Isa::Amx, Isa::Avx512, Isa::Avx2, Isa::Neon].into_iter().find(|i| i.is_available()).unwrap_or(Isa::Scalar)
    }

    /// The path forced by the `ENGRAM_SIMD` environment variable (`scalar`, `avx2`, `avx512`,
    /// `amx`, `neon`; unset, empty or `auto`: none). An unknown name or a path this CPU cannot run is
    /// an error naming the paths it can, never a silent fallback.
    pub fn forced() -> Result<Option<Isa>, crate::KernelError> {
        match std::env::var("ENGRAM_SIMD") {
            Ok(v) => Isa::resolve(&v),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => {
                Err(crate::KernelError::ForcedPath { value: v.to_string_lossy().into_owned(), reason: "not valid UTF-8".into() })
            }
        }
    }

    /// What a value of `ENGRAM_SIMD` forces (see [`Isa::forced`]).
    pub fn resolve(value: &str) -> Result<Option<Isa>, crate::KernelError> {
        let v = value.trim();
        if v.is_empty() || v.eq_ignore_ascii_case("auto") {
            return Ok(None);
        }
        let can = Isa::available().iter().map(|i| i.name()).collect::<Vec<_>>().join(", ");
        let err = |reason: String| crate::KernelError::ForcedPath { value: value.to_string(), reason };
        let isa = [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon]
            .into_iter()
            .find(|i| i.name().eq_ignore_ascii_case(v))
            .ok_or_else(|| err(format!("unknown kernel path (known: scalar, avx2, avx512, amx, neon, auto; this CPU runs {can})")))?;
        if !isa.is_available() {
            return Err(err(format!("this CPU cannot run the {} path (it runs {can})", isa.name())));
        }
        Ok(Some(isa))
    }

    /// The path's name as `ENGRAM_SIMD` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
        }
    }

    /// All paths this CPU can run, best last.
    pub fn available() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon].into_iter().filter(|i| i.is_available()).collect()
    }
}

/// Activations prepared once per matmul call, in the form the weight format's kernels need.
pub(crate) enum Acts<'a> {
    /// Float weights multiply f32 activations directly.
    F32(&'a [f32]),
    /// 32-element formats (Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4): Q8_0-style activation
    /// blocks (with the block sums `s` that make them ggml's Q8_1 for Q4_1 / Q5_1).
    Q8(ActQ8),
    /// K-quants and IQ4_XS: Q8_K activation blocks.
    Q8K(ActQ8K),
}

impl<'a> Acts<'a> {
    /// Quantizes/wraps `n` activation rows for weights of type `dtype`.
    pub(crate) fn prepare(dtype: DType, x: &'a [f32], n: usize, cols: usize) -> Acts<'a> {
        match dtype {
            DType::F32 | DType::F16 | DType::BF16 => Acts::F32(x),
            DType::Q4_0 => Acts::Q8(ActQ8::new(x, n, cols, 8)),
            DType::Q8_0 => Acts::Q8(ActQ8::new(x, n, cols, 128)),
            DType::Q5_0 => Acts::Q8(ActQ8::new(x, n, cols, 16)),
            DType::Q4_1 | DType::Q5_1 => Acts::Q8(ActQ8::new(x, n, cols, 0)),
            // Table values made unsigned by +128 on the VNNI path, as Q8_0's.
            DType::IQ4NL | DType::MXFP4 => Acts::Q8(ActQ8::new(x, n, cols, 128)),
            DType::Q4K | DType::Q6K | DType::Q2K | DType::Q3K | DType::Q5K | DType::IQ4XS | DType::IQ3XXS | DType::IQ3S => {
                Acts::Q8K(ActQ8K::new(x, n, cols))
            }
        }
    }
}

/// Everything a tile kernel needs besides the tile coordinates.
pub(crate) struct TileCtx<'a> {
    /// The weights.
    pub w: &'a WeightMatrix<'a>,
    /// Prepared activations.
    pub acts: &'a Acts<'a>,
    /// Output base pointer (`out[t * ldo + r]`).
    pub out: *mut f32,
    /// Output row stride (= `w.rows`).
    pub ldo: usize,
}

// SAFETY: the raw output pointer is only written through disjoint tiles (see `run_tile`).
unsafe impl Send for TileCtx<'_> {}
unsafe impl Sync for TileCtx<'_> {}

/// The next pass's tokens when `remaining` tokens of a call are left to sweep in passes of at
/// most `max`: the fewest passes, as even as they go (`9, max 8`: 5 then 4, not 8 then 1;
/// `13, max 4`: 4, 3, 3, 3). A short last pass costs about as much per row as a full one
/// (the weights are unpacked once per pass, whatever its tokens), so an uneven split made a
/// 9-row step (8 drafts) pay for nearly a tenth pass-row of unpacking. Every token's result is
/// the same whatever its pass, so only time changes.
pub(crate) fn even_pass(remaining: usize, max: usize) -> usize {
    let passes = remaining.div_ceil(max.max(1)).max(1);
    remaining.div_ceil(passes)
}

/// Largest (rows, tokens) tile the path handles in one kernel call for `dtype` in a call of
/// `n_tokens` tokens. AVX2 float tiles of several tokens keep to 3 rows (F16: 2), so the
/// accumulators, the converted weights and the activation fit its 16 registers: 4 × 4 tiles
/// spilled, and on Zen 1 a 256-token BF16 prefill ran at 20.4–21.1 tok/s against 29.1–29.4
/// with 3 × 4 tiles, F16 at 20.2–21.3 against 24.4–24.7 with 2 × 4 (`bench speed`, llama-1b,
/// 2 threads; `docs/cpu-kernels.md`). One-token calls keep 4 rows, which stream best.
pub(crate) fn tile_limits(isa: Isa, dtype: DType, n_tokens: usize) -> (usize, usize) {
    match (isa, dtype) {
        (Isa::Scalar | Isa::Neon, _) => (1, 1),
        (_, DType::Q4K | DType::Q6K) => (1, 4),
        (Isa::Avx2, DType::F16) if n_tokens > 1 => (2, 4),
        (Isa::Avx2, DType::F32 | DType::BF16) if n_tokens > 1 => (3, 4),
        _ => (4, 4),
    }
}

/// Runs one tile: rows `r0..r0+nr`, tokens `t0..t0+nt` (within [`tile_limits`]).
///
/// # Safety
/// `isa` must be available, the tile must be in bounds, and no other thread may write the
/// same output elements concurrently.
pub(crate) unsafe fn run_tile(isa: Isa, c: &TileCtx, r0: usize, nr: usize, t0: usize, nt: usize) {
    match isa {
        Isa::Scalar => scalar::tile(c, r0, nr, t0, nt),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => avx2::tile(c, r0, nr, t0, nt),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 | Isa::Amx => avx512::tile(c, r0, nr, t0, nt),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::tile(c, r0, nr, t0, nt),
        #[allow(unreachable_patterns)]
        _ => scalar::tile(c, r0, nr, t0, nt),
    }
}

/// Expands a runtime `(nr, nt)` in 1..=4 × 1..=4 into a call of `f::<pre.., NR, NT>(args)`.
#[allow(unused_macros)]
macro_rules! tile_dispatch {
    ($nr:expr, $nt:expr, $f:ident [$($pre:tt),*] ($($arg:expr),*)) => {
        match ($nr, $nt) {
            (1, 1) => $f::<$($pre,)* 1, 1>($($arg),*),
            (1, 2) => $f::<$($pre,)* 1, 2>($($arg),*),
            (1, 3) => $f::<$($pre,)* 1, 3>($($arg),*),
            (1, 4) => $f::<$($pre,)* 1, 4>($($arg),*),
            (2, 1) => $f::<$($pre,)* 2, 1>($($arg),*),
            (2, 2) => $f::<$($pre,)* 2, 2>($($arg),*),
            (2, 3) => $f::<$($pre,)* 2, 3>($($arg),*),
            (2, 4) => $f::<$($pre,)* 2, 4>($($arg),*),
            (3, 1) => $f::<$($pre,)* 3, 1>($($arg),*),
            (3, 2) => $f::<$($pre,)* 3, 2>($($arg),*),
            (3, 3) => $f::<$($pre,)* 3, 3>($($arg),*),
            (3, 4) => $f::<$($pre,)* 3, 4>($($arg),*),
            (4, 1) => $f::<$($pre,)* 4, 1>($($arg),*),
            (4, 2) => $f::<$($pre,)* 4, 2>($($arg),*),
            (4, 3) => $f::<$($pre,)* 4, 3>($($arg),*),
            (4, 4) => $f::<$($pre,)* 4, 4>($($arg),*),
            _ => unreachable!("tile {}x{} out of range", $nr, $nt),
        }
    };
}
#[allow(unused_imports)]
pub(crate) use tile_dispatch;

#[cfg(test)]
mod tests {
    use super::even_pass;

    /// The passes a call of `n` tokens is swept in.
    fn passes(n: usize, max: usize) -> Vec<usize> {
        let (mut t0, mut out) = (0, Vec::new());
        while t0 < n {
            let nt = even_pass(n - t0, max);
            out.push(nt);
            t0 += nt;
        }
        out
    }

    #[test]
    fn passes_are_the_fewest_and_as_even_as_they_go() {
        for max in 1..=16 {
            for n in 1..=70 {
                let p = passes(n, max);
                assert_eq!(p.iter().sum::<usize>(), n);
                assert_eq!(p.len(), n.div_ceil(max), "n {n} max {max}: {p:?} is not the fewest passes");
                let (lo, hi) = (p.iter().min().unwrap(), p.iter().max().unwrap());
                assert!(*hi <= max && hi - lo <= 1, "n {n} max {max}: {p:?}");
            }
        }
        assert_eq!(passes(9, 8), [5, 4]);
        assert_eq!(passes(17, 8), [6, 6, 5]);
        assert_eq!(passes(13, 4), [4, 3, 3, 3]);
        assert_eq!(passes(8, 8), [8]);
    }
}
