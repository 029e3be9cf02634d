//! Q4_K / Q5_K / Q6_K / Q3_K / IQ4_XS / Q2_K layouts of [`crate::Packed`]: 8-row groups, one group-super-block (8 rows ×
//! 256 elements) after another, the layout `simd/avx2_packed_k.rs` streams.
//!
//! Within a group, a 32-byte *register* holds 8 consecutive bytes of 4 rows: rows `0, 1, 4, 5`
//! (half `h = 0`) or `2, 3, 6, 7` (`h = 1`), so after `vpmaddubsw` + `vpmaddwd` with per-row
//! scales one `vphaddd` of the two halves leaves the 8 rows' sums in lane order.
//!
//! Q4_K group-super-block (1,184 bytes for the source's 1,152):
//! * `d` then `dmin`: 8 f16 each, row order (32 bytes);
//! * scales then mins, each 4 pairs × 8 rows × 2 `u8` (`[p][r][j - 2p]` for sub-blocks
//!   `j = 2p, 2p + 1`; 128 bytes): the 6-bit values unpacked, so `vpmovzxbw` gives the i16
//!   pairs `vpmaddwd` takes and no kernel decodes the 12-byte packed form;
//! * nibbles: for chunk `c` (0..4), piece `m` (0..4), half `h` ([`q4k_reg`]): rows'
//!   `qs[32c + 8m ..][..8]` (the file's bytes; low nibbles are elements `64c + 8m + i`, high
//!   ones `64c + 32 + 8m + i`). A piece's two halves are adjacent, so one 64-byte load holds
//!   all 8 rows' bytes of the piece (the AVX-512 kernel's register).
//!
//! Q5_K group-super-block (1,440 bytes for the source's 1,408): Q4_K's `d`, `dmin`, scales and
//! mins (160 bytes), then the fifth bits: for piece `m`, half `h`, the rows' `qh[8m ..][..8]`
//! (the file's bytes: bit `2c` of byte `i` is the fifth bit of element `64c + 8m + i`, bit
//! `2c + 1` of element `64c + 32 + 8m + i`; 256 bytes), then the nibbles in Q4_K's order
//! ([`q5k_reg`]). One fifth-bit register serves its piece's four chunks.
//!
//! Q3_K group-super-block (912 bytes for the source's 880), in Q4_K's halves:
//! * `d`: 8 f16 (16 bytes); the 16 scales `sc − 32` as `i8` in pairs, `[p][r][j − 2p]` for
//!   sub-blocks `j = 2p, 2p + 1` (128 bytes, as Q6_K's), so `vpmovsxbw` gives each row's pair;
//! * a piece `m` (0..4) of a row is its bytes `4m..4m + 4` and `16 + 4m..16 + 4m + 4` of a 32-byte
//!   run, so each of its crumbs holds 4 values of each of two sub-blocks;
//! * the high bits: for piece `m`, half `h`, the rows' `hmask` piece ([`q3k_hm_reg`]; the file's
//!   bytes: bit `4n + j` of `hmask[l]` is the high bit of element `128n + 32j + l`; 256 bytes).
//!   One register serves the piece's eight value registers;
//! * the crumbs: for half-block `n` (0..2), piece `m`, half `h`, the rows' piece of
//!   `qs[32n..32n + 32]` ([`q3k_reg`]; crumb `j` of `qs[32n + l]` is the low 2 bits of element
//!   `128n + 32j + l`; 512 bytes).
//!
//! IQ4_XS group-super-block (1,104 bytes for the source's 1,088), in the 32-element formats'
//! lane-per-row order (`repack.rs`) rather than the halves above:
//! * `d`: 8 f16 (16 bytes); the sub-block scales `ls − 32` as `i8`, `[j][r]` (64 bytes), so 8
//!   bytes give sub-block `j`'s scale of every row;
//! * then the nibbles: register `b / 4` (32 registers) holds, in lane `r`, row `r`'s bytes
//!   `qs[b..b + 4]` for `b % 4 = 0` (register `4j + k` of sub-block `j`: low nibbles elements
//!   `32j + 4k..+4`, high nibbles `32j + 16 + 4k..+4`).
//!
//! Q2_K group-super-block (672 bytes, the source's 8 × 84), one row per lane as IQ4_XS:
//! * `d` then `dmin`: 8 f16 each (32 bytes);
//! * the scale/min bytes in pairs, `[p][r][s − 2p]` for sub-blocks `s = 2p, 2p + 1` (the
//!   file's bytes; 128 bytes), so one 16-byte load widens to each row's pair in its lane;
//! * the crumbs: register `b / 4` (16 registers) holds, in lane `r`, row `r`'s `qs[b..b + 4]`
//!   for `b % 4 = 0` (crumb `j` of `qs[32n + l]` is element `128n + 32j + l`).
//!
//! Q6_K group-super-block (1,680 bytes, the source's 8 × 210):
//! * `d`: 8 f16 (16 bytes); scales: 8 pairs × 8 rows × 2 `i8` (128 bytes);
//! * for chunk `c`: the 6 registers `qh₀, ql₀, ql₁, qh₁, ql₂, ql₃` (`j` = 0..6), each as its
//!   two halves side by side ([`q6k_reg`]), so one 64-byte load holds all 8 rows. With `u` the
//!   6-bit unsigned value `q + 32`: `ql_m` byte `i` of a row holds the low 4 bits of
//!   `u[64c + 8m + i]` (low nibble) and `u[64c + 32 + 8m + i]` (high nibble); `qh_k` byte `i`
//!   holds the top 2 bits of, in bit pairs 0..4: the low and high nibble's elements of
//!   `ql_{2k}`, then of `ql_{2k+1}`. One shift and mask per nibble places them.
//!
//! Invariant: bijective with the source rows (`Packed::unpack_row` gives every row back byte
//! for byte; the 6-bit scale/min packing and the ql/qh bit arrangement are both bijections).

