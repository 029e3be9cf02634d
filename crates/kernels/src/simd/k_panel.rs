//! Multi-token (prefill) path of the formats of `avx2_k` — Q5_K, Q3_K, Q2_K, IQ4_XS, IQ3_XXS,
//! IQ3_S — on the AVX2 path (AVX-512 CPUs run `vnni_k` instead above its token threshold, which
//! the IQ3 formats never take).
//!
//! The decode tiles (`avx2_k::tile`, one row × ≤ 4 tokens) decode every weight super-block
//! again for each group of 4 tokens. Here a chunk's rows are decoded **once per call** into a
//! per-thread panel and a 4-row × ≤ 4-token micro-kernel sweeps all the call's tokens over it.
//!
//! The panel keeps 4 rows in one register, as the packed Q4_K kernels do: for each (4-row
//! group, super-block) and 32-element register `g` of [`KBlock`], register `(g, m)` holds, in
//! 64-bit lane `r`, row `r`'s 8 values `32g + 8m .. 32g + 8m + 8`, so one `vpmaddubsw` against
//! the activation's 8 bytes broadcast gives 4 rows' i16 pair sums. The pieces of a sub-block
//! add in i16 before one `vpmaddwd` with the 4 rows' scales (Q5_K: 4 pieces, |4 · 2·31·128| =
//! 31,744 < 2^15; Q3_K / Q2_K: 2 pieces of a 16-element sub-block, 2 · 2·7·128): per 256
//! weights and token 8 multiplies and 2 (Q5_K) or 4 (Q3_K, Q2_K) widenings, where element
//! order took 8 and 8. IQ4_XS's signed table values (|q| ≤ 127) leave no i16 room, so its
//! panel — and the IQ3 formats', multiplied the same way — keeps each row's registers in element
//! order, one widening per register. On CPUs with one vector-multiply pipe (Zen 1: 2 µops
//! per 256-bit multiply) the multiplies are the kernel's cost.
//!
//! Bitwise the scalar reference, as the decode tiles: each (row, token, super-block) gets the
//! same exact integers (integer sums in any order, none overflowing), then
//! `avx2_k::block_term`'s float operations, so a token's output does not depend on whether it
//! came in a prefill or a decode call.

use super::avx2::f16_load;
use super::avx2_k::{block_bytes, block_term, decode_block, hsum_rows, signed, tag, KBlock, IQ3S, IQ3XXS, IQ4XS, Q2K, Q3K, Q5K};
use super::avx2_packed_k::bcast8;
use super::avx2_q32::table;
use super::{Acts, Isa, TileCtx};
use crate::blocks::{KVALUES_IQ4NL, QK_K};
use crate::dtype::DType;
use crate::quantize::ActQ8K;
use crate::repack::{group_block_bytes, Packed, GROUP_ROWS};
use crate::repack_k::{q2k_source_block, q5k_source_block, IQ4XS_P_QS, IQ4XS_P_SC};
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Fewest tokens in a call for this path; smaller calls (decode) keep the decode tiles, which
/// need no panel store.
pub(crate) const MIN_TOKENS: usize = 8;

/// Rows of a panel group (one micro-kernel call; one 64-bit register lane each). A chunk's
/// last group is padded with zero rows whose results are not stored.
const GROUP: usize = 4;

/// Panel registers per (group, super-block). Q5_K / Q3_K / Q2_K: 32 value pieces `(g, m)` at
/// `4g + m`, then the scales of each register's two halves at `SCALES + 2g` (elements
/// `32g..32g+16`) and `SCALES + 2g + 1` (`32g+16..32g+32`; Q5_K: the same), then each row's
/// block-sum weights (`corr_w`) at `CORR + r`. IQ4_XS (no block-sum term): row `r`'s
/// [`KBlock`] registers in element order, `q[g]` at `16r + g`, `s[g]` at `16r + 8 + g`.
const VPG: usize = 16 * GROUP;
/// Where a (group, super-block)'s scale registers start (interleaved formats).
const SCALES: usize = 32;
/// Where a (group, super-block)'s `corr_w` registers start (interleaved formats).
const CORR: usize = 48;

