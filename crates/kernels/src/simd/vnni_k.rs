//! AVX-512 VNNI prefill of the 256-element formats — Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_XS,
//! IQ3_XXS, IQ3_S — with the tokens in the register lanes.
//!
//! A chunk's rows are decoded **once per call** into a per-thread panel of byte codes, 8 rows
//! interleaved 4 bytes at a time, with each row's sub-block scales as i32 — from the file's
//! bytes, or straight from the matrix's packing where it has one (Q4_K / Q6_K always; Q5_K /
//! Q3_K / Q2_K / IQ4_XS where the CPU's table row packs them), so that a packed matrix's prefill
//! never touches the file's bytes:
//!
//! * formats with mins (Q4_K 0..16, Q5_K 0..32, Q2_K 0..4): the codes as unsigned bytes, the
//!   mins as i16 pairs; the activations as signed bytes;
//! * formats whose reference codes carry an offset (Q6_K `q + 32`, Q3_K `q + 4`), IQ4_XS
//!   (the table value) and IQ3_XXS / IQ3_S (the signed grid value): the signed `q`, and one
//!   constant per super-block, `C = 128·Σ_j sc_j·Σ_{e∈j} q_e`; the activations as unsigned bytes `x + 128`. No block-sum
//!   term is needed for them: `C` is the whole correction, and it depends on the row alone.
//!
//! The activations of the call are transposed once ([`TokenLanes`]: 16 tokens per register).
//! Then an 8-row × 16-token micro-kernel does, per 4 elements and row, one `vpbroadcastd` of
//! the row's 4 codes and one `vpdpbusd` of them against the 16 tokens' 4 activation bytes, two
//! sub-blocks at a time (16 independent accumulators, enough to hide the instruction's latency);
//! per sub-block one `vpmulld` applies the scale (one `vpdpwssd` where the sub-block's sum fits
//! in i16: Q3_K, Q2_K); per super-block either one `vpdpwssd` per sub-block pair forms the mins'
//! term from the tokens' Q8_K block sums, or one subtraction of `C` removes what the `+ 128`
//! added.
//!
//! Invariant: per (row, token, super-block) the integers are exactly the scalar reference's:
//! `Σ_j sc_j·Σ u·x` and the mins' `Σ_j m_j·S_j`; with an offset, `Σ_j sc_j·Σ q·(x + 128) − C
//! = Σ_j sc_j·Σ q·x`, the integer the reference's `Σ_j sc_j·Σ u·x − o·Σ_j sc_j·S_j` (`u = q +
//! o`) comes to (every partial sum stays within i32: at most 2^28 in magnitude). The float
//! operations are the reference's lane by lane — `acc += (d·dx)·isum − (dmin·dx)·msum` or `acc += (d·dx)·isum`,
//! super-blocks in order, from +0.0, no fused multiply-add — so every token's output is bitwise
//! the scalar path's, and thus the decode kernels' (which compute the same recipe), whatever
//! the call's token count.

use super::avx2_k::{block_bytes, decode_block, iq3_dtype, KBlock, IQ3S, IQ3XXS, IQ4XS, Q2K, Q3K, Q5K};
use super::avx2_q32::table;
use super::{Acts, Isa, TileCtx};
use crate::blocks::*;
use crate::dtype::DType;
use crate::repack::{group_block_bytes, Packed, GROUP_ROWS};
use crate::repack_k::{
    pair_at, q3k_hm_reg, q3k_reg, q4k_reg, q5k_qh_reg, q5k_reg, q6k_reg, HALF_ROWS, IQ4XS_P_QS, IQ4XS_P_SC, Q2K_P_QS, Q2K_P_SC, Q3K_P_SC,
    Q4K_P_MIN, Q4K_P_QS, Q4K_P_SC, Q5K_P_QH, Q6K_P_Q, Q6K_P_SC,
};
use crate::token_lanes::{Lane64, TokenLanes, LANES};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Q4_K's tag (the other tags are `avx2_k`'s, 0..=5).
const Q4K: u8 = 6;
/// Q6_K's tag.
const Q6K: u8 = 7;

/// Rows of the micro-kernel (one register of 16 tokens each); a panel is a whole number of
/// bands, the last padded with zero rows whose results are not stored.
pub(crate) const BAND: usize = 8;

/// Whether a call of `n_tokens` tokens of format `d` on `isa` runs here. `packed`: the matrix
/// has a [`Packed`] copy (then the panel is decoded from it; Q4_K / Q6_K's decode kernels on
/// this path are the packed ones, bitwise the reference). Q4_K / Q6_K without a packing keep
/// the tiles; the other formats run here packed or not.
pub(crate) fn takes(isa: Isa, d: DType, n_tokens: usize, packed: bool) -> bool {
    // The fewest tokens of Q5_K / Q3_K / Q2_K / IQ4_XS / IQ3 calls that run here are measured per CPU
    // (`crate::dispatch::token_lane_min`): a call costs about the same up to 16 tokens (one
    // register of token lanes), so the crossover with the decode tiles is where their per-token
    // cost times the tokens reaches it.
    match d {
        DType::Q5K | DType::Q3K | DType::Q2K | DType::IQ4XS | DType::IQ3XXS | DType::IQ3S => {
            matches!(isa, Isa::Avx512 | Isa::Amx) && n_tokens >= crate::dispatch::token_lane_min(d)
        }
        // Below the threshold (`dispatch::token_lane_min`, measured per CPU) the packed VNNI
        // kernels (`avx512_packed_k`, ≤ 8 tokens per pass) cost less per token than the
        // token lanes, whose panel is decoded once per call.
        DType::Q4K | DType::Q6K => isa == Isa::Avx512 && packed && n_tokens >= crate::dispatch::token_lane_min(d),
        _ => false,
    }
}

