//! [`Packed`]: Q4_0 / Q8_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 / Q4_K / Q5_K / Q6_K / Q3_K / IQ4_XS / Q2_K weights repacked at load
//! into 8-row interleaved groups, the layout the AVX2 GEMV streams (`simd/avx2_packed.rs`,
//! `simd/avx2_packed_k.rs`). The K-quant layouts are documented in `repack_k.rs`.
//!
//! Layout of the 32-element formats, per group of 8 consecutive rows `8g..8g+8`, then per block
//! `i` of the row (groups are stored one after another, a group's blocks in column order):
//! * the 8 rows' f16 scales `d` (16 bytes), row order (Q4_1 / Q5_1: then their mins `m`, 16 bytes;
//!   MXFP4: the 8 rows' E8M0 exponent bytes, 8 bytes);
//! * Q5_0 / Q5_1: then the rows' fifth bits (32 bytes, row `r` at `4r`), rearranged so that one
//!   shift per quant register brings each element's bit to bit 4 of its byte ([`spread_qh`]):
//!   bit `2j` of byte `k` is element `4j+k`'s, bit `2j+1` element `16+4j+k`'s;
//! * then the rows' quant bytes in 32-byte registers of 4 bytes × 8 rows: byte `b` of row `r`
//!   at `head + 32·(b / 4) + 4·r + b % 4` (Q4_0 / IQ4_NL: 4 registers, 144 bytes per
//!   group-block, the same 18 bytes per row-block as the file; Q8_0: 8 registers, 272 bytes,
//!   34 per row-block; every format the file's bytes per row-block).
//!
//! One pass over a group-block dots one activation block against 8 rows with no horizontal
//! sum: 32-bit lane `r` of every register belongs to row `r`, the activation's matching 4
//! bytes are broadcast to all lanes, and vertical adds leave the 8 rows' exact integer sums
//! in lane order (a nibble register `j` holds elements `4j..4j+4` in its low nibbles and
//! `16+4j..16+4j+4` in its high nibbles).
//!
//! Invariant: a packed matrix holds exactly the bytes of its source (`Packed::unpack_row`
//! gives every source row back, byte for byte; `tests/it/repack.rs`), and the packed kernel's
//! result is bitwise the scalar reference's (each block's exact integer sum times
//! `d_w · d_x`, accumulated block by block in f32), whatever the number of tokens.
//!
//! Cost: a copy the size of the source's bytes in anonymous memory (Q4_K: 1,184 bytes per
//! 8 row-super-blocks for 1,152, Q5_K 1,440 for 1,408, Q3_K 912 for 880: the unpacked 6-bit scales and mins); the mapped file is only
//! read, never written.

use crate::dtype::{DType, WeightMatrix};
use crate::huge::HugeBytes;
use crate::repack_k::{group_block_bytes_k, pack_block, unpack_block};
use rayon::prelude::*;

/// Rows per interleaved group.
pub const GROUP_ROWS: usize = 8;

/// A matrix of a [`Packed::supports`] format repacked into 8-row groups (see the module
/// documentation). Invariant: `bytes.len() == rows / 8 * blocks_per_row * group_block_bytes()`.
pub struct Packed {
    dtype: DType,
    rows: usize,
    cols: usize,
    /// In huge pages where the OS grants them: the GEMV streams every byte each step.
    bytes: HugeBytes,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({} {}x{}, {} bytes)", self.dtype, self.rows, self.cols, self.bytes.len())
    }
}

impl Packed {
    /// Whether a matrix of this format and row count can be packed (Q4_0 / Q8_0 / Q4_1 / Q5_0 /
    /// Q5_1 / IQ4_NL / MXFP4 / Q4_K / Q5_K / Q6_K / Q3_K / IQ4_XS / Q2_K with a whole number of 8-row groups).
    pub fn supports(dtype: DType, rows: usize) -> bool {
        matches!(
            dtype,
            DType::Q4_0
                | DType::Q8_0
                | DType::Q4_1
                | DType::Q5_0
                | DType::Q5_1
                | DType::IQ4NL
                | DType::MXFP4
                | DType::Q4K
                | DType::Q5K
                | DType::Q6K
                | DType::Q3K
                | DType::IQ4XS
                | DType::Q2K
        ) && rows % GROUP_ROWS == 0
            && rows > 0
    }

