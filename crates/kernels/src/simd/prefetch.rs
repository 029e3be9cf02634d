//! Software prefetch of the packed kernels' weight streams.
//!
//! A matmul's first pass over a row chunk (its first token tile) reads the chunk's weights
//! from DRAM: a decode step's only pass, for any number of batched sessions, and a prefill
//! tile's first of several. Calls of several tokens prefetch on that pass; later passes find
//! the chunk in L2 and skip it. One-token calls prefetch on the packed Q2_K / Q3_K streams and
//! in the 512-bit kernels (which take one-token calls only where a CPU's table row says so,
//! `dispatch::wide_one_token`), not in the AVX2 Q4_0 / Q8_0 / Q4_1 / Q4_K / Q6_K kernels.
//!
//! Measured on the Zen 4 EPYC (`engram bench kernels --rows 32000 --cols 2048 --threads 1
//! --clock cpu --stat min`, a matrix larger than the 32 MiB L3, and `engram bench step` on the
//! llama-1b Q4_0 and Q4_K_M files; `docs/cpu-kernels.md`):
//! - Into L2 (`prefetcht1`), [`AHEAD_K`] = 8 KiB ahead for the Q4_K / Q6_K streams and
//!   [`AHEAD_Q`] = 4 KiB for Q4_0 / Q8_0 / Q4_1: a 4-row Q4_K_M step cost 1.18–1.20× a one-row
//!   step against 1.60–1.62× with the earlier 1.5 KiB into L1, a Q4_0 one 1.36–1.37× against
//!   1.53–1.62×. Into L1 at 4–8 KiB was slower (it evicts the activations).
//! - The 512-bit Q4_0 / Q8_0 / Q4_1 kernels, which read two 8-row groups side by side, now
//!   prefetch the next pair of groups where a pair is small enough ([`pair_ahead`]): a 4-row
//!   Q4_0 step 1.08–1.15× a one-row step against 1.22–1.58× with 4 KiB (`bench step`).
//! - One-token calls read faster with the hardware prefetchers alone: the AVX2 Q4_0 / Q8_0
//!   kernels at 34–45 / 58–68 ns per row without, 48–54 / 83–92 with the 1.5 KiB prefetch.
//!   Except packed Q2_K and Q3_K, whose kernels spend the most operations per weight byte: on
//!   Zen 1 (`cargo bench -p engram-kernels --bench packed`, 8192 × 2048, 2 threads) one-token
//!   Q3_K ran 787–922 µs without and 575–600 with [`AHEAD_K`] (Q4_K, Q5_K, Q6_K and IQ4_XS
//!   did not gain: 2–5% slower from L2, within the noise from DRAM).
//! - The 512-bit kernels' one-token calls, on the Intel Xeon family 6 model 207 (`bench
//!   kernels --rows 32768 --cols 16384 --tokens 1 --threads 2 --stat min`, ns per row, three
//!   rounds each): Q4_0 384–403 → 358–398, Q8_0 705–801 → 559–684, Q4_K 454–480 → 389–442, Q6_K
//!   668–1050 → 510–568 with the prefetch; `bench step`'s one-row step 1.03–1.31× faster on
//!   the Q4_0 / Q8_0 / Q4_K_M / Q6_K files.
//!
//! A prefetch is a hint: it never faults, even past the end of the packing, and changes no
//! result.

use std::arch::x86_64::*;

/// Prefetch distance of the Q4_K / Q6_K streams (1,184 / 1,680-byte group-blocks), in bytes.
pub(crate) const AHEAD_K: usize = 8192;

/// Prefetch distance of the Q4_0 / Q8_0 / Q4_1 streams (144–272-byte group-blocks), in bytes.
pub(crate) const AHEAD_Q: usize = 4096;

/// The largest pair of 8-row groups (bytes) that the 512-bit Q4_0 / Q8_0 / Q4_1 kernels
/// prefetch a whole pair ahead ([`pair_ahead`]).
pub(crate) const PAIR_AHEAD_MAX: usize = 40 * 1024;

/// Prefetch distance of the 512-bit Q4_0 / Q8_0 / Q4_1 kernels, which read two consecutive
/// 8-row groups (`group_bytes` each) side by side: the same block of the **next pair** (`2 ×
/// group_bytes` ahead) while a pair is at most [`PAIR_AHEAD_MAX`], else [`AHEAD_Q`]. Measured
/// on the Zen 4 EPYC (`bench kernels --threads 2 --stat min`, matrices larger than the L3, ns
/// per row-token at 2 / 4 / 8 tokens): Q4_0 2048 columns (18 KiB pairs) 15.2 / 9.2–9.7 /
/// 7.9–8.3 with 4 KiB, 9.4–9.8 / 7.1 / 7.1 a pair ahead; Q4_0 4096 columns (36 KiB) 16.3–16.4
/// → 13.9–14.5 at 4 tokens; Q8_0 2048 columns (34 KiB) 8.6–8.7 → 7.2–7.5 at 8 tokens; but
/// Q4_0 8192 columns (72 KiB pairs) 30.8–31.1 at 4 tokens with 4 KiB, 32.4–33.0 a pair ahead.
pub(crate) fn pair_ahead(group_bytes: usize) -> usize {
    if 2 * group_bytes <= PAIR_AHEAD_MAX {
        2 * group_bytes
    } else {
        AHEAD_Q
    }
}

/// Prefetches, into L2, the group-block about `AHEAD` bytes past `b` (`gbb`: the bytes of one
/// group-block of the stream; rounded to whole group-blocks, at least one).
#[inline(always)]
pub(crate) unsafe fn group_block_ahead<const AHEAD: usize>(b: *const u8, gbb: usize) {
    group_block_at(b, AHEAD, gbb)
}

/// [`group_block_ahead`] with the distance `ahead` (bytes) known only at run time.
#[inline(always)]
pub(crate) unsafe fn group_block_at(b: *const u8, ahead: usize, gbb: usize) {
    let ahead = b.wrapping_add((ahead / gbb).max(1) * gbb);
    let mut o = 0;
    while o < gbb {
        _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(o) as *const i8);
        o += 64;
    }
}