/// Per (row, super-block) scales: `sc[j]` sub-block `j`'s scale (an i16 pair `(sc_j, 0)` where
/// [`i16_sums`]), `cp[p]` the i16 pair of mins of sub-blocks `2p, 2p + 1` (low, high half;
/// formats with mins), `d`, `dmin`, and `c = 128·Σ_j sc_j·Σ_{e∈j} q_e` (formats without mins;
/// [`row_constants`]).
#[derive(Clone, Copy)]
#[repr(C)]
struct Meta {
    sc: [i32; 16],
    cp: [i32; 8],
    d: f32,
    dmin: f32,
    c: i32,
}

const META0: Meta = Meta { sc: [0; 16], cp: [0; 8], d: 0.0, dmin: 0.0, c: 0 };

/// Panel bytes of one weight row of `cols` columns.
fn panel_row_bytes(cols: usize) -> usize {
    cols + cols / QK_K * std::mem::size_of::<Meta>()
}

/// Rows a chunk's panel may hold to stay in L2 (≈ 384 KiB), a whole number of bands.
pub(crate) fn chunk_rows(cols: usize) -> usize {
    ((384 * 1024) / panel_row_bytes(cols).max(1)).max(BAND) / BAND * BAND
}

thread_local! {
    /// This thread's panel: codes (band-major: band, super-block, 4-byte group, row) and metas
    /// (band, super-block, row).
    static PANEL: RefCell<(Vec<Lane64>, Vec<Meta>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Format tag of `d` for this module.
fn tag(d: DType) -> u8 {
    match d {
        DType::Q4K => Q4K,
        DType::Q6K => Q6K,
        DType::Q5K => Q5K,
        DType::Q3K => Q3K,
        DType::Q2K => Q2K,
        DType::IQ3XXS => IQ3XXS,
        DType::IQ3S => IQ3S,
        _ => IQ4XS,
    }
}

/// Computes output rows `r0..r1` for all `n_tokens` tokens, in spans of at most
/// [`chunk_rows`] rows (one panel each).
///
/// # Safety
/// AVX-512 F/BW/VL + VNNI available; `c`'s matrix is of a format [`takes`] accepts, with Q8_K
/// activations; `packed` is its packing if it has one (always for Q4_K / Q6_K; then `r0` and
/// `r1` are multiples of 8); no other thread writes rows `r0..r1`.
pub(crate) unsafe fn run_rows(c: &TileCtx, packed: Option<&Packed>, r0: usize, r1: usize, n_tokens: usize) {
    let Acts::Q8K(a) = c.acts else { unreachable!("activations prepared for the wrong dtype") };
    let plus128 = !has_min(tag(c.w.dtype));
    let lanes = a.lanes[plus128 as usize].get_or_init(|| TokenLanes::new(a, plus128));
    let span = chunk_rows(c.w.cols);
    let mut s0 = r0;
    while s0 < r1 {
        let s1 = (s0 + span).min(r1);
        run_span(c, lanes, packed, s0, s1, n_tokens);
        s0 = s1;
    }
}

/// [`run_rows`] on one panel's rows.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn run_span(c: &TileCtx, lanes: &TokenLanes, packed: Option<&Packed>, r0: usize, r1: usize, n_tokens: usize) {
    let k = tag(c.w.dtype);
    let nb = lanes.nb;
    let rows = r1 - r0;
    let bands = rows.div_ceil(BAND);
    PANEL.with(|cell| {
        let (codes, meta) = &mut *cell.borrow_mut();
        // 256 codes × 8 rows per (band, super-block) = 32 registers.
        let ncodes = bands * nb * 32;
        if codes.len() < ncodes {
            codes.resize(ncodes, Lane64([0; 64]));
        }
        if meta.len() < bands * nb * BAND {
            meta.resize(bands * nb * BAND, META0);
        }
        let cp = codes.as_mut_ptr() as *mut u8;
        match packed {
            Some(p) => {
                let gbb = group_block_bytes(c.w.dtype);
                for b in 0..bands {
                    let group = p.group(r0 / GROUP_ROWS + b);
                    for i in 0..nb {
                        let (blk, dst) = (group[i * gbb..(i + 1) * gbb].as_ptr(), cp.add((b * nb + i) * 2048));
                        let m = meta.as_mut_ptr().add((b * nb + i) * BAND);
                        match k {
                            Q4K => fill_q4k(blk, dst, m),
                            Q6K => fill_q6k(blk, dst, m),
                            Q5K => fill_q5k(blk, dst, m),
                            Q3K => fill_q3k(blk, dst, m),
                            Q2K => fill_q2k(blk, dst, m),
                            _ => fill_iq4xs(blk, dst, m),
                        }
                    }
                }
            }
            None => {
                assert!(!matches!(k, Q4K | Q6K), "Q4_K / Q6_K run here only packed");
                let rb = c.w.row_bytes();
                for b in 0..bands {
                    let live = (rows - b * BAND).min(BAND);
                    for i in 0..nb {
                        let dst = cp.add((b * nb + i) * 2048);
                        let m = meta.as_mut_ptr().add((b * nb + i) * BAND);
                        let src = c.w.data.as_ptr().add((r0 + b * BAND) * rb + i * block_bytes(k));
                        match k {
                            Q5K => fill_band::<Q5K>(src, rb, live, dst, m),
                            Q3K => fill_band::<Q3K>(src, rb, live, dst, m),
                            Q2K => fill_band::<Q2K>(src, rb, live, dst, m),
                            IQ3XXS => fill_band::<IQ3XXS>(src, rb, live, dst, m),
                            IQ3S => fill_band::<IQ3S>(src, rb, live, dst, m),
                            _ => fill_band::<IQ4XS>(src, rb, live, dst, m),
                        }
                    }
                }
            }
        }
        if !has_min(k) {
            for blk in 0..bands * nb {
                row_constants(cp.add(blk * 2048), meta.as_mut_ptr().add(blk * BAND), nsub(k));
            }
        }
        let (out, ldo) = (c.out, c.ldo);
        for g in 0..n_tokens.div_ceil(LANES) {
            let nt = (n_tokens - g * LANES).min(LANES);
            for b in 0..bands {
                let bc = cp.add(b * nb * 2048) as *const u8;
                let bm = meta.as_ptr().add(b * nb * BAND);
                let res = match k {
                    Q4K => band::<Q4K>(bc, bm, lanes, g),
                    Q6K => band::<Q6K>(bc, bm, lanes, g),
                    Q5K => band::<Q5K>(bc, bm, lanes, g),
                    Q3K => band::<Q3K>(bc, bm, lanes, g),
                    Q2K => band::<Q2K>(bc, bm, lanes, g),
                    IQ3XXS => band::<IQ3XXS>(bc, bm, lanes, g),
                    IQ3S => band::<IQ3S>(bc, bm, lanes, g),
                    _ => band::<IQ4XS>(bc, bm, lanes, g),
                };
                let live = (rows - b * BAND).min(BAND);
                store_band(&res, out.add(g * LANES * ldo + r0 + b * BAND), ldo, nt, live);
            }
        }
    });
}

/// Byte offset of element `e` of band row `r` within a (band, super-block) code block.
#[inline(always)]
fn code_at(r: usize, e: usize) -> usize {
    (e / 4 * BAND + r) * 4 + e % 4
}

/// The 8 × 8 transpose of 32-bit words: word `j` of `out[i]` is word `i` of `v[j]`.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn transpose8(v: &[__m256i; 8]) -> [__m256i; 8] {
    // Per 128-bit half: pairs of rows, then quads; then the halves exchanged.
    let t: [__m256i; 8] = std::array::from_fn(|i| {
        let (a, b) = (v[i / 2 * 2], v[i / 2 * 2 + 1]);
        if i % 2 == 0 {
            _mm256_unpacklo_epi32(a, b)
        } else {
            _mm256_unpackhi_epi32(a, b)
        }
    });
    // u[4h + k]: rows 4h..4h + 4 of words k (low half) and 4 + k (high half).
    let u: [__m256i; 8] = std::array::from_fn(|i| {
        let (h, k) = (i / 4, i % 4);
        let (a, b) = (t[4 * h + k / 2], t[4 * h + 2 + k / 2]);
        if k % 2 == 0 {
            _mm256_unpacklo_epi64(a, b)
        } else {
            _mm256_unpackhi_epi64(a, b)
        }
    });
    std::array::from_fn(|i| {
        let k = i % 4;
        if i < 4 {
            _mm256_permute2x128_si256::<0x20>(u[k], u[4 + k])
        } else {
            _mm256_permute2x128_si256::<0x31>(u[k], u[4 + k])
        }
    })
}