    /// Repacks `w`; `None` where [`Packed::supports`] says no. Reads every byte of `w` once (groups in parallel on [`crate::pool`]).
    pub fn new(w: &WeightMatrix) -> Option<Packed> {
        if !Packed::supports(w.dtype, w.rows) {
            return None;
        }
        let nb = w.cols / w.dtype.block_elems();
        let bb = w.dtype.block_bytes();
        let gbb = group_block_bytes(w.dtype);
        let mut bytes = HugeBytes::zeroed(w.rows / GROUP_ROWS * nb * gbb);
        let k = is_k(w.dtype);
        let pack_group = |(g, gdst): (usize, &mut [u8])| {
            let rows: [&[u8]; GROUP_ROWS] = std::array::from_fn(|r| w.row(GROUP_ROWS * g + r));
            for (i, dst) in gdst.chunks_exact_mut(gbb).enumerate() {
                for (r, row) in rows.iter().enumerate() {
                    let src = &row[i * bb..(i + 1) * bb];
                    if k {
                        pack_block(w.dtype, r, src, dst);
                        continue;
                    }
                    let (h, sb) = (head_bytes(w.dtype), scale_bytes(w.dtype));
                    dst[sb * r..sb * r + sb].copy_from_slice(&src[..sb]);
                    if has_min(w.dtype) {
                        dst[16 + 2 * r..16 + 2 * r + 2].copy_from_slice(&src[2..4]);
                    }
                    if let Some(at) = qh_at(w.dtype) {
                        let qh = u32::from_le_bytes(src[at..at + 4].try_into().unwrap());
                        let hb = fifth_bits_at(w.dtype) + 4 * r;
                        dst[hb..hb + 4].copy_from_slice(&spread_qh(qh));
                    }
                    // 4-byte pieces (every format's quant bytes are a multiple of 4).
                    for (j, q) in src[h..].chunks_exact(4).enumerate() {
                        let at = quant_at(h, r, 4 * j);
                        dst[at..at + 4].copy_from_slice(q);
                    }
                }
            }
        };
        // Groups are independent: packed on the pool (load time; the bytes are the same).
        crate::pool::pool().install(|| bytes.par_chunks_exact_mut(nb * gbb).enumerate().for_each(pack_group));
        Some(Packed { dtype: w.dtype, rows: w.rows, cols: w.cols, bytes })
    }

    /// What a loader should attach to `w` on this machine: its packing when the format's matmul
    /// path ([`crate::dispatch::kernel_path`]) reads packings ([`crate::simd::Isa::runs_packed`]:
    /// AVX2, AVX-512, and on AMX CPUs every format but Q4_0 / Q8_0),
    /// [`repack_enabled`], the shape packs and the dispatch table packs the format on this path
    /// ([`crate::dispatch::packs`]: Q5_K / Q3_K only where this CPU's row names them; on AVX-512
    /// every format of [`crate::dispatch::AVX2_KERNEL_PACKINGS`] likewise); else `None`.
    pub fn for_this_cpu(w: &WeightMatrix) -> Option<Packed> {
        #[cfg(target_arch = "x86_64")]
        {
            let isa = crate::dispatch::kernel_path(w.dtype);
            if repack_enabled() && isa.runs_packed() && crate::dispatch::packs(isa, w.dtype) {
                return Packed::new(w);
            }
        }
        let _ = w;
        None
    }

    /// The source format.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Rows of the source matrix.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns of the source matrix.
    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes held (the source's; Q4_K 2.8% more, its scales and mins unpacked).
    pub fn num_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Group `g`'s bytes (all its blocks).
    pub(crate) fn group(&self, g: usize) -> &[u8] {
        let n = self.cols / self.dtype.block_elems() * group_block_bytes(self.dtype);
        &self.bytes[g * n..(g + 1) * n]
    }

    /// Row `r` back in the source layout (for tests: the packing loses nothing).
    pub fn unpack_row(&self, r: usize) -> Vec<u8> {
        let bb = self.dtype.block_bytes();
        let gbb = group_block_bytes(self.dtype);
        let (g, k) = (r / GROUP_ROWS, r % GROUP_ROWS);
        if is_k(self.dtype) {
            return self.group(g).chunks_exact(gbb).flat_map(|b| unpack_block(self.dtype, k, b)).collect();
        }
        let (h, sb) = (head_bytes(self.dtype), scale_bytes(self.dtype));
        self.group(g)
            .chunks_exact(gbb)
            .flat_map(|b| {
                let m = if has_min(self.dtype) { &b[16 + 2 * k..16 + 2 * k + 2] } else { &[][..] };
                let qh = qh_at(self.dtype).map(|_| {
                    let hb = fifth_bits_at(self.dtype) + 4 * k;
                    gather_qh(b[hb..hb + 4].try_into().unwrap()).to_le_bytes()
                });
                let qh = qh.as_ref().map_or(&[][..], |q| &q[..]);
                let quants = (0..bb - h).map(|q| b[quant_at(h, k, q)]);
                b[sb * k..sb * k + sb].iter().chain(m).chain(qh).copied().chain(quants).collect::<Vec<_>>()
            })
            .collect()
    }
}

/// Bytes of the fields ahead of the quants in a 32-element format's block: `d` (Q4_0 / Q8_0 /
/// IQ4_NL: 2), `d`, `m` (Q4_1: 4), `d`, `qh` (Q5_0: 6), `d`, `m`, `qh` (Q5_1: 8), the E8M0
/// exponent (MXFP4: 1). A group-block holds 8 times as many ahead of its quant registers.
pub(crate) fn head_bytes(dtype: DType) -> usize {
    match dtype {
        DType::MXFP4 => 1,
        DType::Q4_1 => 4,
        DType::Q5_0 => 6,
        DType::Q5_1 => 8,
        _ => 2,
    }
}

/// Bytes of a 32-element format's block scale, the first field: the f16 `d` (2), or MXFP4's
/// E8M0 exponent (1). A group-block holds the 8 rows' scales first, in row order.
pub(crate) fn scale_bytes(dtype: DType) -> usize {
    if dtype == DType::MXFP4 {
        1
    } else {
        2
    }
}

/// Whether the format packs by 256-element super-blocks (`repack_k.rs`).
fn is_k(dtype: DType) -> bool {
    matches!(dtype, DType::Q4K | DType::Q5K | DType::Q6K | DType::Q3K | DType::IQ4XS | DType::Q2K)
}

/// Whether the format's blocks carry a min `m` after `d` (Q4_1, Q5_1).
fn has_min(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_1 | DType::Q5_1)
}

