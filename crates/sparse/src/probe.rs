//! What a sparse read loses, measured on the read itself: per query head, the exact softmax
//! mass of the chosen keys and the relative error of the attention output over them, both
//! against every visible key, in f64.
//!
//! Invariant: a selection of every visible key records mass 1 and error 0 (up to f64
//! rounding); sums are per layer, so means are per layer and overall.

use std::sync::Mutex;

use engram_model::KvRead;
use half::f16;

use crate::keys::HeadKeys;

/// Per layer: sums of recalled mass and of output relative error, and the query heads counted.
pub struct Probe {
    sums: Mutex<Vec<(f64, f64, usize)>>,
}

impl Probe {
    /// A probe for `layers` layers.
    pub fn new(layers: usize) -> Probe {
        Probe { sums: Mutex::new(vec![(0.0, 0.0, 0); layers]) }
    }

    /// Records one read: `sel` (sorted positions) chosen out of keys `0..=position`.
    pub fn record(&self, read: &KvRead<'_>, keys: HeadKeys<'_>, values: &[f16], sel: &[u32]) {
        let d = keys.dim();
        let n = (read.positions[0] as usize + 1).min(keys.len());
        let mut k = vec![0f32; n * d];
        keys.rows(0..n, &mut k);
        let mut chosen = vec![false; n];
        sel.iter().filter(|&&t| (t as usize) < n).for_each(|&t| chosen[t as usize] = true);
        let (mut mass, mut err, mut count) = (0.0, 0.0, 0);
        let mut s = vec![0f64; n];
        for q in read.queries.chunks_exact(d) {
            for (v, x) in s.iter_mut().zip(k.chunks_exact(d)) {
                *v = q.iter().zip(x).map(|(a, b)| (*a as f64) * (*b as f64)).sum();
            }
            let m = s.iter().fold(f64::NEG_INFINITY, |a, &b| a.max(b));
            let (mut z_all, mut z_sel) = (0.0, 0.0);
            let (mut o_all, mut o_sel) = (vec![0f64; d], vec![0f64; d]);
            for t in 0..n {
                let w = (s[t] - m).exp();
                z_all += w;
                let row = &values[t * d..(t + 1) * d];
                for (o, v) in o_all.iter_mut().zip(row) {
                    *o += w * v.to_f64();
                }
                if chosen[t] {
                    z_sel += w;
                    for (o, v) in o_sel.iter_mut().zip(row) {
                        *o += w * v.to_f64();
                    }
                }
            }
            mass += z_sel / z_all;
            let (mut num, mut den) = (0.0, 0.0);
            for (a, b) in o_all.iter().zip(&o_sel) {
                let (a, b) = (a / z_all, if z_sel > 0.0 { b / z_sel } else { 0.0 });
                num += (a - b) * (a - b);
                den += a * a;
            }
            err += (num / den.max(f64::MIN_POSITIVE)).sqrt();
            count += 1;
        }
        let mut sums = self.sums.lock().expect("probe lock");
        let e = &mut sums[read.layer];
        e.0 += mass;
        e.1 += err;
        e.2 += count;
    }

    /// Per layer: (mean mass recalled, mean output relative error, query heads counted).
    pub fn per_layer(&self) -> Vec<(f64, f64, usize)> {
        self.sums.lock().expect("probe lock").iter().map(|&(m, e, c)| (m / c.max(1) as f64, e / c.max(1) as f64, c)).collect()
    }

    /// Over all layers: (mean mass recalled, mean output relative error, query heads counted).
    pub fn overall(&self) -> (f64, f64, usize) {
        let s = self.sums.lock().expect("probe lock");
        let (m, e, c) = s.iter().fold((0.0, 0.0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2));
        (m / c.max(1) as f64, e / c.max(1) as f64, c)
    }

    /// Forgets what was recorded.
    pub fn reset(&self) {
        self.sums.lock().expect("probe lock").iter_mut().for_each(|e| *e = (0.0, 0.0, 0));
    }
}