/// Whether the multi-token path takes a call of `n_tokens` tokens of format `d` on `isa`. On
/// the AVX-512 and AMX paths it takes the calls the token-lane kernel (`vnni_k`) leaves below
/// its threshold (the caller asks `vnni_k` first); the panels give the decode tiles' bits, as
/// that kernel does, so which of them runs moves only time. The IQ3 formats there keep their
/// gathered-row tiles (`avx512_iq3`) below the threshold instead: 4-token passes of IQ3_S cost
/// 57 ns per 2048-column row-token against the panels' 96 at 8 tokens (Intel Xeon family 6
/// model 207, `bench kernels --threads 1 --clock cpu`).
pub(crate) fn takes(isa: Isa, d: DType, n_tokens: usize) -> bool {
    let iq3_gathered = matches!(isa, Isa::Avx512 | Isa::Amx) && matches!(d, DType::IQ3XXS | DType::IQ3S);
    matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Amx) && tag(d).is_some() && n_tokens >= MIN_TOKENS && !iq3_gathered
}

/// Fewest tokens of a call on a packed matrix that this path takes, decoding its panel from
/// the packing: below it the packed kernels (4 tokens a pass) cost less per row-token than
/// the panel's decoding per call (Zen 1, `bench kernels --rows 4096 --threads 1 --clock cpu`:
/// Q2_K at 8 / 16 tokens 198 / 150 ns per row-token from the packing against ~119 for the
/// packed kernel, at 64 tokens 112 against ~119; Q5_K at 8 / 16 / 32 / 64 / 128 tokens
/// 197–201 / 141–143 / 114–116 / 96–100 / 93 against 98–109). Packed Q3_K never comes here:
/// its packed kernel ran 106 ns per row-token at 64 / 128 / 256 tokens against 118 / 109 / 108
/// for the panel from its packing and 113 / 108 / 107 from the file's bytes.
pub(crate) const PACKED_MIN_TOKENS: usize = 64;

/// Whether a call of `n_tokens` tokens on a packing of `d` runs here, its panel decoded from
/// the packing (IQ4_XS: `fill_rows_packed`; Q2_K, Q5_K: `fill` from each row's block copied
/// out of its group) instead of the packed kernels.
pub(crate) fn reads_packing(d: DType, n_tokens: usize) -> bool {
    matches!(d, DType::IQ4XS | DType::Q2K | DType::Q5K) && n_tokens >= PACKED_MIN_TOKENS
}

/// Panel bytes one weight row of `cols` columns takes (for chunk sizing).
pub(crate) fn panel_row_bytes(cols: usize) -> usize {
    cols / QK_K * (VPG * 32 / GROUP + 8)
}

/// Rows a chunk may hold so its panel stays L2-resident (≈ 256 KiB), a multiple of [`GROUP`].
pub(crate) fn chunk_rows(cols: usize) -> usize {
    ((256 * 1024) / panel_row_bytes(cols).max(1)).max(1).div_ceil(GROUP) * GROUP
}