/// One band's super-block of Q5_K / Q3_K / Q2_K / IQ4_XS / IQ3 (row `r` at `src + r · rb`, rows
/// `live..8` padding) → a code block at `dst` and the 8 metas at `m`: each row decoded to 8
/// registers of 32 codes, then per register the 8 rows' words transposed, so that each
/// 4-element group of the block leaves in one 32-byte store.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_band<const K: u8>(src: *const u8, rb: usize, live: usize, dst: *mut u8, m: *mut Meta) {
    let mut regs = [[_mm256_setzero_si256(); 8]; BAND];
    for (r, regs) in regs.iter_mut().enumerate() {
        if r < live {
            *regs = fill_row::<K>(src.add(r * rb), &mut *m.add(r));
        } else {
            *m.add(r) = META0;
        }
    }
    put_band(&regs, dst);
}

/// Stores a band's decoded rows (`regs[r]`: row `r`'s 8 registers of 32 codes) as a code
/// block: per register the 8 rows' words transposed, so that each 4-element group of the block
/// leaves in one 32-byte store.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn put_band(regs: &[[__m256i; 8]; BAND], dst: *mut u8) {
    for g in 0..8 {
        let words = transpose8(&std::array::from_fn(|r| regs[r][g]));
        for (j, w) in words.iter().enumerate() {
            debug_assert_eq!(code_at(0, 32 * g + 4 * j), (8 * g + j) * 32);
            _mm256_storeu_si256(dst.add((8 * g + j) * 32) as *mut __m256i, *w);
        }
    }
}