use crate::blocks::{
    iq4xs_scales, put_q3k_scales, q3k_scales, scales_mins_k4, IQ4XS_QS, Q2K_D, Q2K_QS, Q3K_D, Q3K_QS, Q4K_QS, Q4K_SCALES, Q5K_QH, Q5K_QS,
    Q6K_D, Q6K_QH, Q6K_SCALES, QK_K,
};
use crate::dtype::DType;
use crate::repack::GROUP_ROWS;

/// Rows of half `h` (0 or 1) in a register, in byte order (8 bytes each).
pub(crate) const HALF_ROWS: [[usize; 4]; 2] = [[0, 1, 4, 5], [2, 3, 6, 7]];

/// Q4_K: offset of the scale pairs, the min pairs and the nibbles in a group-super-block.
pub(crate) const Q4K_P_SC: usize = 32;
pub(crate) const Q4K_P_MIN: usize = 96;
pub(crate) const Q4K_P_QS: usize = 160;

/// Q4_K: offset in a group-super-block of the nibble register of chunk `c` (0..4), piece `m`
/// (0..4) and half `h` (0..2).
#[inline(always)]
pub(crate) const fn q4k_reg(c: usize, m: usize, h: usize) -> usize {
    Q4K_P_QS + 32 * (8 * c + 2 * m + h)
}
/// Q5_K: offset of the fifth-bit registers and of the nibbles in a group-super-block (the
/// scales and mins sit where Q4_K's do).
pub(crate) const Q5K_P_QH: usize = 160;
pub(crate) const Q5K_P_QS: usize = 416;

/// Q5_K: offset in a group-super-block of the nibble register of chunk `c`, piece `m`, half `h`.
#[inline(always)]
pub(crate) const fn q5k_reg(c: usize, m: usize, h: usize) -> usize {
    Q5K_P_QS + 32 * (8 * c + 2 * m + h)
}

/// Q5_K: offset in a group-super-block of the fifth-bit register of piece `m`, half `h`.
#[inline(always)]
pub(crate) const fn q5k_qh_reg(m: usize, h: usize) -> usize {
    Q5K_P_QH + 32 * (2 * m + h)
}

/// Q3_K: offset of the scale pairs, the high-bit registers and the crumb registers in a
/// group-super-block.
pub(crate) const Q3K_P_SC: usize = 16;
pub(crate) const Q3K_P_HM: usize = 144;
pub(crate) const Q3K_P_QS: usize = 400;

