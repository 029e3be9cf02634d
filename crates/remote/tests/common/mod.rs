//! A real `redis-server` per test (`engram_remote::testing`), and KV to store.
//!
//! Without `redis-server` on the PATH a test is skipped (a line on stderr), except under
//! `CI=true`, where it fails: CI installs Redis from Debian's packages.

#![allow(dead_code)]

use engram_kv::{KvFormat, KvLayout, KvPool, SeqKv};
use engram_model::KvCache;

pub const LAYOUT: KvLayout = KvLayout { num_layers: 2, num_kv_heads: 2, head_dim: 64 };
pub const VOCAB: usize = 1000;
pub const FP: &str = "0123456789abcdef-f16";

pub use engram_remote::testing::{free_port, redis_available, TestRedis as Redis};

pub fn pool(format: KvFormat) -> KvPool {
    KvPool::new(LAYOUT, format, 256 << 20)
}

/// `n` tokens of deterministic pseudo-random keys and values.
pub fn make_kv(pool: &KvPool, n: usize, seed: u64) -> SeqKv {
    let mut kv = SeqKv::new(pool);
    let w = LAYOUT.num_kv_heads * LAYOUT.head_dim;
    kv.reserve(n).unwrap();
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x >> 40) as f32 / (1u64 << 24) as f32 * 4.0 - 2.0
    };
    for layer in 0..LAYOUT.num_layers {
        let k: Vec<f32> = (0..n * w).map(|_| next()).collect();
        let v: Vec<f32> = (0..n * w).map(|_| next()).collect();
        kv.write(layer, 0, &k, &v, n);
    }
    kv
}

/// `head` followed by `tail`'s rows: the KV of a conversation that shares `head` and then goes
/// its own way (`head` shares its blocks, the rest is written anew).
pub fn extended(head: &SeqKv, tail: &SeqKv) -> SeqKv {
    let (at, n) = (head.len(), tail.len());
    let mut kv = head.fork(at);
    kv.reserve(n).unwrap();
    for l in 0..LAYOUT.num_layers {
        let (k, v) = tail.read_rows(l, 0..n);
        kv.write(l, at, &k, &v, n);
    }
    kv
}

/// Every layer's key and value rows of tokens `0..n`, and the recent window.
pub fn rows(kv: &SeqKv, n: usize) -> (Vec<(Vec<f32>, Vec<f32>)>, Option<Vec<u8>>) {
    ((0..LAYOUT.num_layers).map(|l| kv.read_rows(l, 0..n)).collect(), kv.window().map(<[u8]>::to_vec))
}

/// Token ids and a text of one word per token, with each token's byte end.
pub fn conversation(n: usize, seed: u32) -> (Vec<u32>, String, Vec<usize>) {
    let mut text = String::new();
    let mut ends = Vec::new();
    let tokens: Vec<u32> = (0..n as u32).map(|i| (i * 37 + seed) % VOCAB as u32).collect();
    for t in &tokens {
        text.push_str(&format!("w{t} "));
        ends.push(text.len());
    }
    (tokens, text, ends)
}