/// i16 pair `(lo, hi)` as one i32 (low half `lo`).
#[inline(always)]
fn pair(lo: i32, hi: i32) -> i32 {
    ((lo as u32 & 0xFFFF) | ((hi as u32) << 16)) as i32
}

/// One source super-block of Q5_K / Q3_K / Q2_K / IQ4_XS / IQ3 (at `src`) → its 8 registers of 32
/// codes (register `g`: elements `32g..32g + 32`) and its [`Meta`], by the decode tiles' own
/// decoding (`avx2_k::decode_block`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_row<const K: u8>(src: *const u8, m: &mut Meta) -> [__m256i; 8] {
    let KBlock { q, d, dmin, .. } = decode_block::<K>(src);
    // Q3_K decodes to `q + 4`: the signed `q` here (IQ4_XS and the IQ3 formats decode to the signed value).
    let q = if K == Q3K { q.map(|v| _mm256_sub_epi8(v, _mm256_set1_epi8(4))) } else { q };
    let b = std::slice::from_raw_parts(src, block_bytes(K));
    *m = META0;
    m.d = d;
    m.dmin = dmin;
    match K {
        Q5K => {
            let (sc, mn) = scales_mins_k4(&b[Q4K_SCALES..]);
            for j in 0..8 {
                m.sc[j] = sc[j] as i32;
            }
            for p in 0..4 {
                m.cp[p] = pair(mn[2 * p] as i32, mn[2 * p + 1] as i32);
            }
        }
        Q3K => {
            // As the i16 pair `(sc, 0)` ([`i16_sums`]).
            let sc = q3k_scales(b);
            for j in 0..16 {
                m.sc[j] = pair(sc[j] as i32, 0);
            }
        }
        Q2K => {
            for j in 0..16 {
                m.sc[j] = (b[j] & 0xF) as i32;
            }
            for p in 0..8 {
                m.cp[p] = pair((b[2 * p] >> 4) as i32, (b[2 * p + 1] >> 4) as i32);
            }
        }
        IQ3XXS | IQ3S => {
            for j in 0..8 {
                m.sc[j] = crate::iq3::scale(iq3_dtype(K), b, j);
            }
        }
        _ => m.sc[..8].copy_from_slice(&iq4xs_scales(b)),
    }
    q
}

/// One packed Q4_K group-super-block (8 rows, `repack_k.rs`) → a code block and 8 metas.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_q4k(b: *const u8, dst: *mut u8, m: *mut Meta) {
    let m4 = _mm256_set1_epi8(0x0F);
    for c in 0..4 {
        for k in 0..4 {
            let w: [__m256i; 2] = std::array::from_fn(|h| _mm256_loadu_si256(b.add(q4k_reg(c, k, h)) as *const __m256i));
            // A row's 8 bytes are elements 64c + 8k..+8 (low nibbles), 64c + 32 + 8k..+8 (high).
            put_halves(dst, w.map(|w| _mm256_and_si256(w, m4)), 16 * c + 2 * k, 16 * c + 2 * k + 1);
            put_halves(dst, w.map(|w| _mm256_and_si256(_mm256_srli_epi16(w, 4), m4)), 16 * c + 8 + 2 * k, 16 * c + 8 + 2 * k + 1);
        }
    }
    q4k_metas(b, m);
}

/// The 8 metas of a packed Q4_K / Q5_K group-super-block (`d`, `dmin`, the unpacked scales and
/// mins, where both formats keep them).
#[inline]
unsafe fn q4k_metas(b: *const u8, m: *mut Meta) {
    let bs = std::slice::from_raw_parts(b, Q4K_P_QS);
    for r in 0..GROUP_ROWS {
        let mr = &mut *m.add(r);
        *mr = META0;
        mr.d = f16_at(bs, 2 * r);
        mr.dmin = f16_at(bs, 16 + 2 * r);
        for j in 0..8 {
            mr.sc[j] = bs[Q4K_P_SC + pair_at(r, j)] as i32;
        }
        for p in 0..4 {
            mr.cp[p] = pair(bs[Q4K_P_MIN + pair_at(r, 2 * p)] as i32, bs[Q4K_P_MIN + pair_at(r, 2 * p + 1)] as i32);
        }
    }
}

