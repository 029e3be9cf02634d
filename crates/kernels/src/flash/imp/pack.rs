//! Packing a chunk's stored rows (f32, f16, Q8_0, Q4_0) into bf16 tiles: keys as `A` tiles of
//! `K`, values as `A` tiles of `Vᵀ` in the (key `j`, key `j + 16`) pairing.

use std::arch::x86_64::*;

use super::vector::*;
use super::{Flash, Line, Rows, CHUNK, T};

/// Queries (times `scale`) as `B` tiles, per block of 16 rows and dim half of 32: line `j`
/// holds dims `2j, 2j + 1` of each row `n` as dword `n`, split into a hi tile and the lo tile
/// after it ([`split_pair`]); missing rows and dims are zero. Each row's 16 dim pairs are one
/// vector, so a block is 16 rows split and one dword transpose per tile.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn pack_queries(q: &[f32], rows: usize, hd: usize, scale: f32, qp: &mut [Line]) {
    let (halves, scale) = (hd.div_ceil(32), _mm512_set1_ps(scale));
    let load = |r: usize, d0: usize| {
        if r < rows && d0 < hd {
            _mm512_mul_ps(_mm512_loadu_ps(q.as_ptr().add(r * hd + d0)), scale)
        } else {
            _mm512_setzero_ps()
        }
    };
    for b in 0..rows.div_ceil(16) {
        for h in 0..halves {
            let (mut hi, mut lo) = ([_mm512_setzero_ps(); 16], [_mm512_setzero_ps(); 16]);
            for n in 0..16 {
                let (h_bits, l_bits) = split_pair(load(16 * b + n, 32 * h), load(16 * b + n, 32 * h + 16));
                (hi[n], lo[n]) = (_mm512_castsi512_ps(h_bits), _mm512_castsi512_ps(l_bits));
            }
            transpose16(&mut hi);
            transpose16(&mut lo);
            let base = qp.as_mut_ptr().add((b * halves + h) * 2 * T);
            for j in 0..16 {
                _mm512_store_ps(base.add(j) as *mut f32, hi[j]);
                _mm512_store_ps(base.add(T + j) as *mut f32, lo[j]);
            }
        }
    }
}

impl Flash {
    /// A chunk's keys and values into slot `slot` ([`Self::pack_keys`], and
    /// [`Self::pack_values_f16`] for f16 rows, else [`Self::pack_values`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c")]
    pub(super) unsafe fn pack_chunk<const EXACT: bool>(&mut self, keys: Rows<'_>, values: Rows<'_>, n: usize, slot: usize) {
        self.pack_keys::<EXACT>(keys, n, slot);
        match values {
            Rows::F16(v) => self.pack_values_f16::<EXACT>(v, n, slot),
            _ => self.pack_values::<EXACT>(values, n, slot),
        }
    }

    /// Keys as `A` tiles: line `i` of (key half `kh`, dim half `h`) = key `16·kh + i`'s
    /// dims `32h .. 32h + 32`, split into hi and lo tiles; missing keys and dims are zero.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c")]
    pub(super) unsafe fn pack_keys<const EXACT: bool>(&mut self, keys: Rows<'_>, n: usize, slot: usize) {
        let (hd, halves) = (self.hd, self.halves);
        let kp = self.k.as_mut_ptr().add(slot * self.k_lines);
        let line = |key: usize, h: usize| kp.add((key / 16 * halves + h) * self.pair);
        for key in 0..n {
            for h in 0..halves {
                let (a, b) = match keys {
                    // One 64-byte load per line.
                    Rows::F16(x) => halves_to_ps(load_halves((x.as_ptr() as *const u16).add(key * hd + h * 32), hd - h * 32)),
                    _ => (load16(keys, key, 2 * h, hd), load16(keys, key, 2 * h + 1, hd)),
                };
                store_bf16::<EXACT, false>(line(key, h), key % 16, a, b);
            }
        }
        let zero = _mm512_setzero_ps();
        for key in n..CHUNK {
            for h in 0..halves {
                store_bf16::<EXACT, false>(line(key, h), key % 16, zero, zero);
            }
        }
    }

    /// Values as `A` tiles of `Vᵀ`: line `r` of dim block `db` = dim `16·db + r` over the
    /// chunk's 32 keys (missing keys zero), split into hi and lo tiles, keys paired
    /// (`j`, `j + 16`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c")]
    pub(super) unsafe fn pack_values<const EXACT: bool>(&mut self, values: Rows<'_>, n: usize, slot: usize) {
        let hd = self.hd;
        let vp = self.v.as_mut_ptr().add(slot * self.v_lines);
        let vt = &mut self.vt;
        for kb in 0..CHUNK / 16 {
            for db in 0..hd / 16 {
                let mut r = [_mm512_setzero_ps(); 16];
                for (i, row) in r.iter_mut().enumerate() {
                    let key = kb * 16 + i;
                    if key < n {
                        *row = load16(values, key, db, hd);
                    }
                }
                transpose16(&mut r);
                for (i, row) in r.iter().enumerate() {
                    _mm512_storeu_ps(vt.as_mut_ptr().add((db * 16 + i) * CHUNK + kb * 16), *row);
                }
            }
        }
        for d in 0..hd {
            let (db, r) = (d / 16, d % 16);
            // Word pairs (key j, key j + 16): the pairing the softmax writes `Pᵀ` in.
            let (x0, x1) = (_mm512_loadu_ps(vt.as_ptr().add(d * CHUNK)), _mm512_loadu_ps(vt.as_ptr().add(d * CHUNK + 16)));
            store_bf16::<EXACT, true>(vp.add(db * self.pair), r, x0, x1);
        }
    }

    /// [`Self::pack_values`] from f16 rows, without a word-by-word transpose: rows `j` and
    /// `j + 16` are interleaved into dword pairs (one `vpunpck` per 16 dims), which a 16×16
    /// dword transpose turns into `Vᵀ` lines already in the (key j, key j + 16) pairing.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16,f16c")]
    pub(super) unsafe fn pack_values_f16<const EXACT: bool>(&mut self, values: &[u8], n: usize, slot: usize) {
        let hd = self.hd;
        let vp = self.v.as_mut_ptr().add(slot * self.v_lines);
        let parts = self.halves;
        let src = values.as_ptr() as *const u16;
        let row = |key: usize, part: usize| {
            if key < n {
                load_halves(src.add(key * hd + part * 32), hd - part * 32)
            } else {
                _mm512_setzero_si512()
            }
        };
        // Pair vectors, per (part, low/high interleave): 16 dwords for 16 dims, one per j.
        let mut r = [_mm512_setzero_ps(); 16];
        for part in 0..parts {
            for upper in [false, true] {
                for (j, rj) in r.iter_mut().enumerate() {
                    let (a, b) = (row(j, part), row(j + 16, part));
                    let w = if upper { _mm512_unpackhi_epi16(a, b) } else { _mm512_unpacklo_epi16(a, b) };
                    *rj = _mm512_castsi512_ps(w);
                }
                transpose16(&mut r);
                // Line i of the transpose holds the dims that dword i of the pair vectors
                // held: within each 128-bit lane L, words 0-3 (low) or 4-7 (high) of 8.
                for (i, line) in r.iter().enumerate() {
                    let d = part * 32 + (i / 4) * 8 + usize::from(upper) * 4 + i % 4;
                    if d >= hd {
                        continue;
                    }
                    let (a, b) = halves_to_ps(_mm512_castps_si512(*line));
                    let (db, rr) = (d / 16, d % 16);
                    store_bf16::<EXACT, false>(vp.add(db * self.pair), rr, a, b);
                }
            }
        }
    }
}