thread_local! {
    /// This thread's panel: registers and per (group, super-block, row) `[d, dmin]`.
    static PANEL: RefCell<(Vec<__m256i>, Vec<[f32; 2]>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Expands a runtime (format tag Q5_K / Q3_K / Q2_K, token count 1..=4) into `f::<K, NT>(args)`.
macro_rules! k_dispatch {
    ($k:expr, $nt:expr, $f:ident($($arg:expr),*)) => {
        match ($k, $nt) {
            (Q5K, 1) => $f::<Q5K, 1>($($arg),*),
            (Q5K, 2) => $f::<Q5K, 2>($($arg),*),
            (Q5K, 3) => $f::<Q5K, 3>($($arg),*),
            (Q5K, _) => $f::<Q5K, 4>($($arg),*),
            (Q3K, 1) => $f::<Q3K, 1>($($arg),*),
            (Q3K, 2) => $f::<Q3K, 2>($($arg),*),
            (Q3K, 3) => $f::<Q3K, 3>($($arg),*),
            (Q3K, _) => $f::<Q3K, 4>($($arg),*),
            (Q2K, 1) => $f::<Q2K, 1>($($arg),*),
            (Q2K, 2) => $f::<Q2K, 2>($($arg),*),
            (Q2K, 3) => $f::<Q2K, 3>($($arg),*),
            (_, _) => $f::<Q2K, 4>($($arg),*),
        }
    };
}

/// Computes output rows `r0..r1` for all `n_tokens` tokens, in spans of at most
/// [`chunk_rows`] rows (one panel each, so a single-threaded call over a whole matrix still
/// works in L2).
///
/// # Safety
/// `isa` is one [`takes`] accepts and is available; `c`'s matrix is of a format [`takes`]
/// accepts with Q8_K activations; rows `r0..r1` are in bounds and no other thread writes them.
pub(crate) unsafe fn run_rows(c: &TileCtx, r0: usize, r1: usize, n_tokens: usize) {
    let span = chunk_rows(c.w.cols);
    let mut s0 = r0;
    while s0 < r1 {
        let s1 = (s0 + span).min(r1);
        run_span(c, s0, s1, n_tokens);
        s0 = s1;
    }
}

/// [`run_rows`] on one panel's rows.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_span(c: &TileCtx, r0: usize, r1: usize, n_tokens: usize) {
    let Acts::Q8K(a) = c.acts else { unreachable!("activations prepared for the wrong dtype") };
    let k = tag(c.w.dtype).expect("format checked by takes()");
    let nb = a.blocks_per_row;
    let rows = r1 - r0;
    let groups = rows.div_ceil(GROUP);
    PANEL.with(|cell| {
        let (regs, meta) = &mut *cell.borrow_mut();
        // Grown, never cleared: `fill` writes every register and scale pair the kernels read
        // (a padding row's as zeros), so reuse costs no memset.
        grow(regs, groups * nb * VPG, _mm256_setzero_si256());
        grow(meta, groups * nb * GROUP, [0.0; 2]);
        let w = c.w.data.as_ptr().add(r0 * c.w.row_bytes());
        match k {
            Q5K => fill::<Q5K>(w, c.w.row_bytes(), rows, nb, regs, meta, c.w.packed.map(|p| (p, r0))),
            Q3K => fill::<Q3K>(w, c.w.row_bytes(), rows, nb, regs, meta, None),
            Q2K => fill::<Q2K>(w, c.w.row_bytes(), rows, nb, regs, meta, c.w.packed.map(|p| (p, r0))),
            IQ3XXS => fill_rows::<IQ3XXS>(w, c.w.row_bytes(), rows, nb, regs, meta),
            IQ3S => fill_rows::<IQ3S>(w, c.w.row_bytes(), rows, nb, regs, meta),
            _ => match c.w.packed {
                Some(p) => fill_rows_packed(p, r0, rows, nb, regs, meta),
                None => fill_rows::<IQ4XS>(w, c.w.row_bytes(), rows, nb, regs, meta),
            },
        }
        let mut t0 = 0;
        while t0 < n_tokens {
            let nt = (n_tokens - t0).min(4);
            for g in 0..groups {
                let p = Panel { regs: regs.as_ptr().add(g * nb * VPG), meta: meta.as_ptr().add(g * nb * GROUP), nb };
                let out = c.out.add(t0 * c.ldo + r0 + g * GROUP);
                let live = (rows - g * GROUP).min(GROUP);
                if signed(k) {
                    for h in 0..GROUP / 2 {
                        if 2 * h < live {
                            let (o, l) = (out.add(2 * h), live - 2 * h);
                            match nt {
                                1 => micro_rows::<1>(&p, 2 * h, a, t0, o, c.ldo, l),
                                2 => micro_rows::<2>(&p, 2 * h, a, t0, o, c.ldo, l),
                                3 => micro_rows::<3>(&p, 2 * h, a, t0, o, c.ldo, l),
                                _ => micro_rows::<4>(&p, 2 * h, a, t0, o, c.ldo, l),
                            }
                        }
                    }
                } else {
                    k_dispatch!(k, nt, micro_avx2(&p, a, t0, out, c.ldo, live));
                }
            }
            t0 += nt;
        }
    });
}

/// Makes `v` at least `n` long (new elements `z`; existing ones kept, not cleared).
fn grow<T: Copy>(v: &mut Vec<T>, n: usize, z: T) {
    if v.len() < n {
        v.resize(n, z);
    }
}

/// Lane `r` (64 bits) of the result = 64-bit lane `m` of `v[r]`, for `m` = 0..4: the 4×4
/// transpose of 64-bit pieces.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn transpose_q(v: [__m256i; GROUP]) -> [__m256i; 4] {
    let t0 = _mm256_unpacklo_epi64(v[0], v[1]); // r0m0 r1m0 | r0m2 r1m2
    let t1 = _mm256_unpackhi_epi64(v[0], v[1]); // r0m1 r1m1 | r0m3 r1m3
    let t2 = _mm256_unpacklo_epi64(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi64(v[2], v[3]);
    [
        _mm256_permute2x128_si256::<0x20>(t0, t2),
        _mm256_permute2x128_si256::<0x20>(t1, t3),
        _mm256_permute2x128_si256::<0x31>(t0, t2),
        _mm256_permute2x128_si256::<0x31>(t1, t3),
    ]
}

/// Decodes the `rows` rows (`rb` bytes apart) of format `K` at `w`, `nb` super-blocks each,
/// into the panel: 4-row groups, rows past `rows` as zeros. With `packed` (Q2_K's or Q5_K's
/// packing and the first row), each row's block is copied out of its group instead (the same
/// bytes), so a packed matrix's prefill never touches the file's bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn fill<const K: u8>(
    w: *const u8,
    rb: usize,
    rows: usize,
    nb: usize,
    regs: &mut [__m256i],
    meta: &mut [[f32; 2]],
    packed: Option<(&Packed, usize)>,
) {
    let zero = KBlock { q: [_mm256_setzero_si256(); 8], s: [_mm256_setzero_si256(); 8], corr_w: _mm256_setzero_si256(), d: 0.0, dmin: 0.0 };
    let decode = |r: usize, i: usize| match packed {
        Some((p, r0)) => {
            let gbb = group_block_bytes(p.dtype());
            let row = r0 + r;
            let gb = &p.group(row / GROUP_ROWS)[i * gbb..(i + 1) * gbb];
            match p.dtype() {
                DType::Q2K => decode_block::<K>(q2k_source_block(gb, row % GROUP_ROWS).as_ptr()),
                d => {
                    debug_assert_eq!(d, DType::Q5K, "only Q2_K's and Q5_K's panels are copied out of their packings");
                    decode_block::<K>(q5k_source_block(gb, row % GROUP_ROWS).as_ptr())
                }
            }
        }
        None => decode_block::<K>(w.add(r * rb + i * block_bytes(K))),
    };
    for g0 in (0..rows).step_by(GROUP) {
        for i in 0..nb {
            let blocks: [KBlock; GROUP] = std::array::from_fn(|r| if g0 + r < rows { decode(g0 + r, i) } else { zero });
            let at = (g0 / GROUP * nb + i) * VPG;
            let dst = &mut regs[at..at + VPG];
            for g in 0..8 {
                dst[4 * g..4 * g + 4].copy_from_slice(&transpose_q(std::array::from_fn(|r| blocks[r].q[g])));
                // The scales are constant over each 128-bit half of `s[g]`: its pieces 0 and 2.
                let s = transpose_q(std::array::from_fn(|r| blocks[r].s[g]));
                dst[SCALES + 2 * g] = s[0];
                dst[SCALES + 2 * g + 1] = s[2];
            }
            for (r, b) in blocks.iter().enumerate() {
                dst[CORR + r] = b.corr_w;
                meta[(g0 / GROUP * nb + i) * GROUP + r] = [b.d, b.dmin];
            }
        }
    }
}