/// One packed Q5_K group-super-block (8 rows, `repack_k.rs`) → a code block of `u = nibble +
/// 16·fifth bit` and 8 metas: each piece's two half registers, with the fifth bits from the
/// piece's register, leave by [`put_halves`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_q5k(b: *const u8, dst: *mut u8, m: *mut Meta) {
    let m4 = _mm256_set1_epi8(0x0F);
    let ld = |at: usize| _mm256_loadu_si256(b.add(at) as *const __m256i);
    for k in 0..4 {
        // Bit 2c of byte i: the fifth bit of element 64c + 8k + i; bit 2c + 1 of 64c + 32 + 8k + i.
        let qh = [ld(q5k_qh_reg(k, 0)), ld(q5k_qh_reg(k, 1))];
        for c in 0..4 {
            let w = [ld(q5k_reg(c, k, 0)), ld(q5k_reg(c, k, 1))];
            let lo: [__m256i; 2] = std::array::from_fn(|h| _mm256_or_si256(_mm256_and_si256(w[h], m4), bit_to(qh[h], 2 * c, 4)));
            let hi: [__m256i; 2] =
                std::array::from_fn(|h| _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w[h], 4), m4), bit_to(qh[h], 2 * c + 1, 4)));
            // A row's 8 bytes are elements 64c + 8k..+8 (low nibbles), 64c + 32 + 8k..+8 (high).
            put_halves(dst, lo, 16 * c + 2 * k, 16 * c + 2 * k + 1);
            put_halves(dst, hi, 16 * c + 8 + 2 * k, 16 * c + 8 + 2 * k + 1);
        }
    }
    debug_assert_eq!(Q5K_P_QH, Q4K_P_QS, "Q5_K keeps Q4_K's head");
    q4k_metas(b, m);
}

/// Two registers of codes in the packing's halves (`v[h]`: rows `HALF_ROWS[h]`, 8 bytes each,
/// whose first 4 are the code block's 4-element group `ga`, the last 4 of group `gb`) → groups
/// `ga` and `gb` of the code block (8 rows' 4 bytes in row order), one 32-byte store each: per
/// 128-bit lane, words 0 and 2 (1 and 3) of both halves are rows `0, 1, 2, 3` (lane 1: `4..8`)
/// of `ga` (`gb`).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn put_halves(dst: *mut u8, v: [__m256i; 2], ga: usize, gb: usize) {
    debug_assert_eq!(HALF_ROWS, [[0, 1, 4, 5], [2, 3, 6, 7]]);
    let (x, y) = (_mm256_castsi256_ps(v[0]), _mm256_castsi256_ps(v[1]));
    debug_assert!(code_at(0, 4 * ga) == 32 * ga && code_at(0, 4 * gb) == 32 * gb);
    _mm256_storeu_si256(dst.add(32 * ga) as *mut __m256i, _mm256_castps_si256(_mm256_shuffle_ps::<0b10_00_10_00>(x, y)));
    _mm256_storeu_si256(dst.add(32 * gb) as *mut __m256i, _mm256_castps_si256(_mm256_shuffle_ps::<0b11_01_11_01>(x, y)));
}

/// Bit `from` of every byte of `v` moved to bit `to`, the other bits cleared.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn bit_to(v: __m256i, from: usize, to: usize) -> __m256i {
    let moved = if from >= to {
        _mm256_srl_epi16(v, _mm_cvtsi32_si128((from - to) as i32))
    } else {
        _mm256_sll_epi16(v, _mm_cvtsi32_si128((to - from) as i32))
    };
    _mm256_and_si256(moved, _mm256_set1_epi8(1 << to))
}

/// One packed Q3_K group-super-block (8 rows, `repack_k.rs`) → a code block of the signed `q =
/// crumb + 4·high bit − 4` and 8 metas (scales as the i16 pair `(sc, 0)`, [`i16_sums`]): each
/// piece's two half registers leave by [`put_halves`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_q3k(b: *const u8, dst: *mut u8, m: *mut Meta) {
    let m3 = _mm256_set1_epi8(3);
    let b4 = _mm256_set1_epi8(4);
    let ld = |at: usize| _mm256_loadu_si256(b.add(at) as *const __m256i);
    for k in 0..4 {
        // Bit 4n + j of an `hmask` byte: the high bit of element 128n + 32j + l.
        let hm = [ld(q3k_hm_reg(k, 0)), ld(q3k_hm_reg(k, 1))];
        for n in 0..2 {
            let w = [ld(q3k_reg(n, k, 0)), ld(q3k_reg(n, k, 1))];
            for j in 0..4 {
                let q: [__m256i; 2] = std::array::from_fn(|h| {
                    let crumb = _mm256_and_si256(_mm256_srl_epi16(w[h], _mm_cvtsi32_si128(2 * j as i32)), m3);
                    _mm256_sub_epi8(_mm256_or_si256(crumb, bit_to(hm[h], 4 * n + j, 2)), b4)
                });
                // A row's piece: its bytes l = 4k..4k + 4, then l = 16 + 4k..16 + 4k + 4.
                put_halves(dst, q, 32 * n + 8 * j + k, 32 * n + 8 * j + 4 + k);
            }
        }
    }
    let bs = std::slice::from_raw_parts(b, Q3K_P_SC + 128);
    for r in 0..GROUP_ROWS {
        let mr = &mut *m.add(r);
        *mr = META0;
        mr.d = f16_at(bs, 2 * r);
        for j in 0..16 {
            mr.sc[j] = pair(bs[Q3K_P_SC + pair_at(r, j)] as i8 as i32, 0);
        }
    }
}

