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
//! * Q4_1 (20 B):  `d: f16 @0`, `m: f16 @2`, `qs: [u8; 16] @4` (nibbles as Q4_0); value = q·d + m.
//! * Q5_0 (22 B):  `d: f16 @0`, `qh: u32 @2`, `qs: [u8; 16] @6`; element `j` is nibble `j` (as
//!   Q4_0) with bit `j` of `qh` as its fifth bit ([`q5_value`]); value = (q − 16)·d.
//! * Q5_1 (24 B):  `d: f16 @0`, `m: f16 @2`, `qh: u32 @4`, `qs: [u8; 16] @8`; value = q·d + m.
//! * IQ4_NL (18 B): `d: f16 @0`, `qs: [u8; 16] @2` (nibbles as Q4_0); value = d·[`KVALUES_IQ4NL`][q].
//! * MXFP4 (17 B): `e: E8M0 @0`, `qs: [u8; 16] @1` (nibbles as Q4_0); value =
//!   [`e8m0_half`]`(e)`·[`KVALUES_MXFP4`][q].
//! * Q2_K (84 B):  `scales: [u8; 16] @0` (low nibble scale, high nibble min, per 16 elements),
//!   `qs: [u8; 64] @16`, `d: f16 @80`, `dmin: f16 @82`; [`q2k_value`]; value = d·sc·q − dmin·m.
//! * Q3_K (110 B): `hmask: [u8; 32] @0`, `qs: [u8; 64] @32`, `scales: [u8; 12] @96`, `d: f16 @108`;
//!   [`q3k_value`], [`q3k_scales`]; value = d·(sc − 32)·q, q in −4..3.
//! * Q5_K (176 B): `d: f16 @0`, `dmin: f16 @2`, `scales: [u8; 12] @4` (as Q4_K), `qh: [u8; 32] @16`,
//!   `qs: [u8; 128] @48`; [`q5k_value`]; value = d·sc·q − dmin·m per 32 elements.
//! * IQ4_XS (136 B): `d: f16 @0`, `scales_h: u16 @2`, `scales_l: [u8; 4] @4`, `qs: [u8; 128] @8`
//!   (16 bytes of nibbles per 32 elements, as Q4_0); [`iq4xs_scales`]; value = d·(ls − 32)·table[q].

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

/// Offset of the nibbles in a Q4_1 block.
pub const Q4_1_QS: usize = 4;
/// Offsets of `qh` and the nibbles in a Q5_0 block.
pub const Q5_0_QH: usize = 2;
/// Offset of the nibbles in a Q5_0 block.
pub const Q5_0_QS: usize = 6;
/// Offset of `qh` in a Q5_1 block.
pub const Q5_1_QH: usize = 4;
/// Offset of the nibbles in a Q5_1 block.
pub const Q5_1_QS: usize = 8;
/// Offset of `qs` in a Q2_K block.
pub const Q2K_QS: usize = 16;
/// Offset of `d` in a Q2_K block (`dmin` follows).
pub const Q2K_D: usize = 80;
/// Offset of `qs` in a Q3_K block (`hmask` is at 0).
pub const Q3K_QS: usize = 32;
/// Offset of the packed scales in a Q3_K block.
pub const Q3K_SCALES: usize = 96;
/// Offset of `d` in a Q3_K block.
pub const Q3K_D: usize = 108;
/// Offset of `qh` in a Q5_K block (scales at [`Q4K_SCALES`] as in Q4_K).
pub const Q5K_QH: usize = 16;
/// Offset of the nibbles in a Q5_K block.
pub const Q5K_QS: usize = 48;
/// Offset of the nibbles in an IQ4_XS block.
pub const IQ4XS_QS: usize = 8;

/// ggml's `kvalues_iq4nl`: the 16 values IQ4_NL / IQ4_XS nibbles index.
pub const KVALUES_IQ4NL: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];
/// ggml's `kvalues_mxfp4`: the E2M1 (FP4) values, doubled, that MXFP4 nibbles index.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// ggml's `ggml_e8m0_to_fp32_half`: half of the E8M0 scale `2^(x − 127)`, exactly (subnormal
/// for x < 2), so that `e8m0_half(e) · KVALUES_MXFP4[q]` is the MXFP4 value.
#[inline(always)]
pub fn e8m0_half(x: u8) -> f32 {
    f32::from_bits(if x < 2 { 0x0020_0000u32 << x } else { ((x as u32) - 1) << 23 })
}

/// Nibble `j` (0..32) of a 32-element block's 16 quant bytes: low nibble of `qs[j]` for
/// `j < 16`, high nibble of `qs[j − 16]` otherwise (the Q4_0 arrangement).
#[inline(always)]
pub fn nibble32(qs: &[u8], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0xF
    } else {
        qs[j - 16] >> 4
    }
}

/// The 5-bit value (0..32) of element `j` of a Q5_0 / Q5_1 block: nibble `j` of `qs` with bit
/// `j` of the little-endian `qh` word as its fifth bit.
#[inline(always)]
pub fn q5_value(qh: u32, qs: &[u8], j: usize) -> u8 {
    nibble32(qs, j) | ((((qh >> j) & 1) as u8) << 4)
}

/// The little-endian `u32` at `b[off..off + 4]`.
#[inline(always)]
pub fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// The 2-bit value (0..4) of element `i` of a Q2_K block: for half `n = i / 128`, `k = (i % 128)
/// / 32`, `l = i % 32`, bits `2k..2k+2` of `qs[32n + l]`. Its scale/min byte is `scales[i / 16]`.
#[inline(always)]
pub fn q2k_value(b: &[u8], i: usize) -> i32 {
    let (n, k, l) = (i / 128, (i % 128) / 32, i % 32);
    ((b[Q2K_QS + 32 * n + l] >> (2 * k)) & 3) as i32
}