/// The panel of the signed-value formats (IQ4_XS, IQ3_XXS, IQ3_S): each row's [`KBlock`]
/// registers in element order (signed values leave no i16 room to sum pieces across rows'
/// registers, so they are multiplied as decoded).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_rows<const K: u8>(w: *const u8, rb: usize, rows: usize, nb: usize, regs: &mut [__m256i], meta: &mut [[f32; 2]]) {
    for r in 0..rows.div_ceil(GROUP) * GROUP {
        for i in 0..nb {
            let at = (r / GROUP * nb + i) * VPG + 16 * (r % GROUP);
            let dst = &mut regs[at..at + 16];
            let m = &mut meta[(r / GROUP * nb + i) * GROUP + r % GROUP];
            if r < rows {
                let KBlock { q, s, d, dmin, .. } = decode_block::<K>(w.add(r * rb + i * block_bytes(K)));
                dst[..8].copy_from_slice(&q);
                dst[8..].copy_from_slice(&s);
                *m = [d, dmin];
            } else {
                dst.fill(_mm256_setzero_si256());
                *m = [0.0; 2];
            }
        }
    }
}

/// [`fill_rows`] from IQ4_XS's packing (`repack_k.rs`: row `r` in lane `r % 8` of its group's
/// registers, the scales unpacked): the same registers and scales, read from the packing so
/// that a packed matrix's prefill never touches the file's bytes. `r0` is the first row.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill_rows_packed(p: &Packed, r0: usize, rows: usize, nb: usize, regs: &mut [__m256i], meta: &mut [[f32; 2]]) {
    let gbb = group_block_bytes(DType::IQ4XS);
    let lut = table(&KVALUES_IQ4NL);
    let m4 = _mm256_set1_epi8(0x0F);
    for r in 0..rows.div_ceil(GROUP) * GROUP {
        for i in 0..nb {
            let at = (r / GROUP * nb + i) * VPG + 16 * (r % GROUP);
            let dst = &mut regs[at..at + 16];
            let m = &mut meta[(r / GROUP * nb + i) * GROUP + r % GROUP];
            if r >= rows {
                dst.fill(_mm256_setzero_si256());
                *m = [0.0; 2];
                continue;
            }
            let (g, lane) = ((r0 + r) / GROUP_ROWS, (r0 + r) % GROUP_ROWS);
            let gb = p.group(g).as_ptr().add(i * gbb);
            for j in 0..8 {
                // The row's 16 nibble bytes of sub-block j: 4 bytes from each of its 4 registers.
                let d4 = |k: usize| (gb.add(IQ4XS_P_QS + 32 * (4 * j + k) + 4 * lane) as *const i32).read_unaligned();
                let v = _mm_setr_epi32(d4(0), d4(1), d4(2), d4(3));
                dst[j] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), m4));
                dst[8 + j] = _mm256_set1_epi16(*gb.add(IQ4XS_P_SC + 8 * j + lane) as i8 as i16);
            }
            *m = [f16_load(gb.add(2 * lane)), 0.0];
        }
    }
}