/// One packed Q2_K group-super-block (8 rows, one per 4-byte lane) → a code block of the crumbs
/// and 8 metas. Register `k` holds the rows' `qs[4k..4k + 4]`; its crumb `j` is, lane by lane,
/// the code block's 4-element group of elements `128n + 32j + 4(k mod 8)..+4` (`n = k / 8`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_q2k(b: *const u8, dst: *mut u8, m: *mut Meta) {
    let m3 = _mm256_set1_epi8(3);
    for k in 0..16 {
        let w = _mm256_loadu_si256(b.add(Q2K_P_QS + 32 * k) as *const __m256i);
        for j in 0..4 {
            let e = 128 * (k / 8) + 32 * j + 4 * (k % 8);
            debug_assert_eq!(code_at(0, e), e / 4 * 32);
            let crumb = _mm256_and_si256(_mm256_srl_epi16(w, _mm_cvtsi32_si128(2 * j as i32)), m3);
            _mm256_storeu_si256(dst.add(e / 4 * 32) as *mut __m256i, crumb);
        }
    }
    let bs = std::slice::from_raw_parts(b, Q2K_P_QS);
    for r in 0..GROUP_ROWS {
        let mr = &mut *m.add(r);
        *mr = META0;
        mr.d = f16_at(bs, 2 * r);
        mr.dmin = f16_at(bs, 16 + 2 * r);
        let byte = |j: usize| bs[Q2K_P_SC + pair_at(r, j)];
        for j in 0..16 {
            mr.sc[j] = (byte(j) & 0xF) as i32;
        }
        for p in 0..8 {
            mr.cp[p] = pair((byte(2 * p) >> 4) as i32, (byte(2 * p + 1) >> 4) as i32);
        }
    }
}

/// One packed IQ4_XS group-super-block (8 rows, one per 4-byte lane) → a code block of the
/// table values and 8 metas. Register `4j + k` holds the rows' `qs[16j + 4k..+4]`: its low
/// nibbles are, lane by lane, the code block's group of elements `32j + 4k..+4`, its high
/// ones of `32j + 16 + 4k..+4`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_iq4xs(b: *const u8, dst: *mut u8, m: *mut Meta) {
    let m4 = _mm256_set1_epi8(0x0F);
    let lut = table(&KVALUES_IQ4NL);
    for j in 0..8 {
        for k in 0..4 {
            let w = _mm256_loadu_si256(b.add(IQ4XS_P_QS + 32 * (4 * j + k)) as *const __m256i);
            let (lo, hi) = (32 * j + 4 * k, 32 * j + 16 + 4 * k);
            debug_assert_eq!(code_at(0, hi), hi / 4 * 32);
            _mm256_storeu_si256(dst.add(lo / 4 * 32) as *mut __m256i, _mm256_shuffle_epi8(lut, _mm256_and_si256(w, m4)));
            let high = _mm256_and_si256(_mm256_srli_epi16(w, 4), m4);
            _mm256_storeu_si256(dst.add(hi / 4 * 32) as *mut __m256i, _mm256_shuffle_epi8(lut, high));
        }
    }
    let bs = std::slice::from_raw_parts(b, IQ4XS_P_QS);
    for r in 0..GROUP_ROWS {
        let mr = &mut *m.add(r);
        *mr = META0;
        mr.d = f16_at(bs, 2 * r);
        for j in 0..8 {
            mr.sc[j] = bs[IQ4XS_P_SC + 8 * j + r] as i8 as i32;
        }
    }
}