/// Q3_K: offset in a group-super-block of the high-bit register of piece `m` (0..4), half `h`.
#[inline(always)]
pub(crate) const fn q3k_hm_reg(m: usize, h: usize) -> usize {
    Q3K_P_HM + 32 * (2 * m + h)
}

/// Q3_K: offset in a group-super-block of the crumb register of half-block `n` (0..2), piece
/// `m` (0..4), half `h` (0..2).
#[inline(always)]
pub(crate) const fn q3k_reg(n: usize, m: usize, h: usize) -> usize {
    Q3K_P_QS + 32 * (8 * n + 2 * m + h)
}

/// IQ4_XS: offset of the sub-block scales and of the nibble registers in a group-super-block.
pub(crate) const IQ4XS_P_SC: usize = 16;
pub(crate) const IQ4XS_P_QS: usize = 80;

/// Q2_K: offset of the scale/min pairs and of the crumb registers in a group-super-block.
pub(crate) const Q2K_P_SC: usize = 32;
pub(crate) const Q2K_P_QS: usize = 160;

/// Q6_K: offset of the scale pairs and of the bit registers in a group-super-block.
pub(crate) const Q6K_P_SC: usize = 16;
pub(crate) const Q6K_P_Q: usize = 144;

/// Q6_K: offset in a group-super-block of register `j` (0..6: `qh₀, ql₀, ql₁, qh₁, ql₂, ql₃`)
/// of chunk `c` (0..4), half `h` (0..2).
#[inline(always)]
pub(crate) const fn q6k_reg(c: usize, j: usize, h: usize) -> usize {
    Q6K_P_Q + 32 * (12 * c + 2 * j + h)
}

/// Bytes of one group-super-block of `dtype` (Q4_K, Q5_K, Q6_K, Q3_K, IQ4_XS or Q2_K).
pub(crate) fn group_block_bytes_k(dtype: DType) -> usize {
    match dtype {
        DType::Q4K => Q4K_P_QS + GROUP_ROWS * 128,
        DType::Q5K => Q5K_P_QS + GROUP_ROWS * 128,
        DType::IQ4XS => IQ4XS_P_QS + GROUP_ROWS * 128,
        DType::Q2K => Q2K_P_QS + GROUP_ROWS * 64,
        DType::Q3K => Q3K_P_QS + GROUP_ROWS * 64,
        DType::Q6K => Q6K_P_Q + GROUP_ROWS * 192,
        _ => unreachable!("not a K-quant"),
    }
}

/// Where sub-block `j`'s scale (or min) of row `r` sits in a block of scale pairs
/// (`[p][r][j − 2p]`, 16 bytes per pair `p`): one 16-byte load widens to each row's pair.
pub(crate) fn pair_at(r: usize, j: usize) -> usize {
    16 * (j / 2) + 2 * r + j % 2
}

/// Position of row `r`'s 8 bytes in a register: (half, byte offset).
fn slot(r: usize) -> (usize, usize) {
    let h = usize::from(HALF_ROWS[1].contains(&r));
    (h, 8 * HALF_ROWS[h].iter().position(|&x| x == r).expect("row < 8"))
}

