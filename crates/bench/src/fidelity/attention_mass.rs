//! Attention mass recalled: of the exact attention each query puts on its keys, the share
//! that falls on the keys an approximation keeps.
//!
//! [`MassRecorder`] wraps the exact path's cache for the scored steps and sees what attention
//! sees (the view contract, `engram_model::view`): per layer and KV head, the rotated, scaled
//! queries and every chunk of keys. It recomputes each query head's scores `q·k` over the
//! keys it may see (position `<=` its own, chunk mask set) and, per [`KeepRule`], the log of
//! the softmax mass on the kept keys. The cache's own answers pass through unchanged, so the
//! exact logits are those of the plain exact path.
//!
//! Invariant: a rule that keeps every key recalls exactly 1; the mean is over (scored token,
//! layer, query head).

use std::sync::Mutex;

use engram_model::kv::{KvCache, KvChunk};
use engram_model::KvRead;

/// Which keys an approximation keeps for a query: `keep(query_pos, key_pos)`.
pub type KeepRule = Box<dyn Fn(usize, usize) -> bool + Send + Sync>;

/// Running `ln Σ exp` in f64.
#[derive(Clone, Copy)]
struct Lse {
    max: f64,
    sum: f64,
}

impl Lse {
    const EMPTY: Lse = Lse { max: f64::NEG_INFINITY, sum: 0.0 };

    fn add(&mut self, x: f64) {
        if x > self.max {
            self.sum = self.sum * (self.max - x).exp() + 1.0;
            self.max = x;
        } else {
            self.sum += (x - self.max).exp();
        }
    }

    fn value(self) -> f64 {
        self.max + self.sum.ln()
    }
}

/// A cache that records, per rule, the attention mass its keys would recall.
pub struct MassRecorder<'a> {
    pub inner: &'a mut dyn KvCache,
    pub rules: &'a [KeepRule],
    /// Per rule: sum of recalled mass and the number of (token, layer, query head) it covers.
    pub totals: Mutex<Vec<(f64, usize)>>,
    pub head_dim: usize,
}

impl<'a> MassRecorder<'a> {
    pub fn new(inner: &'a mut dyn KvCache, rules: &'a [KeepRule], head_dim: usize) -> Self {
        MassRecorder { inner, rules, totals: Mutex::new(vec![(0.0, 0); rules.len()]), head_dim }
    }

    /// Per rule, the mean mass recalled so far.
    pub fn means(&self) -> Vec<(f64, usize)> {
        self.totals.lock().expect("recorder lock").clone()
    }

    fn record(&self, read: &KvRead<'_>, chunk: &KvChunk<'_>, all: &mut [Lse], kept: &mut [Lse], key: &mut [f32]) {
        let hd = self.head_dim;
        let rb = chunk.keys.elem.row_bytes(hd);
        let rows = read.queries.len() / hd;
        for t in 0..chunk.len {
            if chunk.mask.is_some_and(|m| !m[t]) {
                continue;
            }
            let kpos = chunk.positions.map_or(chunk.first_pos + t, |p| p[t] as usize);
            let row = read.kv_head * chunk.capacity + t;
            let mut decoded = false;
            for r in 0..rows {
                let qpos = read.positions[r / read.group] as usize;
                if kpos > qpos {
                    continue;
                }
                if !decoded {
                    chunk.keys.elem.decode_row(&chunk.keys.bytes[row * rb..(row + 1) * rb], key);
                    decoded = true;
                }
                let q = &read.queries[r * hd..(r + 1) * hd];
                let s = q.iter().zip(key.iter()).map(|(a, b)| (a * b) as f64).sum::<f64>();
                all[r].add(s);
                for (i, rule) in self.rules.iter().enumerate() {
                    if rule(qpos, kpos) {
                        kept[i * rows + r].add(s);
                    }
                }
            }
        }
    }
}

impl KvCache for MassRecorder<'_> {
    fn write(&mut self, layer: usize, first_pos: usize, keys: &[f32], values: &[f32], num_tokens: usize) {
        self.inner.write(layer, first_pos, keys, values, num_tokens)
    }

    fn place(&mut self, first_slot: usize, positions: &[u32]) -> Result<(), String> {
        self.inner.place(first_slot, positions)
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        self.inner.for_each_chunk(layer, f)
    }

    fn read_failure(&self) -> Option<String> {
        self.inner.read_failure()
    }

    fn for_each_chunk_of(&self, read: &KvRead<'_>, f: &mut dyn FnMut(&KvChunk<'_>)) {
        let rows = read.queries.len() / self.head_dim;
        let mut all = vec![Lse::EMPTY; rows];
        let mut kept = vec![Lse::EMPTY; rows * self.rules.len()];
        let mut key = vec![0f32; self.head_dim];
        self.inner.for_each_chunk_of(read, &mut |chunk| {
            self.record(read, chunk, &mut all, &mut kept, &mut key);
            f(chunk);
        });
        let mut totals = self.totals.lock().expect("recorder lock");
        for (i, total) in totals.iter_mut().enumerate() {
            for (r, a) in all.iter().enumerate() {
                let k = kept[i * rows + r];
                total.0 += if k.sum > 0.0 { (k.value() - a.value()).exp() } else { 0.0 };
                total.1 += 1;
            }
        }
    }
}
