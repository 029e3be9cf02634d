//! What the sparse tests share.
#![allow(dead_code)] // each test binary uses its own subset

/// A deterministic pseudo-random stream in [-1, 1) (xorshift; the same for a seed on every run).
pub fn noise(seed: u64, n: usize) -> Vec<f32> {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}
