//! KV quantization schemes simulated in f32, for `engram bench fidelity`'s alternative rows
//! (the measurement behind the choice of `q8`/`q4`: `docs/kv-formats.md#which-4-bit-scheme`).
//!
//! [`SimQuantKv`] holds values quantized and dequantized at the point a real format would;
//! attention then reads f32. The schemes:
//! * `q4-no-window`: the shipped `q4` without its f16 recent window (what it was before);
//! * `q4-sim`: the shipped `q4` simulated (a check that the simulation is faithful: it should
//!   match the `q4` row closely);
//! * `q4_1+window`: asymmetric 4-bit (scale + minimum per group of 32, like ggml Q4_1) per
//!   token, with the window;
//! * `kivi4`: KIVI — keys per channel (each head dimension's 32 values of a block share a scale
//!   and minimum), values per token, both asymmetric 4-bit, with the window (KIVI needs it: a
//!   channel group is only complete when the block is);
//! * `kivi4-sym`: the same split with symmetric groups (one scale, Q4_0 arithmetic), so it
//!   costs exactly what `q4` costs.

use engram_kv::KvFormat;
use engram_model::kv::{KvCache, KvChunk, KvData, KvElem};
use half::f16;

/// Tokens per block, as in the KV store.
const BLOCK: usize = 32;

/// A quantization scheme simulated by [`SimQuantKv`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scheme {
    /// ggml Q4_0 per token as each row is written, no window (what `q4` was before the window).
    Q4NoWindow,
    /// ggml Q4_0 per token, applied when a block fills: the shipped `q4` (a check of the simulation).
    Q4Window,
    /// Asymmetric 4-bit per token (group 32 along dims), when a block fills.
    Q41Window,
    /// Keys per channel over the block's 32 tokens, values per token; asymmetric 4-bit.
    Kivi4,
    /// As `Kivi4` but symmetric (Q4_0 arithmetic: one scale per group), so it costs what `q4` does.
    Kivi4Sym,
}

impl Scheme {
    /// Every scheme, in table order.
    pub const ALL: [Scheme; 5] = [Scheme::Q4NoWindow, Scheme::Q4Window, Scheme::Q41Window, Scheme::Kivi4, Scheme::Kivi4Sym];

    pub fn name(self) -> &'static str {
        match self {
            Scheme::Q4NoWindow => "q4-no-window",
            Scheme::Q4Window => "q4-sim",
            Scheme::Q41Window => "q4_1+window",
            Scheme::Kivi4 => "kivi4",
            Scheme::Kivi4Sym => "kivi4-sym",
        }
    }

    /// Stored bytes per token per KV head (keys + values) for head dimension `hd`, sealed blocks.
    pub fn bytes_per_head_token(self, hd: usize) -> f64 {
        let data = hd as f64 / 2.0;
        let per_token_groups = (hd / 32) as f64;
        match self {
            Scheme::Q4NoWindow | Scheme::Q4Window => 2.0 * (data + 2.0 * per_token_groups),
            Scheme::Q41Window => 2.0 * (data + 4.0 * per_token_groups),
            // Keys: one (scale, min) f16 pair per channel per 32-token block.
            Scheme::Kivi4 => (data + 4.0 * hd as f64 / BLOCK as f64) + (data + 4.0 * per_token_groups),
            Scheme::Kivi4Sym => (data + 2.0 * hd as f64 / BLOCK as f64) + (data + 2.0 * per_token_groups),
        }
    }
}

/// An f32 KV cache holding exactly what `scheme` would give back: tokens of the last, partial
/// block are kept as written (except `Q4NoWindow`, quantized at once); when a block fills, its
/// keys and values are replaced by their quantize → dequantize round trip.
pub struct SimQuantKv {
    scheme: Scheme,
    heads: usize,
    hd: usize,
    /// Per layer: blocks of `[heads][BLOCK][hd]` f32 (keys, values).
    blocks: Vec<Vec<(Vec<f32>, Vec<f32>)>>,
    len: Vec<usize>,
}

impl SimQuantKv {
    pub fn new(scheme: Scheme, layers: usize, heads: usize, hd: usize) -> Self {
        SimQuantKv { scheme, heads, hd, blocks: vec![Vec::new(); layers], len: vec![0; layers] }
    }

    /// Tokens stored (every layer holds them once a forward step is done).
    pub fn len(&self) -> usize {
        self.len.last().copied().unwrap_or(0)
    }

