//! Q8_K activations transposed so that one 64-byte register holds 16 tokens side by side
//! ([`TokenLanes`]): the layout of the AVX-512 VNNI prefill kernel (`simd/vnni_k.rs`), which
//! broadcasts 4 weight bytes and multiplies them against 16 tokens' 4 activation bytes at once.
//!
//! The values are stored as the signed bytes `x`, or as the unsigned bytes `x + 128`
//! (`vpdpbusd` multiplies an unsigned byte by a signed one: with `x + 128` the weights' side
//! can be signed, and the kernel removes the `128 · Σ w` this adds with one constant per row
//! and super-block).
//!
//! Invariant: a rearrangement of the [`ActQ8K`] it is built from (every value, plus 128 if
//! asked, and every block sum and scale of token `t` sits in lane `t % 16` of group `t / 16`);
//! lanes past the last token hold zero bytes and scales, and their results are never stored.

use crate::blocks::QK_K;
use crate::quantize::ActQ8K;

/// Tokens per group (lanes of a 512-bit register of i32 or f32).
pub(crate) const LANES: usize = 16;

/// One 64-byte, 64-byte-aligned register image (16 × 4 bytes).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Lane64(pub [u8; 64]);

/// The call's activations by 16-token groups: per (group `g`, super-block `i`), `xq` holds 64
/// registers (register `kg`: values `4kg..4kg+4` of the block of each token, as `x` or
/// `x + 128`, token `l` at bytes `4l..4l+4`), `bs16` 8 registers (pair `p`: i16 block sums
/// `2p` and `2p + 1` of 16 values, low and high half of lane `l`), `bs32` 4 registers (pair
/// `p`: the sums of the 32-value sub-blocks `2p` and `2p + 1`), `dx` one register of the 16
/// tokens' f32 scales. The `x + 128` lanes serve the formats without mins, which use no block
/// sums: their `bs16` and `bs32` are empty.
pub(crate) struct TokenLanes {
    /// Super-blocks per token row.
    pub nb: usize,
    /// `(g·nb + i)·64 + kg`.
    pub xq: Vec<Lane64>,
    /// `(g·nb + i)·8 + p`.
    pub bs16: Vec<Lane64>,
    /// `(g·nb + i)·4 + p`.
    pub bs32: Vec<Lane64>,
    /// `g·nb + i`.
    pub dx: Vec<Lane64>,
}

impl TokenLanes {
    /// Transposes every token of `a`; `plus128`: each value stored as `x + 128`.
    pub(crate) fn new(a: &ActQ8K, plus128: bool) -> TokenLanes {
        let nb = a.blocks_per_row;
        let n = a.d.len().checked_div(nb).unwrap_or(0);
        let groups = n.div_ceil(LANES);
        let z = Lane64([0; 64]);
        let sums = if plus128 { 0 } else { groups * nb };
        let mut l =
            TokenLanes { nb, xq: vec![z; groups * nb * 64], bs16: vec![z; sums * 8], bs32: vec![z; sums * 4], dx: vec![z; groups * nb] };
        // Lane64 is 64 plain bytes: view the buffers as 4-byte words (lane `t % 16` of register
        // `j` is word `16j + t % 16`).
        let words = |v: &mut Vec<Lane64>| -> &mut [u32] {
            // SAFETY: Lane64 is repr(C), 64 bytes, align 64 ≥ 4; any bit pattern is a valid u32.
            unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u32, v.len() * 16) }
        };
        let (xq, bs16, bs32, dx) = (
            words(&mut l.xq) as *mut [u32],
            words(&mut l.bs16) as *mut [u32],
            words(&mut l.bs32) as *mut [u32],
            words(&mut l.dx) as *mut [u32],
        );
        // SAFETY: four distinct buffers, each borrowed once.
        let (xq, bs16, bs32, dx) = unsafe { (&mut *xq, &mut *bs16, &mut *bs32, &mut *dx) };
        let pair = |lo: i32, hi: i32| (lo as u32 & 0xFFFF) | ((hi as u32) << 16);
        // `x as u8 ^ 0x80` is `x + 128` for every i8 `x`.
        let flip = if plus128 { 0x8080_8080 } else { 0 };
        for t in 0..n {
            let (g, o) = (t / LANES, t % LANES);
            for i in 0..nb {
                let ab = t * nb + i;
                let lb = g * nb + i;
                let src = &a.qs[ab * QK_K..(ab + 1) * QK_K];
                let dst = &mut xq[lb * 64 * 16..(lb + 1) * 64 * 16];
                for (kg, q) in src.chunks_exact(4).enumerate() {
                    dst[16 * kg + o] = u32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]) ^ flip;
                }
                dx[lb * 16 + o] = a.d[ab].to_bits();
                if plus128 {
                    continue;
                }
                let bs = &a.bsums[ab * 16..(ab + 1) * 16];
                for p in 0..8 {
                    bs16[(lb * 8 + p) * 16 + o] = pair(bs[2 * p] as i32, bs[2 * p + 1] as i32);
                }
                let s = |j: usize| bs[2 * j] as i32 + bs[2 * j + 1] as i32;
                for p in 0..4 {
                    bs32[(lb * 4 + p) * 16 + o] = pair(s(2 * p), s(2 * p + 1));
                }
            }
        }
        l
    }
}