/// One packed Q6_K group-super-block (8 rows; codes `u = q + 32`) → a code block of `q` and 8 metas.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_q6k(b: *const u8, dst: *mut u8, m: *mut Meta) {
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    for c in 0..4 {
        for kk in 0..2 {
            // qh_kk, ql_{2kk}, ql_{2kk+1}: pieces m = 2kk (qh bits 0..4) and 2kk + 1 (bits 4..8).
            let ld = |j: usize| -> [__m256i; 2] { std::array::from_fn(|h| _mm256_loadu_si256(b.add(q6k_reg(c, j, h)) as *const __m256i)) };
            let (qh, w0, w1) = (ld(3 * kk), ld(3 * kk + 1), ld(3 * kk + 2));
            let k32 = _mm256_set1_epi8(32);
            let lo0: [__m256i; 2] = std::array::from_fn(|h| {
                _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(w0[h], m4), _mm256_and_si256(_mm256_slli_epi16(qh[h], 4), m30)), k32)
            });
            let hi0: [__m256i; 2] = std::array::from_fn(|h| {
                _mm256_sub_epi8(
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w0[h], 4), m4), _mm256_and_si256(_mm256_slli_epi16(qh[h], 2), m30)),
                    k32,
                )
            });
            let lo1: [__m256i; 2] =
                std::array::from_fn(|h| _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(w1[h], m4), _mm256_and_si256(qh[h], m30)), k32));
            let hi1: [__m256i; 2] = std::array::from_fn(|h| {
                _mm256_sub_epi8(
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(w1[h], 4), m4), _mm256_and_si256(_mm256_srli_epi16(qh[h], 2), m30)),
                    k32,
                )
            });
            // Piece m's 8 bytes are elements 64c + 8m..+8 (low nibbles), 64c + 32 + 8m..+8 (high).
            let (ma, mb) = (2 * kk, 2 * kk + 1);
            put_halves(dst, lo0, 16 * c + 2 * ma, 16 * c + 2 * ma + 1);
            put_halves(dst, hi0, 16 * c + 8 + 2 * ma, 16 * c + 8 + 2 * ma + 1);
            put_halves(dst, lo1, 16 * c + 2 * mb, 16 * c + 2 * mb + 1);
            put_halves(dst, hi1, 16 * c + 8 + 2 * mb, 16 * c + 8 + 2 * mb + 1);
        }
    }
    let bs = std::slice::from_raw_parts(b, Q6K_P_Q);
    for r in 0..GROUP_ROWS {
        let mr = &mut *m.add(r);
        *mr = META0;
        mr.d = f16_at(bs, 2 * r);
        let sc = |j: usize| bs[Q6K_P_SC + pair_at(r, j)] as i8 as i32;
        for j in 0..16 {
            mr.sc[j] = sc(j);
        }
    }
}

/// Sub-blocks per super-block of format `K` (16 or 32 values each).
const fn nsub(k: u8) -> usize {
    match k {
        Q6K | Q3K | Q2K => 16,
        _ => 8,
    }
}

/// Whether a sub-block's integer sum of format `K` fits in i16 (then `sc[j]` is stored as the
/// i16 pair `(sc_j, 0)` and one `vpdpwssd` applies it): Q3_K's 16 codes `q ∈ [-4, 3]` against
/// `x + 128 ≤ 255` reach at most 16·4·255 = 16,320 in magnitude, Q2_K's `u ≤ 3` against `|x| ≤
/// 127` (Q8_K's codes) at most 6,096. The other formats' sums need up to 21 bits and a `vpmulld`.
const fn i16_sums(k: u8) -> bool {
    matches!(k, Q3K | Q2K)
}

/// Whether `K` has mins (`acc += (d·dx)·isum − (dmin·dx)·msum`); else `acc += (d·dx)·isum`.
const fn has_min(k: u8) -> bool {
    matches!(k, Q4K | Q5K | Q2K)
}

/// Sets `c` of the 8 metas at `m` from the (band, super-block) code block at `codes`
/// (`ns` sub-blocks): `128·Σ_j sc_j·Σ_{e∈j} q_e` per row, what the activations' `+ 128` adds to
/// the kernel's sum. The rows' code sums come 8 at a time, one `vpdpbusd` against ones per
/// 4-element group of the block.
#[target_feature(enable = "avx512f,avx512vl,avx512vnni,avx2")]
unsafe fn row_constants(codes: *const u8, m: *mut Meta, ns: usize) {
    let ones = _mm256_set1_epi8(1);
    let per = 64 / ns;
    let mut c = _mm256_setzero_si256();
    for j in 0..ns {
        let mut q = _mm256_setzero_si256();
        for kg in j * per..(j + 1) * per {
            q = _mm256_dpbusd_epi32(q, ones, _mm256_loadu_si256(codes.add(kg * 32) as *const __m256i));
        }
        // `as i16`: Q3_K's scales are stored as i16 pairs `(sc, 0)` ([`i16_sums`]).
        let sc = |r: usize| (*m.add(r)).sc[j] as i16 as i32;
        let scales = _mm256_setr_epi32(sc(0), sc(1), sc(2), sc(3), sc(4), sc(5), sc(6), sc(7));
        c = _mm256_add_epi32(c, _mm256_mullo_epi32(q, scales));
    }
    let mut out = [0i32; BAND];
    _mm256_storeu_si256(out.as_mut_ptr() as *mut __m256i, _mm256_slli_epi32::<7>(c));
    for (r, v) in out.into_iter().enumerate() {
        (*m.add(r)).c = v;
    }
}

