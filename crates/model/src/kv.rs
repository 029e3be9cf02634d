//! The interface through which attention reads and writes keys and values.
//!
//! The model never owns a cache (the cache is passed in from outside): the
//! KV store implements [`KvCache`] for one sequence and the
//! forward pass calls it. Keys are stored *after* RoPE, so attention reads
//! them without rotating; moving cached tokens to new positions is the KV
//! store's job (it re-rotates by the position delta).
//!
//! Invariant: a chunk's keys sit at positions `first_pos .. first_pos + len`
//! unless it names them one by one (`positions`); a chunk may be masked per
//! key; chunks may come in any order (the online softmax does not care) and
//! make up the sequence's *view* (`view.rs`). A query at position `p`
//! attends exactly to the keys of the view at positions `<= p` whose mask
//! (and the step's [`crate::KeyMask`] bit, if any) is set.

use half::f16;

/// Element formats of stored keys and values. Quantized formats hold each
/// token-head row as groups of `group` elements: an f16 scale then the codes
/// (Q8: one i8 per element; Q4: byte `j` holds element `j` in its low nibble
/// and element `j + group/2` in its high nibble, value = (code - 8) * scale).
/// With `group == 32` these are exactly ggml's Q8_0 and Q4_0 blocks, so the
/// kernels' SIMD decoders read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvElem {
    F32,
    F16,
    Q8 { group: usize },
    Q4 { group: usize },
}

impl KvElem {
    /// Bytes of one token-head row of `head_dim` elements.
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvElem::F32 => 4 * head_dim,
            KvElem::F16 => 2 * head_dim,
            KvElem::Q8 { group } => head_dim / group * (2 + group),
            KvElem::Q4 { group } => head_dim / group * (2 + group / 2),
        }
    }

    /// Decodes one row into `out` (`head_dim` floats).
    pub fn decode_row(self, row: &[u8], out: &mut [f32]) {
        use engram_kernels::{dequantize_row, DType};
        match self {
            KvElem::F32 => dequantize_row(DType::F32, row, out),
            KvElem::F16 => dequantize_row(DType::F16, row, out),
            KvElem::Q8 { group: 32 } => dequantize_row(DType::Q8_0, row, out),
            KvElem::Q4 { group: 32 } => dequantize_row(DType::Q4_0, row, out),
            KvElem::Q8 { group } => {
                for (o, g) in out.chunks_exact_mut(group).zip(row.chunks_exact(2 + group)) {
                    let d = f16::from_le_bytes([g[0], g[1]]).to_f32();
                    for (x, &q) in o.iter_mut().zip(&g[2..]) {
                        *x = d * (q as i8) as f32;
                    }
                }
            }
            KvElem::Q4 { group } => {
                for (o, g) in out.chunks_exact_mut(group).zip(row.chunks_exact(2 + group / 2)) {
                    let d = f16::from_le_bytes([g[0], g[1]]).to_f32();
                    let half = group / 2;
                    for (j, &b) in g[2..].iter().enumerate() {
                        o[j] = d * ((b & 0x0f) as i32 - 8) as f32;
                        o[j + half] = d * ((b >> 4) as i32 - 8) as f32;
                    }
                }
            }
        }
    }

    /// Encodes one row of `head_dim` floats into `out` (`row_bytes` bytes).
    pub fn encode_row(self, x: &[f32], out: &mut [u8]) {
        match self {
            KvElem::F32 => {
                for (b, v) in out.chunks_exact_mut(4).zip(x) {
                    b.copy_from_slice(&v.to_le_bytes());
                }
            }
            KvElem::F16 => {
                for (b, v) in out.chunks_exact_mut(2).zip(x) {
                    b.copy_from_slice(&f16::from_f32(*v).to_le_bytes());
                }
            }
            KvElem::Q8 { group } => {
                for (g, xs) in out.chunks_exact_mut(2 + group).zip(x.chunks_exact(group)) {
                    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let d = amax / 127.0;
                    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                    g[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                    for (q, v) in g[2..].iter_mut().zip(xs) {
                        *q = ((v * inv).round().clamp(-127.0, 127.0) as i8) as u8;
                    }
                }
            }
            KvElem::Q4 { group } => {
                for (g, xs) in out.chunks_exact_mut(2 + group / 2).zip(x.chunks_exact(group)) {
                    let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let d = amax / 7.0;
                    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
                    g[..2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
                    let half = group / 2;
                    for (j, b) in g[2..].iter_mut().enumerate() {
                        let q0 = ((xs[j] * inv).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
                        let q1 = ((xs[j + half] * inv).round().clamp(-8.0, 7.0) as i32 + 8) as u8;
                        *b = q0 | (q1 << 4);
                    }
                }
            }
        }
    }
}

/// The storage of one chunk's keys or values: rows of `elem.row_bytes(head_dim)`
/// bytes laid out `[num_kv_heads][capacity]` (head-major, so one head's
/// tokens are contiguous and attention streams them).
#[derive(Clone, Copy, Debug)]
pub struct KvData<'a> {
    pub elem: KvElem,
    pub bytes: &'a [u8],
}

/// A run of cached tokens for one layer, as attention sees it.
#[derive(Clone, Copy, Debug)]
pub struct KvChunk<'a> {
    /// Position of the first token (and of token `i`, `first_pos + i`, unless `positions` is given).
    pub first_pos: usize,
    /// Position of each token (`len` entries), for tokens at arbitrary positions.
    pub positions: Option<&'a [u32]>,
    /// Number of the chunk's first key in the view (the order the cache yields keys), which a
    /// [`crate::KeyMask`] addresses.
    pub key_index: usize,
    /// Number of valid tokens.
    pub len: usize,
    /// Token rows reserved per head (>= `len`): head `h`'s token `t` is row `h * capacity + t`.
    pub capacity: usize,
    pub keys: KvData<'a>,
    pub values: KvData<'a>,
    /// `Some(mask)`: token `i` is attended only if `mask[i]`.
    pub mask: Option<&'a [bool]>,
    /// The same layer's key and value bytes of a chunk further on (same layout and capacity
    /// as `keys` / `values`), for attention to prefetch while it works on this one; never read
    /// for a result. `None` where there is none or the cache does not say.
    pub ahead: Option<(&'a [u8], &'a [u8])>,
}

