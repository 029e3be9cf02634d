//! Software prefetch of the packed kernels' weight streams.
//!
//! A matmul's first pass over a row chunk (its first token tile) reads the chunk's weights
//! from DRAM: a decode step's only pass, for any number of batched sessions, and a prefill
//! tile's first of several. Later passes find the chunk in L2 and skip the prefetch.
//!
//! Measured on the Zen 4 EPYC (`engram bench kernels --rows 16384 --cols 4096 --threads 1
//! --clock cpu --stat min`, a 38 MB matrix, larger than the L3; `docs/cpu-kernels.md`):
//! without it, 4- and 8-token calls of Q4_0 and Q8_0 took 1.2–1.6× the CPU time they take
//! with it, and Q4_K's 1.1–1.4×; 1-token calls of Q4_0 / Q8_0 gain less, and those of Q4_K /
//! Q6_K lose 15–70% (the hardware prefetchers keep up with their 1–2 KiB group-blocks alone),
//! so the K kernels prefetch only in calls of several tokens. Distances of about 0.5 to 4 KiB
//! were within the noise of each other; 8 KiB was slower.
//!
//! A prefetch is a hint: it never faults, even past the end of the packing, and changes no
//! result.

use std::arch::x86_64::*;

/// How far ahead of the group-block being multiplied the prefetch reads, in bytes (rounded to
/// whole group-blocks, at least one).
const AHEAD_BYTES: usize = 1536;

/// Prefetches, into L1, the group-block about [`AHEAD_BYTES`] past `b` (`gbb`: the bytes of
/// one group-block of the stream).
#[inline(always)]
pub(crate) unsafe fn group_block_ahead(b: *const u8, gbb: usize) {
    let ahead = b.wrapping_add((AHEAD_BYTES / gbb).max(1) * gbb);
    let mut o = 0;
    while o < gbb {
        _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(o) as *const i8);
        o += 64;
    }
}
