//! Chunked k-means on one head's keys (Lloyd's iterations, deterministic strided seeding).
//!
//! Keys are decoded from f16 `CHUNK` tokens at a time, so the peak memory of clustering `n`
//! keys into `k` clusters is `k × dim` centroid floats, `k × dim` f64 sums, one chunk of
//! decoded keys and `n` u32 assignments — never the `n × dim` floats of the whole history.
//!
//! Invariant: the result depends only on the keys and `(k, iters)` (no randomness), every
//! token gets the cluster whose centroid is nearest to it after the last iteration, and no
//! returned cluster is empty.

use crate::keys::{dot, HeadKeys};

/// Tokens decoded per chunk while clustering (bounds the peak memory).
pub const CHUNK: usize = 1024;

/// Mean tokens per cluster at prefill: `k = ceil(n / MEAN_CLUSTER)`. At the default budget of
/// 2,048 tokens a step retrieves about 32 clusters, coarse enough for contiguous reads of
/// 64 × 128 B = 8 KiB of f16 keys per cluster (head dim 64) and fine enough that the
/// representatives still separate what a query wants.
pub const MEAN_CLUSTER: usize = 64;

/// Tokens clustered together at prefill: a longer history is clustered segment by segment
/// (`ceil(8192 / 64) = 128` clusters each), so clustering costs `O(n · 128 · dim)` per
/// iteration — linear in the history, where one global k-means with `k ∝ n` is quadratic
/// (32K tokens: 512 clusters, ~2 TFLOP for a 1B model's 128 heads) — and a segment's keys
/// are neighbours in time, which is where attention's clusters mostly live.
pub const SEGMENT: usize = 8192;

/// The most clusters one k-means run makes (scoring them costs `k × group` dot products a
/// step).
pub const MAX_CLUSTERS: usize = 4096;

/// Clusters for `n` keys clustered together: `ceil(n / MEAN_CLUSTER)`, within `1 ..= MAX_CLUSTERS`.
pub fn cluster_count(n: usize) -> usize {
    n.div_ceil(MEAN_CLUSTER).clamp(1, MAX_CLUSTERS)
}

/// The clusters of `tokens` (ids into `keys`): `(centroids [k' × dim], assignment per token)`
/// with `k' <= k` non-empty clusters numbered `0..k'`.
pub fn kmeans(keys: HeadKeys<'_>, tokens: &[u32], k: usize, iters: usize) -> (Vec<f32>, Vec<u32>) {
    let d = keys.dim();
    let n = tokens.len();
    assert!(n > 0, "kmeans of no tokens");
    let k = k.clamp(1, n);
    // Seeds: k tokens evenly spread over the list (keys drift with position, so a strided
    // pick covers the history's regions).
    let mut cent = vec![0f32; k * d];
    for (c, row) in cent.chunks_exact_mut(d).enumerate() {
        keys.row(tokens[c * n / k] as usize, row);
    }
    let mut assign = vec![0u32; n];
    let mut buf = vec![0f32; CHUNK.min(n) * d];
    let mut half_norm = vec![0f32; k];
    for it in 0..=iters {
        for (h, c) in half_norm.iter_mut().zip(cent.chunks_exact(d)) {
            *h = 0.5 * dot(c, c);
        }
        let mut sums = vec![0f64; k * d];
        let mut counts = vec![0u32; k];
        for (ci, part) in tokens.chunks(CHUNK).enumerate() {
            for (i, &t) in part.iter().enumerate() {
                keys.row(t as usize, &mut buf[i * d..(i + 1) * d]);
            }
            for (i, x) in buf.chunks_exact(d).take(part.len()).enumerate() {
                let best = nearest(x, &cent, &half_norm);
                assign[ci * CHUNK + i] = best as u32;
                counts[best] += 1;
                for (s, v) in sums[best * d..(best + 1) * d].iter_mut().zip(x) {
                    *s += *v as f64;
                }
            }
        }
        if it == iters {
            // Compact away empty clusters (their centroids were never nearest).
            let mut map = vec![u32::MAX; k];
            let mut out = Vec::with_capacity(k * d);
            let mut next = 0u32;
            for c in 0..k {
                if counts[c] > 0 {
                    map[c] = next;
                    next += 1;
                    out.extend_from_slice(&cent[c * d..(c + 1) * d]);
                }
            }
            for a in &mut assign {
                *a = map[*a as usize];
            }
            return (out, assign);
        }
        for c in 0..k {
            if counts[c] > 0 {
                for (x, s) in cent[c * d..(c + 1) * d].iter_mut().zip(&sums[c * d..(c + 1) * d]) {
                    *x = (s / counts[c] as f64) as f32;
                }
            }
        }
    }
    unreachable!("the last iteration returns")
}

/// The centroid nearest to `x`: argmax of `x·c - |c|²/2`.
#[inline]
pub fn nearest(x: &[f32], cent: &[f32], half_norm: &[f32]) -> usize {
    let d = x.len();
    let mut best = (f32::NEG_INFINITY, 0);
    for (c, (row, h)) in cent.chunks_exact(d).zip(half_norm).enumerate() {
        let s = dot(x, row) - h;
        if s > best.0 {
            best = (s, c);
        }
    }
    best.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn separated_groups_are_found_and_every_token_goes_to_its_nearest_centroid() {
        // Three well separated groups of 2-d points, interleaved in token order.
        let pts: Vec<[f32; 2]> = (0..300)
            .map(|i| {
                let g = [(0.0, 0.0), (10.0, 0.0), (0.0, 10.0)][i % 3];
                [g.0 + (i as f32 * 0.37).sin() * 0.5, g.1 + (i as f32 * 0.91).cos() * 0.5]
            })
            .collect();
        let rows: Vec<f16> = pts.iter().flatten().map(|&x| f16::from_f32(x)).collect();
        let keys = HeadKeys::new(&rows, 2);
        let tokens: Vec<u32> = (0..300).collect();
        let (cent, assign) = kmeans(keys, &tokens, 3, 8);
        assert_eq!(cent.len(), 6);
        for i in 0..300 {
            assert_eq!(assign[i], assign[i % 3], "token {i} with its group");
        }
        let hn: Vec<f32> = cent.chunks_exact(2).map(|c| 0.5 * dot(c, c)).collect();
        let mut x = [0f32; 2];
        for (i, a) in assign.iter().enumerate() {
            keys.row(i, &mut x);
            assert_eq!(nearest(&x, &cent, &hn), *a as usize);
        }
    }

    #[test]
    fn cluster_count_follows_the_length() {
        assert_eq!(cluster_count(1), 1);
        assert_eq!(cluster_count(64), 1);
        assert_eq!(cluster_count(65), 2);
        assert_eq!(cluster_count(32768), 512);
        assert_eq!(cluster_count(1 << 30), MAX_CLUSTERS);
    }
}
