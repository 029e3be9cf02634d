//! [`stream_read`]: reads a buffer once on the kernel pool the way a GEMV reads its weights,
//! to measure the memory read bandwidth that bounds decode (`engram bench membw`).
//!
//! The buffer is split into contiguous chunks, about 8 per thread like [`crate::matmul`]'s
//! row chunks, taken from the same [`crate::pool`]; each chunk is read front to back with
//! 32-byte loads (AVX2 where available) into four independent accumulators, so the only
//! limit is how fast memory delivers the bytes.

use rayon::prelude::*;

/// Reads every byte of `buf` exactly once on the global kernel pool and returns a wrapping
/// checksum (the sum of its little-endian u64 words, so the reads cannot be optimised away).
/// The checksum is the same whatever the thread count or instruction set.
pub fn stream_read(buf: &[u8]) -> u64 {
    let threads = crate::pool::num_threads();
    if threads <= 1 || buf.len() < (1 << 20) {
        return read_chunk(buf);
    }
    // Chunks are whole 4 KiB pages so no chunk boundary splits a u64 word.
    let chunk = buf.len().div_ceil(threads * 8).div_ceil(4096) * 4096;
    crate::pool::pool().install(|| buf.par_chunks(chunk).map(read_chunk).reduce(|| 0, u64::wrapping_add))
}

/// Checksum of one chunk: the wrapping sum of its u64 words (tail bytes zero-extended).
fn read_chunk(c: &[u8]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if crate::simd::Isa::Avx2.is_available() {
        // SAFETY: AVX2 checked just above.
        return unsafe { read_chunk_avx2(c) };
    }
    read_chunk_scalar(c)
}

fn read_chunk_scalar(c: &[u8]) -> u64 {
    let mut acc = [0u64; 4];
    let mut it = c.chunks_exact(32);
    for b in &mut it {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = a.wrapping_add(u64::from_le_bytes(b[8 * k..8 * k + 8].try_into().unwrap()));
        }
    }
    acc.iter().fold(0u64, |s, &a| s.wrapping_add(a)).wrapping_add(tail_sum(it.remainder()))
}

/// Sum of the u64 words of a < 32-byte tail, the last partial word zero-extended.
fn tail_sum(t: &[u8]) -> u64 {
    t.chunks(8).fold(0u64, |s, w| {
        let mut b = [0u8; 8];
        b[..w.len()].copy_from_slice(w);
        s.wrapping_add(u64::from_le_bytes(b))
    })
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn read_chunk_avx2(c: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let n = c.len() / 128 * 128;
    let p = c.as_ptr();
    let mut a = [_mm256_setzero_si256(); 4];
    let mut i = 0;
    while i < n {
        for k in 0..4 {
            a[k] = _mm256_add_epi64(a[k], _mm256_loadu_si256(p.add(i + 32 * k) as *const __m256i));
        }
        i += 128;
    }
    let s = _mm256_add_epi64(_mm256_add_epi64(a[0], a[1]), _mm256_add_epi64(a[2], a[3]));
    let mut lanes = [0u64; 4];
    _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, s);
    let rest = &c[n..];
    lanes.iter().fold(0u64, |s, &v| s.wrapping_add(v)).wrapping_add(read_chunk_scalar(rest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(buf: &[u8]) -> u64 {
        tail_sum(buf)
    }

    #[test]
    fn checksum_matches_the_plain_word_sum_for_any_length_and_thread_count() {
        let buf: Vec<u8> = (0..3_000_017u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for len in [0, 1, 7, 8, 31, 32, 127, 128, 129, 4096 + 5, 1 << 20, buf.len()] {
            let want = reference(&buf[..len]);
            assert_eq!(read_chunk_scalar(&buf[..len]), want, "scalar, len {len}");
            assert_eq!(read_chunk(&buf[..len]), want, "dispatched, len {len}");
            assert_eq!(stream_read(&buf[..len]), want, "pool, len {len}");
        }
    }
}