/// The signed value (−4..4) of element `i` of a Q3_K block: low 2 bits as [`q2k_value`] (from
/// `qs` at [`Q3K_QS`]); minus 4 unless bit `4n + k` of `hmask[l]` is set.
#[inline(always)]
pub fn q3k_value(b: &[u8], i: usize) -> i32 {
    let (n, k, l) = (i / 128, (i % 128) / 32, i % 32);
    let lo = ((b[Q3K_QS + 32 * n + l] >> (2 * k)) & 3) as i32;
    let hi = (b[l] >> (4 * n + k)) & 1;
    lo - if hi != 0 { 0 } else { 4 }
}

/// The 16 scales of a Q3_K block plus 32 (0..64, the stored 6 bits), four per u32: scale
/// `4w + i` in byte `i` of word `w`. Scale `j` has low 4 bits from nibble `j / 8` of
/// `scales[j % 8]` (word `w % 2`, shifted by 4 for `w ≥ 2`) and high 2 bits from bits
/// `2(j / 4)..` of `scales[8 + j % 4]` (word 2's bits `2w..2w + 2` per byte).
#[inline(always)]
pub fn q3k_scale_words(b: &[u8]) -> [u32; 4] {
    const LOW: u32 = 0x0f0f_0f0f;
    const HIGH: u32 = 0x0303_0303;
    let s = &b[Q3K_SCALES..Q3K_SCALES + 12];
    let u = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (u0, u1, u2) = (u(0), u(1), u(2));
    [
        (u0 & LOW) | ((u2 & HIGH) << 4),
        (u1 & LOW) | (((u2 >> 2) & HIGH) << 4),
        ((u0 >> 4) & LOW) | (((u2 >> 4) & HIGH) << 4),
        ((u1 >> 4) & LOW) | (((u2 >> 6) & HIGH) << 4),
    ]
}

/// The 16 scales of a Q3_K block minus 32 (−32..32), in order ([`q3k_scale_words`]'s bytes).
#[inline(always)]
pub fn q3k_scales(b: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (o, byte) in out.iter_mut().zip(q3k_scale_words(b).iter().flat_map(|w| w.to_le_bytes())) {
        *o = (byte as i8).wrapping_sub(32);
    }
    out
}

/// Writes the 16 scales of a Q3_K block (each plus 32: 0..64, the stored 6 bits) into its 12
/// scale bytes — the inverse of [`q3k_scale_words`]: low 4 bits in nibble `j / 8` of byte
/// `j % 8`, high 2 bits at bits `2(j / 4)` of byte `8 + j % 4`.
pub fn put_q3k_scales(b: &mut [u8], scales: &[u8; 16]) {
    let s = &mut b[Q3K_SCALES..Q3K_SCALES + 12];
    s.fill(0);
    for (j, &u) in scales.iter().enumerate() {
        s[j % 8] |= (u & 0xF) << (4 * (j / 8));
        s[8 + j % 4] |= (u >> 4) << (2 * (j / 4));
    }
}

/// The 5-bit value (0..32) of element `i` of a Q5_K block: for chunk `c = i / 64`, `k = (i %
/// 64) / 32`, `l = i % 32`, nibble `k` of `qs[32c + l]` plus bit `2c + k` of `qh[l]` as the
/// fifth bit. Its scale/min are those of sub-block `i / 32` ([`scale_min_k4`]).
#[inline(always)]
pub fn q5k_value(b: &[u8], i: usize) -> i32 {
    let (c, k, l) = (i / 64, (i % 64) / 32, i % 32);
    let q = b[Q5K_QS + 32 * c + l];
    let lo = if k == 0 { q & 0xF } else { q >> 4 };
    let hi = (b[Q5K_QH + l] >> (2 * c + k)) & 1;
    (lo | (hi << 4)) as i32
}

/// The 8 sub-block scales of an IQ4_XS block minus 32 (−32..32): low 4 bits from nibble `j % 2`
/// of `scales_l[j / 2]`, high 2 bits from bits `2j..2j+2` of `scales_h`.
#[inline(always)]
pub fn iq4xs_scales(b: &[u8]) -> [i32; 8] {
    let h = u16::from_le_bytes([b[2], b[3]]);
    let mut out = [0i32; 8];
    for (j, o) in out.iter_mut().enumerate() {
        let lo = (b[4 + j / 2] >> (4 * (j % 2))) & 0xF;
        let hi = ((h >> (2 * j)) & 3) as u8;
        *o = (lo | (hi << 4)) as i32 - 32;
    }
    out
}

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
    fn q3k_scales_match_per_index() {
        let mut x = 0x9e37_79b9u32;
        for _ in 0..1000 {
            let mut b = vec![0u8; Q3K_SCALES + 12];
            for v in b.iter_mut() {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *v = x as u8;
            }
            let s = &b[Q3K_SCALES..];
            let got = q3k_scales(&b);
            for (j, g) in got.iter().enumerate() {
                let lo = (s[j % 8] >> (4 * (j / 8))) & 0xF;
                let hi = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
                assert_eq!(*g, (lo | (hi << 4)) as i8 - 32, "j={j} s={s:?}");
            }
            // Writing the scales back gives the same 12 bytes (a bijection).
            let mut back = b.clone();
            put_q3k_scales(&mut back, &got.map(|v| (v + 32) as u8));
            assert_eq!(back, b, "put_q3k_scales inverts q3k_scales");
        }
    }

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