/// Where a Q5_0 / Q5_1 source block holds its fifth bits `qh` (a little-endian u32).
fn qh_at(dtype: DType) -> Option<usize> {
    match dtype {
        DType::Q5_0 => Some(2),
        DType::Q5_1 => Some(4),
        _ => None,
    }
}

/// Where a Q5_0 / Q5_1 group-block holds its 8 rows' rearranged fifth bits (after the `d`s and
/// Q5_1's `m`s).
pub(crate) fn fifth_bits_at(dtype: DType) -> usize {
    if dtype == DType::Q5_1 {
        32
    } else {
        16
    }
}

/// A block's fifth bits `qh` (bit `e` = element `e`'s) in the packed order: bit `2j` of byte `k`
/// is element `4j+k`'s, bit `2j+1` element `16+4j+k`'s, so quant register `j`'s low and high
/// nibbles find their bits at `2j` and `2j+1` of their own bytes.
pub(crate) fn spread_qh(qh: u32) -> [u8; 4] {
    let mut out = [0u8; 4];
    for (k, o) in out.iter_mut().enumerate() {
        for j in 0..4 {
            *o |= (((qh >> (4 * j + k)) & 1) << (2 * j)) as u8;
            *o |= (((qh >> (16 + 4 * j + k)) & 1) << (2 * j + 1)) as u8;
        }
    }
    out
}

/// The inverse of [`spread_qh`].
pub(crate) fn gather_qh(hb: [u8; 4]) -> u32 {
    let mut qh = 0u32;
    for (k, &o) in hb.iter().enumerate() {
        for j in 0..4 {
            qh |= ((o as u32 >> (2 * j)) & 1) << (4 * j + k);
            qh |= ((o as u32 >> (2 * j + 1)) & 1) << (16 + 4 * j + k);
        }
    }
    qh
}

/// Where quant byte `b` of row `r` sits in a 32-element format's group-block (`h` =
/// [`head_bytes`]): after the 8 rows' fields (`8h` bytes: the `d`s, the `m`s, the fifth bits),
/// 32-byte registers of 4 bytes × 8 rows (lane `r` of register `b / 4`).
#[inline]
pub(crate) fn quant_at(h: usize, r: usize, b: usize) -> usize {
    8 * h + 32 * (b / 4) + 4 * r + b % 4
}

/// Bytes of one 8-row group-block: 8 scales and 8 rows of quants (K-quants: `repack_k.rs`).
pub(crate) fn group_block_bytes(dtype: DType) -> usize {
    match dtype {
        DType::Q4K | DType::Q5K | DType::Q6K | DType::Q3K | DType::IQ4XS | DType::Q2K => group_block_bytes_k(dtype),
        _ => GROUP_ROWS * dtype.block_bytes(),
    }
}

/// Whether the packed path is on: `ENGRAM_REPACK` unset, empty, `1` or `on` (default), or
/// `0` / `off` (read once). Loaders consult it before packing; kernels use whatever they get.
pub fn repack_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| !matches!(std::env::var("ENGRAM_REPACK").as_deref().map(str::trim), Ok("0") | Ok("off") | Ok("OFF")))
}