/// One sequence's KV cache, as the forward pass uses it.
pub trait KvCache: Send + Sync {
    /// Stores `num_tokens` tokens' keys and values for `layer` at positions
    /// `first_pos ..`. `keys`/`values` are `[num_tokens, num_kv_heads * head_dim]`,
    /// keys already rotated. Space must have been reserved by the caller of
    /// the forward pass, so this does not fail for lack of room.
    fn write(&mut self, layer: usize, first_pos: usize, keys: &[f32], values: &[f32], num_tokens: usize);

    /// Gives the tokens stored from slot `first_slot` on (this step's, `positions.len()` of
    /// them) the logical positions `positions`, before they are written. Called by the forward
    /// pass for steps with explicit positions. The default refuses: such a cache stores every
    /// token at its slot's position.
    fn place(&mut self, first_slot: usize, positions: &[u32]) -> Result<(), String> {
        let _ = (first_slot, positions);
        Err("this KV cache keeps every token at its slot's position".into())
    }

    /// Calls `f` with every chunk of `layer` (every KV head's rows), in the view's order.
    fn for_each_chunk(&self, layer: usize, f: &mut dyn FnMut(&KvChunk<'_>));

    /// Calls `f` with the chunks attention reads for one KV head and these queries: the view
    /// of `read.kv_head` (a cache may select a subset per head, or fetch rows that are not in
    /// RAM before handing them over). Key numbering ([`KvChunk::key_index`]) is the same for
    /// every head. The default is every chunk of [`KvCache::for_each_chunk`].
    fn for_each_chunk_of(&self, read: &crate::KvRead<'_>, f: &mut dyn FnMut(&KvChunk<'_>)) {
        self.for_each_chunk(read.layer, f)
    }

    /// Why this cache could not answer a read or write exactly (e.g. its disk store failed
    /// under a running sequence), once that happened. Sticky: a failed cache stays failed.
    /// The forward pass checks it after every layer and ends the step with it as
    /// [`crate::ModelError::Kv`], so a chunk a cache could not produce is never attended
    /// silently. Default: never fails.
    fn read_failure(&self) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_rows_round_trip_within_their_step() {
        let x: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.13).collect();
        for (elem, tol) in [
            (KvElem::F32, 0.0),
            (KvElem::F16, 2e-3),
            (KvElem::Q8 { group: 32 }, 0.012),
            (KvElem::Q4 { group: 32 }, 0.11),
            (KvElem::Q8 { group: 16 }, 0.012),
            (KvElem::Q4 { group: 16 }, 0.11),
        ] {
            let mut bytes = vec![0u8; elem.row_bytes(64)];
            elem.encode_row(&x, &mut bytes);
            let mut y = vec![0f32; 64];
            elem.decode_row(&bytes, &mut y);
            let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = x.iter().zip(&y).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / amax;
            assert!(err <= tol, "{elem:?}: {err}");
        }
        assert_eq!(KvElem::Q4 { group: 32 }.row_bytes(64) * 100 / KvElem::F16.row_bytes(64), 28);
    }

    #[test]
    fn group_32_decoders_agree_with_the_generic_ones() {
        // The SIMD (ggml) decoders and the generic loops must read the same layout.
        let x: Vec<f32> = (0..64).map(|i| ((i * 53 % 29) as f32 - 14.0) * 0.07).collect();
        for elem in [KvElem::Q8 { group: 32 }, KvElem::Q4 { group: 32 }] {
            let mut bytes = vec![0u8; elem.row_bytes(64)];
            elem.encode_row(&x, &mut bytes);
            let mut fast = vec![0f32; 64];
            elem.decode_row(&bytes, &mut fast);
            let mut slow = vec![0f32; 64];
            for (g, o) in bytes.chunks_exact(bytes.len() / 2).zip(slow.chunks_exact_mut(32)) {
                let d = f16::from_le_bytes([g[0], g[1]]).to_f32();
                for j in 0..32 {
                    o[j] = match elem {
                        KvElem::Q8 { .. } => d * (g[2 + j] as i8) as f32,
                        _ => d * (if j < 16 { g[2 + j] & 15 } else { g[2 + j - 16] >> 4 } as i32 - 8) as f32,
                    };
                }
            }
            assert_eq!(fast, slow, "{elem:?}");
        }
    }
}
