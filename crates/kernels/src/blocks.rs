//! Byte layouts of the ggml blocks and small helpers to read their fields from unaligned
//! byte slices. Everything that knows an offset inside a block lives here (or is documented
//! with a reference to a constant here), so the layouts are written down exactly once.
//!
//! Layouts (ggml-common.h):
//! * Q8_0 (34 B):  `d: f16 @0`, `qs: [i8; 32] @2`.
//! * Q4_0 (18 B):  `d: f16 @0`, `qs: [u8; 16] @2`; low nibble of `qs[j]` is element `j`,
//!   high nibble is element `j + 16`; value = (q − 8)·d.
//! * Q4_K (144 B): `d: f16 @0`, `dmin: f16 @2`, `scales: [u8; 12] @4`, `qs: [u8; 128] @16`.
//!   Sub-block `j` (32 elements) has 6-bit scale/min from [`scale_min_k4`]; the 64 elements of
//!   chunk `c` (sub-blocks 2c, 2c+1) are the low/high nibbles of `qs[32c..32c+32]`;
//!   value = d·sc·q − dmin·m.
//! * Q6_K (210 B): `ql: [u8; 128] @0`, `qh: [u8; 64] @128`, `scales: [i8; 16] @192`,
//!   `d: f16 @208`; see `dequant::dequant_q6k_block` for the bit arrangement; value = d·sc·(q − 32).

use half::{bf16, f16};

/// Elements per Q8_0 / Q4_0 block.
pub const QK: usize = 32;
/// Elements per K-quant super-block.
pub const QK_K: usize = 256;

/// Q4_K field offsets.
pub const Q4K_SCALES: usize = 4;
/// Offset of the nibbles in a Q4_K block.
pub const Q4K_QS: usize = 16;
/// Offset of `qh` in a Q6_K block.
pub const Q6K_QH: usize = 128;
/// Offset of the i8 scales in a Q6_K block.
pub const Q6K_SCALES: usize = 192;
/// Offset of `d` in a Q6_K block.
pub const Q6K_D: usize = 208;

/// Reads a little-endian f16 at `b[off..off+2]` as f32.
#[inline(always)]
pub fn f16_at(b: &[u8], off: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Reads a little-endian bf16 at `b[off..off+2]` as f32.
#[inline(always)]
pub fn bf16_at(b: &[u8], off: usize) -> f32 {
    bf16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// Writes `v` rounded to f16 at `b[off..off+2]`; returns the stored value as f32.
#[inline(always)]
pub fn put_f16(b: &mut [u8], off: usize, v: f32) -> f32 {
    let h = f16::from_f32(v);
    b[off..off + 2].copy_from_slice(&h.to_bits().to_le_bytes());
    h.to_f32()
}

/// ggml's `get_scale_min_k4`: the 6-bit (scale, min) of sub-block `j` (0..8) of a Q4_K block
/// from its 12 packed scale bytes.
#[inline(always)]
pub fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// All eight (scale, min) pairs of a Q4_K block, unpacked (same values as [`scale_min_k4`]).
///
/// Uses ggml's word-wise trick (kmask1/2/3 in the AVX2 `vec_dot_q4_K_q8_K`): a handful of
/// 32-bit shifts and masks instead of per-byte branches — this runs once per row and
/// super-block in every Q4_K kernel, so it is hot in GEMV.
#[inline(always)]
pub fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    let u = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let s0 = u0 & K1;
    let s1 = (u2 & K2) | (((u0 >> 6) & K3) << 4);
    let m0 = u1 & K1;
    let m1 = ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4);
    let cat = |a: u32, b: u32| ((a as u64) | ((b as u64) << 32)).to_le_bytes();
    (cat(s0, s1), cat(m0, m1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_mins_k4_matches_per_index() {
        let mut x = 0x1234_5678u32;
        for _ in 0..1000 {
            let q: Vec<u8> = (0..12)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            let (s, m) = scales_mins_k4(&q);
            for j in 0..8 {
                assert_eq!((s[j], m[j]), scale_min_k4(j, &q), "j={j} q={q:?}");
            }
        }
    }
}
