//! engram-kernels: the hot path of Engram — ggml-compatible quantized weight formats and the
//! matmul kernels that consume them.
//!
//! * [`DType`] / [`WeightMatrix`]: byte-exact ggml block formats (F32, F16, BF16, Q8_0, Q4_0,
//!   Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) viewed in place (e.g.
//!   straight out of an mmapped GGUF).
//! * [`quantize`] / [`dequantize_row`]: conversion to and from f32 (ggml reference quantizers).
//! * [`matmul`]: `out = x · Wᵀ` for any number of tokens, SIMD-dispatched at runtime (AMX-INT8
//!   for Q4_0/Q8_0, AVX-512 VNNI, AVX2, portable scalar) and parallelized over output rows on
//!   [`pool`].
//!
//! * [`activation`]: the SwiGLU activation, vectorized.
//! * [`attn_rows`]: the portable attention path's row-wise loops (scores, softmax step,
//!   value accumulation), AVX2 + FMA where the CPU has them.
//! * [`flash`]: attention of query rows over key/value chunks on AMX-BF16 tiles (where the CPU
//!   has them; callers keep a portable path).
//!
//! Module map: `dtype` (formats, errors), `blocks` (byte layouts), `quantize` (f32 → blocks,
//! activation quantization; `quantize32` and `quantize_k` hold the ports of the newer formats'
//! reference quantizers), `dequant` (blocks → f32), `matmul` (dispatch/tiling/threading),
//! `simd::{scalar, avx2, avx2_q32, avx2_k, k_panel, vnni_k, avx512, amx, neon}` (kernels;
//! `k_panel`: the AVX2 multi-token path of Q5_K/Q3_K/Q2_K/IQ4_XS; `vnni_k`: the AVX-512 VNNI one
//! of those and packed Q4_K/Q6_K, over `token_lanes`' transposed activations), `pool` (thread pool and `team`, the fork-join team of the short parallel regions), `huge` (huge-page buffers for
//! weights), `membw` (read-bandwidth
//! probe for `engram bench membw`), `repack` (Q4_0/Q8_0/Q4_1/Q5_0/Q5_1/IQ4_NL/MXFP4/Q4_K/Q5_K/Q6_K/IQ4_XS/Q2_K in 8-row groups for the AVX2 GEMV).

// Kernels index fixed-size register arrays by row/token on purpose (the loops unroll), keep
// explicit `%` checks (MSRV), and pass many raw tile parameters.
#![allow(
    clippy::needless_range_loop,
    clippy::too_many_arguments,
    clippy::type_complexity,
    clippy::manual_is_multiple_of,
    clippy::missing_safety_doc
)]

pub mod activation;
pub mod attn_rows;
mod blocks;
mod dequant;
pub mod dispatch;
mod dtype;
pub mod flash;
mod huge;
mod iq3;
mod matmul;
mod membw;
mod mxfp4_hf;
mod pool;
mod quantize;
mod quantize32;
mod quantize_iq3;
mod quantize_k;
mod repack;
mod repack_k;
mod serial;
mod simd;
mod team;
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
mod token_lanes;

pub use dequant::dequantize_row;
pub use dtype::{DType, KernelError, WeightMatrix};
pub use huge::{huge_pages_enabled, HugeBytes};
pub use matmul::{matmul, matmul_grouped, matmul_multi, MatmulItem};
pub use membw::stream_read;
pub use mxfp4_hf::mxfp4_rows_from_hf;
pub use pool::{num_threads, parallel_for, pool, set_num_threads};
pub use quantize::quantize;
pub use repack::{repack_enabled, Packed};

/// Internals exposed for tests and benchmarks; not a stable API.
#[doc(hidden)]
pub mod internal {
    pub use crate::matmul::{matmul_grouped_with, matmul_multi_with, matmul_with};
    pub use crate::serial::matmul_serial_with;
    pub use crate::simd::Isa;
}