    fn seal(&mut self, layer: usize, block: usize) {
        let (hd, scheme) = (self.hd, self.scheme);
        let (k, v) = &mut self.blocks[layer][block];
        // Per head: `BLOCK` rows of `hd`.
        for (kf, vf) in k.chunks_exact_mut(BLOCK * hd).zip(v.chunks_exact_mut(BLOCK * hd)) {
            match scheme {
                Scheme::Q4NoWindow => {} // quantized as written, in `write`
                Scheme::Q4Window => {
                    kf.chunks_exact_mut(hd).for_each(q4_row_round_trip);
                    vf.chunks_exact_mut(hd).for_each(q4_row_round_trip);
                }
                Scheme::Q41Window => {
                    kf.chunks_exact_mut(32).for_each(asym4_round_trip);
                    vf.chunks_exact_mut(32).for_each(asym4_round_trip);
                }
                Scheme::Kivi4 | Scheme::Kivi4Sym => {
                    let sym = scheme == Scheme::Kivi4Sym;
                    // Channel d of this head's block: elements d, d + hd, ... (stride hd).
                    for d in 0..hd {
                        let mut ch: Vec<f32> = (0..BLOCK).map(|t| kf[t * hd + d]).collect();
                        if sym {
                            q4_row_round_trip(&mut ch);
                        } else {
                            asym4_round_trip(&mut ch);
                        }
                        for t in 0..BLOCK {
                            kf[t * hd + d] = ch[t];
                        }
                    }
                    if sym {
                        vf.chunks_exact_mut(hd).for_each(q4_row_round_trip);
                    } else {
                        vf.chunks_exact_mut(32).for_each(asym4_round_trip);
                    }
                }
            }
        }
    }
}

impl KvCache for SimQuantKv {
    fn write(&mut self, layer: usize, first_pos: usize, keys: &[f32], values: &[f32], num_tokens: usize) {
        let (heads, hd) = (self.heads, self.hd);
        let width = heads * hd;
        for t in 0..num_tokens {
            let pos = first_pos + t;
            let (b, slot) = (pos / BLOCK, pos % BLOCK);
            while self.blocks[layer].len() <= b {
                let size = heads * BLOCK * hd;
                self.blocks[layer].push((vec![0.0; size], vec![0.0; size]));
            }
            let (k, v) = &mut self.blocks[layer][b];
            for h in 0..heads {
                let (dst, src) = ((h * BLOCK + slot) * hd, t * width + h * hd);
                let (kr, vr) = (&mut k[dst..dst + hd], &mut v[dst..dst + hd]);
                kr.copy_from_slice(&keys[src..src + hd]);
                vr.copy_from_slice(&values[src..src + hd]);
                if self.scheme == Scheme::Q4NoWindow {
                    q4_row_round_trip(kr);
                    q4_row_round_trip(vr);
                }
            }
            self.len[layer] = self.len[layer].max(pos + 1);
            if slot == BLOCK - 1 {
                self.seal(layer, b);
            }
        }
    }

    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>)) {
        for (b, (k, v)) in self.blocks[layer].iter().enumerate() {
            let len = self.len[layer].saturating_sub(b * BLOCK).min(BLOCK);
            // `KvElem::F32` rows are little-endian f32: the native layout on every target we build.
            f(&KvChunk {
                first_pos: b * BLOCK,
                positions: None,
                key_index: b * BLOCK,
                len,
                capacity: BLOCK,
                keys: KvData { elem: KvElem::F32, bytes: bytemuck::cast_slice(k) },
                values: KvData { elem: KvElem::F32, bytes: bytemuck::cast_slice(v) },
                mask: None,
                ahead: None,
            });
        }
    }
}

/// The shipped `q4` round trip of one row (`KvFormat::Q4`'s groups: 32 where the row divides).
fn q4_row_round_trip(row: &mut [f32]) {
    let elem = KvFormat::Q4.elem(row.len());
    let mut enc = vec![0u8; elem.row_bytes(row.len())];
    elem.encode_row(row, &mut enc);
    elem.decode_row(&enc, row);
}

/// Asymmetric 4-bit round trip of one group: `x ≈ min + q·scale`, `q ∈ 0..=15`, scale and
/// minimum stored as f16 (as ggml Q4_1 and KIVI's kernels do).
fn asym4_round_trip(g: &mut [f32]) {
    let (mn, mx) = g.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
    let scale = f16::from_f32((mx - mn) / 15.0).to_f32();
    let min = f16::from_f32(mn).to_f32();
    for x in g.iter_mut() {
        let q = if scale > 0.0 { ((*x - min) / scale).round().clamp(0.0, 15.0) } else { 0.0 };
        *x = min + q * scale;
    }
}