/// Writes block `src` (one source super-block) of group row `r` into `dst` (its group-super-block).
pub(crate) fn pack_block(dtype: DType, r: usize, src: &[u8], dst: &mut [u8]) {
    let (h, off) = slot(r);
    match dtype {
        DType::Q4K | DType::Q5K => {
            pack_q4k_head(r, src, dst);
            for_each_q4k_piece(dtype, r, |at, from| dst[at..at + 8].copy_from_slice(&src[from..from + 8]));
        }
        DType::Q3K => {
            dst[2 * r..2 * r + 2].copy_from_slice(&src[Q3K_D..Q3K_D + 2]);
            for (j, sc) in q3k_scales(src).into_iter().enumerate() {
                dst[Q3K_P_SC + pair_at(r, j)] = sc as u8;
            }
            for_each_q3k_piece(r, |at, from| dst[at..at + 4].copy_from_slice(&src[from..from + 4]));
        }
        DType::Q2K => {
            dst[2 * r..2 * r + 2].copy_from_slice(&src[Q2K_D..Q2K_D + 2]);
            dst[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&src[Q2K_D + 2..Q2K_D + 4]);
            for p in 0..8 {
                dst[Q2K_P_SC + 16 * p + 2 * r..Q2K_P_SC + 16 * p + 2 * r + 2].copy_from_slice(&src[2 * p..2 * p + 2]);
            }
            for (k, q) in src[Q2K_QS..Q2K_D].chunks_exact(4).enumerate() {
                let at = Q2K_P_QS + 32 * k + 4 * r;
                dst[at..at + 4].copy_from_slice(q);
            }
        }
        DType::IQ4XS => {
            dst[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
            for (j, ls) in iq4xs_scales(src).into_iter().enumerate() {
                dst[IQ4XS_P_SC + 8 * j + r] = ls as i8 as u8;
            }
            for (k, q) in src[IQ4XS_QS..].chunks_exact(4).enumerate() {
                let at = IQ4XS_P_QS + 32 * k + 4 * r;
                dst[at..at + 4].copy_from_slice(q);
            }
        }
        DType::Q6K => {
            dst[2 * r..2 * r + 2].copy_from_slice(&src[Q6K_D..Q6K_D + 2]);
            for j in 0..16 {
                dst[Q6K_P_SC + pair_at(r, j)] = src[Q6K_SCALES + j];
            }
            let u = q6k_values(src);
            for c in 0..4 {
                for m in 0..4 {
                    let ql = q6k_reg(c, ql_reg(m), h) + off;
                    let qh = q6k_reg(c, 3 * (m / 2), h) + off;
                    let (lo, hi) = (&u[64 * c + 8 * m..][..8], &u[64 * c + 32 + 8 * m..][..8]);
                    let s = 4 * (m % 2);
                    let (dl, dh) = (&mut dst[ql..ql + 8], &mut [0u8; 8]);
                    for i in 0..8 {
                        dl[i] = (lo[i] & 0xF) | (hi[i] << 4);
                        dh[i] = ((lo[i] >> 4) << s) | ((hi[i] >> 4) << (s + 2));
                    }
                    for (d, v) in dst[qh..qh + 8].iter_mut().zip(dh.iter()) {
                        *d |= *v;
                    }
                }
            }
        }
        _ => unreachable!("not a K-quant"),
    }
}

/// Q4_K / Q5_K: row `r`'s `d`, `dmin` and its 6-bit scales and mins, unpacked, into their
/// places in the group-super-block `dst`.
fn pack_q4k_head(r: usize, src: &[u8], dst: &mut [u8]) {
    dst[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
    dst[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&src[2..4]);
    let (sc, m) = scales_mins_k4(&src[Q4K_SCALES..Q4K_SCALES + 12]);
    for j in 0..8 {
        dst[Q4K_P_SC + pair_at(r, j)] = sc[j];
        dst[Q4K_P_MIN + pair_at(r, j)] = m[j];
    }
}

/// Q4_K / Q5_K: the inverse of [`pack_q4k_head`] — row `r`'s `d`, `dmin` and 12 packed scale
/// bytes (the file's bytes `0..16` of its block) from the group-super-block `g`.
fn unpack_q4k_head(r: usize, g: &[u8], b: &mut [u8]) {
    b[0..2].copy_from_slice(&g[2 * r..2 * r + 2]);
    b[2..4].copy_from_slice(&g[16 + 2 * r..16 + 2 * r + 2]);
    let sc: [u8; 8] = std::array::from_fn(|j| g[Q4K_P_SC + pair_at(r, j)]);
    let mn: [u8; 8] = std::array::from_fn(|j| g[Q4K_P_MIN + pair_at(r, j)]);
    let q = &mut b[Q4K_SCALES..Q4K_SCALES + 12];
    for j in 0..4 {
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        q[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        q[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
    }
}

/// Q4_K / Q5_K: calls `f(packed, source)` for every 8-byte piece of row `r`'s block that the
/// packing moves whole (offsets in the group-super-block and in the source block): Q5_K's
/// fifth-bit bytes of piece `m`, then the nibbles of chunk `c`, piece `m`. Packing and
/// unpacking both walk it.
#[inline(always)]
fn for_each_q4k_piece(dtype: DType, r: usize, mut f: impl FnMut(usize, usize)) {
    let (h, off) = slot(r);
    let q5 = dtype == DType::Q5K;
    if q5 {
        for m in 0..4 {
            f(q5k_qh_reg(m, h) + off, Q5K_QH + 8 * m);
        }
    }
    for c in 0..4 {
        for m in 0..4 {
            if q5 {
                f(q5k_reg(c, m, h) + off, Q5K_QS + 32 * c + 8 * m);
            } else {
                f(q4k_reg(c, m, h) + off, Q4K_QS + 32 * c + 8 * m);
            }
        }
    }
}

/// Q4_K / Q5_K: row `r`'s source block (`b`, the format's block size, zeroed) back from its
/// group-super-block `g` — the inverse of [`pack_block`].
fn q4k_source_block_into(dtype: DType, g: &[u8], r: usize, b: &mut [u8]) {
    unpack_q4k_head(r, g, b);
    for_each_q4k_piece(dtype, r, |at, to| b[to..to + 8].copy_from_slice(&g[at..at + 8]));
}

/// Row `r`'s Q5_K source block back from its group-super-block `g` (the prefill panel copies
/// every row's blocks out this way).
pub(crate) fn q5k_source_block(g: &[u8], r: usize) -> [u8; 176] {
    let mut b = [0u8; 176];
    q4k_source_block_into(DType::Q5K, g, r, &mut b);
    b
}

/// Q3_K: calls `f(packed, source)` for every 4-byte half of a piece of row `r`'s block (offsets
/// in the group-super-block and in the source block): the `hmask` bytes of piece `m`, then the
/// crumbs of half-block `n`, piece `m`. Packing and unpacking both walk it.
#[inline(always)]
fn for_each_q3k_piece(r: usize, mut f: impl FnMut(usize, usize)) {
    let (h, off) = slot(r);
    for m in 0..4 {
        f(q3k_hm_reg(m, h) + off, 4 * m);
        f(q3k_hm_reg(m, h) + off + 4, 16 + 4 * m);
    }
    for n in 0..2 {
        for m in 0..4 {
            f(q3k_reg(n, m, h) + off, Q3K_QS + 32 * n + 4 * m);
            f(q3k_reg(n, m, h) + off + 4, Q3K_QS + 32 * n + 16 + 4 * m);
        }
    }
}

/// Row `r`'s Q3_K source block back from its group-super-block `g` — the inverse of
/// [`pack_block`] (the stored scales `sc − 32` back into the file's 12 bytes by
/// `blocks::put_q3k_scales`).
fn q3k_source_block(g: &[u8], r: usize) -> [u8; 110] {
    let mut b = [0u8; 110];
    b[Q3K_D..Q3K_D + 2].copy_from_slice(&g[2 * r..2 * r + 2]);
    put_q3k_scales(&mut b, &std::array::from_fn(|j| (g[Q3K_P_SC + pair_at(r, j)] as i8).wrapping_add(32) as u8));
    for_each_q3k_piece(r, |at, to| b[to..to + 4].copy_from_slice(&g[at..at + 4]));
    b
}

/// The 256 unsigned 6-bit values `q + 32` of a Q6_K block (as `dequant::q6k_value`, all at once).
fn q6k_values(b: &[u8]) -> [u8; QK_K] {
    let mut u = [0u8; QK_K];
    for hh in 0..2 {
        for l in 0..32 {
            let (ql0, ql1, qh) = (b[64 * hh + l], b[64 * hh + l + 32], b[Q6K_QH + 32 * hh + l]);
            u[128 * hh + l] = (ql0 & 0xF) | ((qh & 3) << 4);
            u[128 * hh + l + 32] = (ql1 & 0xF) | (((qh >> 2) & 3) << 4);
            u[128 * hh + l + 64] = (ql0 >> 4) | (((qh >> 4) & 3) << 4);
            u[128 * hh + l + 96] = (ql1 >> 4) | (((qh >> 6) & 3) << 4);
        }
    }
    u
}

/// Row `r`'s Q2_K source block back from its group-super-block `g` (a byte copy: the packing
/// keeps the file's bytes, only moved).
pub(crate) fn q2k_source_block(g: &[u8], r: usize) -> [u8; 84] {
    let mut b = [0u8; 84];
    b[Q2K_D..Q2K_D + 2].copy_from_slice(&g[2 * r..2 * r + 2]);
    b[Q2K_D + 2..Q2K_D + 4].copy_from_slice(&g[16 + 2 * r..16 + 2 * r + 2]);
    for p in 0..8 {
        b[2 * p..2 * p + 2].copy_from_slice(&g[Q2K_P_SC + 16 * p + 2 * r..Q2K_P_SC + 16 * p + 2 * r + 2]);
    }
    // 4 bytes per register (the prefill panel copies every row's blocks out this way).
    for (k, v) in b[Q2K_QS..Q2K_D].chunks_exact_mut(4).enumerate() {
        v.copy_from_slice(&g[Q2K_P_QS + 32 * k + 4 * r..Q2K_P_QS + 32 * k + 4 * r + 4]);
    }
    b
}

/// Register index (within a chunk-half's 6) of `ql_m`.
pub(crate) fn ql_reg(m: usize) -> usize {
    3 * (m / 2) + 1 + m % 2
}

/// Row `r`'s IQ4_XS source block back from its group-super-block `g` — the inverse of
/// [`pack_block`] (the stored scales `ls − 32` back into the file's 6-bit fields).
fn iq4xs_source_block(g: &[u8], r: usize) -> [u8; 136] {
    let mut b = [0u8; 136];
    b[0..2].copy_from_slice(&g[2 * r..2 * r + 2]);
    let mut high = 0u16;
    for j in 0..8 {
        let ls = (g[IQ4XS_P_SC + 8 * j + r] as i8 as i32 + 32) as u16;
        high |= (ls >> 4) << (2 * j);
        b[4 + j / 2] |= ((ls & 0xF) as u8) << (4 * (j % 2));
    }
    b[2..4].copy_from_slice(&high.to_le_bytes());
    // 4 bytes per register.
    for (k, v) in b[IQ4XS_QS..].chunks_exact_mut(4).enumerate() {
        v.copy_from_slice(&g[IQ4XS_P_QS + 32 * k + 4 * r..IQ4XS_P_QS + 32 * k + 4 * r + 4]);
    }
    b
}

/// Row `r`'s source super-block back from its group-super-block `g` (inverse of [`pack_block`]).
pub(crate) fn unpack_block(dtype: DType, r: usize, g: &[u8]) -> Vec<u8> {
    let (h, off) = slot(r);
    match dtype {
        DType::Q4K | DType::Q5K => {
            let mut b = vec![0u8; dtype.block_bytes()];
            q4k_source_block_into(dtype, g, r, &mut b);
            b
        }
        DType::Q2K => q2k_source_block(g, r).to_vec(),
        DType::Q3K => q3k_source_block(g, r).to_vec(),
        DType::IQ4XS => iq4xs_source_block(g, r).to_vec(),
        DType::Q6K => {
            let mut b = vec![0u8; 210];
            b[Q6K_D..Q6K_D + 2].copy_from_slice(&g[2 * r..2 * r + 2]);
            for j in 0..16 {
                b[Q6K_SCALES + j] = g[Q6K_P_SC + pair_at(r, j)];
            }
            let mut u = [0u8; QK_K];
            for c in 0..4 {
                for m in 0..4 {
                    let (ql, qh) = (q6k_reg(c, ql_reg(m), h) + off, q6k_reg(c, 3 * (m / 2), h) + off);
                    for i in 0..8 {
                        let s = 4 * (m % 2);
                        u[64 * c + 8 * m + i] = (g[ql + i] & 0xF) | (((g[qh + i] >> s) & 3) << 4);
                        u[64 * c + 32 + 8 * m + i] = (g[ql + i] >> 4) | (((g[qh + i] >> (s + 2)) & 3) << 4);
                    }
                }
            }
            // ggml's arrangement (see `dequant::q6k_value`): element 128h + 32k + l.
            for (e, &v) in u.iter().enumerate() {
                let (hh, rr) = (e / 128, e % 128);
                let (k, l) = (rr / 32, rr % 32);
                let ql = 64 * hh + l + 32 * (k % 2);
                b[ql] |= if k < 2 { v & 0xF } else { (v & 0xF) << 4 };
                b[Q6K_QH + 32 * hh + l] |= (v >> 4) << (2 * k);
            }
            b
        }
        _ => unreachable!("not a K-quant"),
    }
}