/// One [`GROUP`] of decoded rows: super-block `i`'s registers start at `i·VPG`, row `r`'s
/// scales at `meta[i·GROUP + r]`.
struct Panel {
    regs: *const __m256i,
    meta: *const [f32; 2],
    nb: usize,
}

/// Writes `acc[r][t]` of the first `live` rows (of `R`) × `NT` tokens.
#[inline]
unsafe fn store<const R: usize, const NT: usize>(acc: &[[f32; NT]; R], out: *mut f32, ldo: usize, live: usize) {
    for r in 0..R.min(live) {
        for t in 0..NT {
            *out.add(t * ldo + r) = acc[r][t];
        }
    }
}

/// The block-sum terms `Σ_k bsums[t][k]·corr_w[k]` of up to 4 tokens (lane t), exactly.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn corr4<const NT: usize>(bsv: &[__m256i; 4], corr_w: __m256i) -> __m128i {
    let mut cv = [_mm256_setzero_si256(); 4];
    for t in 0..NT {
        cv[t] = _mm256_madd_epi16(bsv[t], corr_w);
    }
    // Lane t of the low half: lanes 0..4 of cv[t] summed; of the high half: lanes 4..8.
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(cv[0], cv[1]), _mm256_hadd_epi32(cv[2], cv[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
}

/// The activation scales and block sums of tokens `t0..t0 + NT`, super-block `i` (Q5_K / Q3_K
/// / Q2_K: the formats with a block-sum term).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn token_terms<const NT: usize>(a: &ActQ8K, nb: usize, i: usize, t0: usize) -> ([f32; 4], [__m256i; 4]) {
    let mut dxs = [0f32; 4];
    let mut bsv = [_mm256_setzero_si256(); 4];
    for t in 0..NT {
        let ab = (t0 + t) * nb + i;
        dxs[t] = *a.d.get_unchecked(ab);
        bsv[t] = _mm256_loadu_si256(a.bsums.as_ptr().add(ab * 16) as *const __m256i);
    }
    (dxs, bsv)
}

/// The end of super-block `i` for the group's rows × `NT` tokens: exact per-(row, token)
/// integer sums (row `r`'s two lanes of `isum[t]`; the block-sum terms by one `vphaddd`
/// tree), then [`block_term`] added to each (row, token) accumulator, as the decode tile
/// does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn epilogue<const K: u8, const NT: usize>(
    isum: &[__m256i; NT],
    p: &Panel,
    i: usize,
    a: &ActQ8K,
    t0: usize,
    acc: &mut [[f32; NT]; GROUP],
) {
    let (dxs, bsv) = token_terms::<NT>(a, p.nb, i, t0);
    let mut lanes = [[0i32; 8]; NT];
    for t in 0..NT {
        _mm256_storeu_si256(lanes[t].as_mut_ptr() as *mut __m256i, isum[t]);
    }
    let blk = p.regs.add(i * VPG);
    for r in 0..GROUP {
        let [d, dmin] = *p.meta.add(i * GROUP + r);
        let mut corr = [0i32; 4];
        _mm_storeu_si128(corr.as_mut_ptr() as *mut __m128i, corr4::<NT>(&bsv, *blk.add(CORR + r)));
        for t in 0..NT {
            let tot = lanes[t][2 * r] + lanes[t][2 * r + 1];
            acc[r][t] += block_term::<K>(tot, corr[t], d, dmin, dxs[t]);
        }
    }
}