/// Writes a band's results (`res[r]`: row `r`'s 16 tokens) to the output, token `t` at
/// `base + t · ldo`, rows side by side: tokens `0..nt`, rows `0..live`. An 8 × 16 transpose in
/// registers (per 128-bit lane: pairs, then quads of rows; then each token's two quads joined),
/// so each token's rows leave in one 256-bit store.
#[inline]
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn store_band(res: &[__m512; BAND], base: *mut f32, ldo: usize, nt: usize, live: usize) {
    // quads[h][k], per 128-bit lane `l`: rows `4h..4h + 4` of token `4l + k`.
    let mut quads = [[_mm512_setzero_ps(); 4]; 2];
    for (h, q) in quads.iter_mut().enumerate() {
        let f = &res[4 * h..4 * h + 4];
        let (t0, t1) = (_mm512_unpacklo_ps(f[0], f[1]), _mm512_unpackhi_ps(f[0], f[1]));
        let (t2, t3) = (_mm512_unpacklo_ps(f[2], f[3]), _mm512_unpackhi_ps(f[2], f[3]));
        *q = [
            _mm512_shuffle_ps::<0x44>(t0, t2),
            _mm512_shuffle_ps::<0xEE>(t0, t2),
            _mm512_shuffle_ps::<0x44>(t1, t3),
            _mm512_shuffle_ps::<0xEE>(t1, t3),
        ];
    }
    // Lanes 0, 1 of each quad register joined: tokens k, 4 + k; lanes 2, 3: 8 + k, 12 + k.
    let lo = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    let hi = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    let mask = ((1u32 << live) - 1) as __mmask8;
    for k in 0..4 {
        let (a, b) = (quads[0][k], quads[1][k]);
        for (j, idx) in [lo, hi].into_iter().enumerate() {
            let w = _mm512_permutex2var_ps(a, idx, b);
            let halves = [_mm512_castps512_ps256(w), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(w)))];
            for (i, v) in halves.into_iter().enumerate() {
                let t = 8 * j + 4 * i + k;
                if t < nt {
                    _mm256_mask_storeu_ps(base.add(t * ldo), mask, v);
                }
            }
        }
    }
}

/// One band (8 rows; codes `bc`, metas `bm`) × token group `g`: row `r`'s 16 tokens in `[r]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn band<const K: u8>(bc: *const u8, bm: *const Meta, lanes: &TokenLanes, g: usize) -> [__m512; BAND] {
    let nb = lanes.nb;
    let ns = nsub(K);
    let kps = 64 / ns;
    let zero = _mm512_setzero_si512();
    let mut facc = [_mm512_setzero_ps(); BAND];
    for i in 0..nb {
        let lb = g * nb + i;
        let xp = lanes.xq.as_ptr().add(lb * 64) as *const __m512i;
        let wc = bc.add(i * 2048) as *const i32;
        let m = bm.add(i * BAND);
        let mut s1 = [zero; BAND];
        // Two sub-blocks at a time: 16 independent `vpdpbusd` chains of `kps` steps, enough
        // to cover the instruction's latency at two per cycle (8 chains, one sub-block, are not).
        for sp in 0..ns / 2 {
            let mut raw = [[zero; BAND]; 2];
            for kk in 0..kps {
                let kg = [2 * sp * kps + kk, (2 * sp + 1) * kps + kk];
                let x = kg.map(|kg| _mm512_load_si512(xp.add(kg) as *const _));
                for r in 0..BAND {
                    for h in 0..2 {
                        let w = _mm512_set1_epi32(wc.add(kg[h] * BAND + r).read());
                        // Unsigned codes × signed activations, or unsigned `x + 128` × signed codes.
                        raw[h][r] =
                            if has_min(K) { _mm512_dpbusd_epi32(raw[h][r], w, x[h]) } else { _mm512_dpbusd_epi32(raw[h][r], x[h], w) };
                    }
                }
            }
            for r in 0..BAND {
                for (h, raw) in raw.iter().enumerate() {
                    let sc = _mm512_set1_epi32((*m.add(r)).sc[2 * sp + h]);
                    s1[r] = if i16_sums(K) {
                        // The sub-block's sum fits in the low i16 of each lane, and the scale is
                        // stored as the pair `(sc, 0)`: one `vpdpwssd` multiplies and adds.
                        _mm512_dpwssd_epi32(s1[r], raw[r], sc)
                    } else {
                        _mm512_add_epi32(s1[r], _mm512_mullo_epi32(raw[r], sc))
                    };
                }
            }
        }
        let dx = _mm512_load_ps(lanes.dx.as_ptr().add(lb) as *const f32);
        for r in 0..BAND {
            let mr = &*m.add(r);
            let dd = _mm512_mul_ps(_mm512_set1_ps(mr.d), dx);
            let term = if has_min(K) {
                // The tokens' block sums (only the signed lanes of formats with mins hold them).
                let (bsp, np) = if ns == 16 {
                    (lanes.bs16.as_ptr().add(lb * 8) as *const __m512i, 8)
                } else {
                    (lanes.bs32.as_ptr().add(lb * 4) as *const __m512i, 4)
                };
                let mut msum = zero;
                for p in 0..np {
                    msum = _mm512_dpwssd_epi32(msum, _mm512_set1_epi32(mr.cp[p]), _mm512_load_si512(bsp.add(p) as *const _));
                }
                let t = _mm512_mul_ps(dd, _mm512_cvtepi32_ps(s1[r]));
                let u = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(mr.dmin), dx), _mm512_cvtepi32_ps(msum));
                _mm512_sub_ps(t, u)
            } else {
                let isum = _mm512_sub_epi32(s1[r], _mm512_set1_epi32(mr.c));
                _mm512_mul_ps(dd, _mm512_cvtepi32_ps(isum))
            };
            facc[r] = _mm512_add_ps(facc[r], term);
        }
    }
    facc
}