/// 4 panel rows (one [`GROUP`]) × `NT` tokens: per 32-element register, 4 `vpmaddubsw` of
/// its row-interleaved pieces, the pieces of a sub-block summed in i16, one `vpmaddwd` per
/// sub-block with the 4 rows' scales (Q5_K / Q3_K / Q2_K).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn micro_avx2<const K: u8, const NT: usize>(p: &Panel, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize, live: usize) {
    let nb = p.nb;
    let mut acc = [[0f32; NT]; GROUP];
    for i in 0..nb {
        let blk = p.regs.add(i * VPG);
        let xb: [*const i8; NT] = std::array::from_fn(|t| a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K));
        let mut isum = [_mm256_setzero_si256(); NT];
        for g in 0..8 {
            let (s_lo, s_hi) = (*blk.add(SCALES + 2 * g), *blk.add(SCALES + 2 * g + 1));
            // Pieces 0, 1: the register's first 16 elements; 2, 3: the last 16.
            let mut lo = [_mm256_setzero_si256(); NT];
            let mut hi = [_mm256_setzero_si256(); NT];
            for m in 0..4 {
                let q = *blk.add(4 * g + m);
                for t in 0..NT {
                    let d = _mm256_maddubs_epi16(q, bcast8(xb[t].add(32 * g + 8 * m)));
                    if m < 2 || K == Q5K {
                        lo[t] = _mm256_add_epi16(lo[t], d);
                    } else {
                        hi[t] = _mm256_add_epi16(hi[t], d);
                    }
                }
            }
            for t in 0..NT {
                let mut s = _mm256_madd_epi16(lo[t], s_lo);
                if K != Q5K {
                    s = _mm256_add_epi32(s, _mm256_madd_epi16(hi[t], s_hi));
                }
                isum[t] = _mm256_add_epi32(isum[t], s);
            }
        }
        epilogue::<K, NT>(&isum, p, i, a, t0, &mut acc);
    }
    store(&acc, out, ldo, live);
}

/// IQ4_XS: group rows `r0, r0 + 1` × `NT` tokens of a [`fill_rows`] panel, per 32-element
/// register one sign trick, `vpmaddubsw` and `vpmaddwd` with its scale per (row, token), the
/// activation register loaded once for both rows; then [`block_term`] per (row, token).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn micro_rows<const NT: usize>(p: &Panel, r0: usize, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize, live: usize) {
    const R: usize = 2;
    let nb = p.nb;
    let mut acc = [[0f32; NT]; R];
    for i in 0..nb {
        let mut isum = [[_mm256_setzero_si256(); NT]; R];
        for g in 0..8 {
            let mut xs = [_mm256_setzero_si256(); NT];
            for t in 0..NT {
                xs[t] = _mm256_loadu_si256(a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K + 32 * g) as *const __m256i);
            }
            for r in 0..R {
                let blk = p.regs.add(i * VPG + 16 * (r0 + r));
                let (q, s) = (*blk.add(g), *blk.add(8 + g));
                let qa = _mm256_sign_epi8(q, q);
                for t in 0..NT {
                    isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, _mm256_sign_epi8(xs[t], q)), s));
                }
            }
        }
        let mut dxs = [0f32; NT];
        for t in 0..NT {
            dxs[t] = *a.d.get_unchecked((t0 + t) * nb + i);
        }
        for r in 0..R {
            let [d, dmin] = *p.meta.add(i * GROUP + r0 + r);
            let mut tot = [0i32; 4];
            _mm_storeu_si128(tot.as_mut_ptr() as *mut __m128i, hsum_rows::<NT>(&isum[r]));
            for t in 0..NT {
                acc[r][t] += block_term::<IQ4XS>(tot[t], 0, d, dmin, dxs[t]);
            }
        }
    }
    store(&acc, out, ldo, live);
}
