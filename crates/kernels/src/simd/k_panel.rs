//! Multi-token (prefill) path of the formats of `avx2_k` — Q5_K, Q3_K, Q2_K, IQ4_XS — on the
//! AVX2 and AVX-512 paths.
//!
//! The decode tiles (`avx2_k::tile`, one row × ≤ 4 tokens) decode every weight super-block
//! again for each group of 4 tokens. Here a chunk's rows are decoded **once per call** into a
//! per-thread panel, and register-tiled micro-kernels sweep all the call's tokens over it:
//! * AVX2: the panel holds [`KBlock`]'s 8 value and 8 scale registers per (row, super-block);
//!   2 rows × 4 tokens of `vpmaddubsw` + `vpmaddwd`, as the decode tile.
//! * AVX-512 (and AMX, whose path runs these formats on AVX-512): the panel holds each value
//!   already multiplied by its sub-block scale, as i16; the activations of a 4-token group are
//!   widened to i16 once per panel; 4 rows × 4 tokens of one VNNI `vpdpwssd` per 32 elements.
//!
//! Bitwise the decode tiles' results: each (row, token, super-block) gets the same 8 lanes of
//! integers (lane l sums elements 4l..4l+4 of every 32-element group, which the 512-bit
//! kernel rebuilds by adding its two 256-bit halves — integer sums are exact in any order),
//! goes through `avx2_k::finish_block`'s float operations, and ends in the same
//! `hsum(acc) − macc`, so a token's output does not depend on whether it came in a prefill or
//! a decode call.

use super::avx2::hsum;
use super::avx2_k::{block_bytes, decode_block, tag, KBlock, IQ4XS, Q2K, Q3K, Q5K};
use super::{Acts, Isa, TileCtx};
use crate::blocks::QK_K;
use crate::dtype::DType;
use crate::quantize::ActQ8K;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Fewest tokens in a call for this path; smaller calls (decode) keep the decode tiles, which
/// need no panel store.
pub(crate) const MIN_TOKENS: usize = 8;

/// Rows of a panel group (the AVX-512 micro-kernel's tile height; the AVX2 one does two
/// halves). A chunk's last group is padded with zero rows whose results are not stored.
const GROUP: usize = 4;

/// Panel registers per (row, super-block): `q[0..8]`, `s[0..8]`, `corr_w`.
const VPB: usize = 17;

/// Whether the multi-token path takes a call of `n_tokens` tokens of format `d` on `isa`.
pub(crate) fn takes(isa: Isa, d: DType, n_tokens: usize) -> bool {
    matches!(isa, Isa::Avx2 | Isa::Avx512 | Isa::Amx) && tag(d).is_some() && n_tokens >= MIN_TOKENS
}

/// Panel bytes one weight row of `cols` columns takes (for chunk sizing).
pub(crate) fn panel_row_bytes(cols: usize) -> usize {
    cols / QK_K * (VPB * 32 + 8)
}

/// Rows a chunk may hold so its panel stays L2-resident (≈ 256 KiB), a multiple of [`GROUP`].
pub(crate) fn chunk_rows(cols: usize) -> usize {
    ((256 * 1024) / panel_row_bytes(cols).max(1)).max(1).div_ceil(GROUP) * GROUP
}

thread_local! {
    /// This thread's panel: registers, per (row, super-block) `[d, dmin]`, and (AVX-512) the
    /// current token group's activations widened to i16.
    static PANEL: RefCell<(Vec<__m256i>, Vec<[f32; 2]>, Vec<__m256i>)> = const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Computes output rows `r0..r1` for all `n_tokens` tokens, in spans of at most
/// [`chunk_rows`] rows (one panel each, so a single-threaded call over a whole matrix still
/// works in L2).
///
/// # Safety
/// `isa` is one [`takes`] accepts and is available; `c`'s matrix is of a format [`takes`]
/// accepts with Q8_K activations; rows `r0..r1` are in bounds and no other thread writes them.
pub(crate) unsafe fn run_rows(isa: Isa, c: &TileCtx, r0: usize, r1: usize, n_tokens: usize) {
    let span = chunk_rows(c.w.cols);
    let mut s0 = r0;
    while s0 < r1 {
        let s1 = (s0 + span).min(r1);
        run_span(isa, c, s0, s1, n_tokens);
        s0 = s1;
    }
}

/// [`run_rows`] on one panel's rows.
unsafe fn run_span(isa: Isa, c: &TileCtx, r0: usize, r1: usize, n_tokens: usize) {
    let Acts::Q8K(a) = c.acts else { unreachable!("activations prepared for the wrong dtype") };
    let k = tag(c.w.dtype).expect("format checked by takes()");
    let nb = a.blocks_per_row;
    let rows = r1 - r0;
    let padded = rows.div_ceil(GROUP) * GROUP;
    PANEL.with(|cell| {
        let (regs, meta, xw) = &mut *cell.borrow_mut();
        // Grown, never cleared: every register the kernels read is written below (the padding
        // rows zeroed), so reuse costs no memset.
        grow(regs, padded * nb * VPB, _mm256_setzero_si256());
        grow(meta, padded * nb, [0.0; 2]);
        regs[rows * nb * VPB..padded * nb * VPB].fill(_mm256_setzero_si256());
        meta[rows * nb..padded * nb].fill([0.0; 2]);
        let w = c.w.data.as_ptr().add(r0 * c.w.row_bytes());
        let wide = matches!(isa, Isa::Avx512 | Isa::Amx);
        match (k, wide) {
            (Q5K, false) => fill::<Q5K>(w, rows * nb, regs, meta),
            (Q3K, false) => fill::<Q3K>(w, rows * nb, regs, meta),
            (Q2K, false) => fill::<Q2K>(w, rows * nb, regs, meta),
            (_, false) => fill::<IQ4XS>(w, rows * nb, regs, meta),
            (Q5K, true) => fill_wide::<Q5K>(w, rows * nb, regs, meta),
            (Q3K, true) => fill_wide::<Q3K>(w, rows * nb, regs, meta),
            (Q2K, true) => fill_wide::<Q2K>(w, rows * nb, regs, meta),
            (_, true) => fill_wide::<IQ4XS>(w, rows * nb, regs, meta),
        }
        let mut t0 = 0;
        while t0 < n_tokens {
            let nt = (n_tokens - t0).min(4);
            if wide {
                grow(xw, nt * nb * 16, _mm256_setzero_si256());
                widen_acts(a, t0, nt, xw);
            }
            for g in (0..padded).step_by(GROUP) {
                let p = Panel { regs: regs.as_ptr().add(g * nb * VPB), meta: meta.as_ptr().add(g * nb), nb };
                let out = c.out.add(t0 * c.ldo + r0 + g);
                let live = (rows - g).min(GROUP);
                if wide {
                    group_avx512(k, nt, &p, xw.as_ptr(), a, t0, out, c.ldo, live);
                } else {
                    group_avx2(k, nt, &p, a, t0, out, c.ldo, live);
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

/// Decodes `blocks` consecutive super-blocks of format `K` at `w` into the panel.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn fill<const K: u8>(w: *const u8, blocks: usize, regs: &mut [__m256i], meta: &mut [[f32; 2]]) {
    for j in 0..blocks {
        let KBlock { q, s, corr_w, d, dmin } = decode_block::<K>(w.add(j * block_bytes(K)));
        let r = &mut regs[j * VPB..(j + 1) * VPB];
        r[..8].copy_from_slice(&q);
        r[8..16].copy_from_slice(&s);
        r[16] = corr_w;
        meta[j] = [d, dmin];
    }
}

/// The i16 order of a 32-element group on the AVX-512 path: 32-bit lane `m < 8` holds elements
/// `4m, 4m+1`, lane `8 + m` elements `4m+2, 4m+3`, so adding a register's two 256-bit halves
/// gives the decode tile's 8 lanes (lane l: elements 4l..4l+4).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn lane_order() -> __m512i {
    let mut idx = [0i16; 32];
    for k in 0..8 {
        idx[2 * k] = 4 * k as i16;
        idx[2 * k + 1] = 4 * k as i16 + 1;
        idx[16 + 2 * k] = 4 * k as i16 + 2;
        idx[16 + 2 * k + 1] = 4 * k as i16 + 3;
    }
    _mm512_loadu_si512(idx.as_ptr() as *const _)
}

/// [`fill`] for the AVX-512 kernel: each group's values times their scales as i16
/// (|q·s| ≤ 127·32 for IQ4_XS, 31·63 for Q5_K), in [`lane_order`], at registers `2g, 2g+1`
/// of the (row, super-block); `corr_w` at 16. The products equal the decode tile's
/// `vpmaddubsw` + `vpmaddwd` terms exactly (no pair there can saturate: |q·x| pairs ≤ 2·127·127).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn fill_wide<const K: u8>(w: *const u8, blocks: usize, regs: &mut [__m256i], meta: &mut [[f32; 2]]) {
    let order = lane_order();
    let mut dup = [0i16; 32];
    for (e, v) in dup.iter_mut().enumerate() {
        *v = (e / 2) as i16;
    }
    let dup = _mm512_loadu_si512(dup.as_ptr() as *const _);
    for j in 0..blocks {
        let KBlock { q, s, corr_w, d, dmin } = decode_block::<K>(w.add(j * block_bytes(K)));
        let r = regs[j * VPB..(j + 1) * VPB].as_mut_ptr();
        for g in 0..8 {
            // `s[g]` holds one scale per byte pair; element e takes pair e / 2's.
            let se = _mm512_permutexvar_epi16(dup, _mm512_castsi256_si512(s[g]));
            let v = _mm512_mullo_epi16(_mm512_cvtepi8_epi16(q[g]), se);
            _mm512_storeu_si512(r.add(2 * g) as *mut _, _mm512_permutexvar_epi16(order, v));
        }
        *r.add(16) = corr_w;
        meta[j] = [d, dmin];
    }
}

/// Tokens `t0..t0 + nt`'s Q8_K values as i16 in [`lane_order`]: token `t`, super-block `i`,
/// group `g` at registers `2·((t·nb + i)·8 + g)` and the next.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn widen_acts(a: &ActQ8K, t0: usize, nt: usize, xw: &mut [__m256i]) {
    let order = lane_order();
    let nb = a.blocks_per_row;
    let dst = xw.as_mut_ptr();
    for t in 0..nt {
        let src = a.qs.as_ptr().add((t0 + t) * nb * QK_K);
        for j in 0..nb * 8 {
            let x = _mm256_loadu_si256(src.add(32 * j) as *const __m256i);
            let v = _mm512_permutexvar_epi16(order, _mm512_cvtepi8_epi16(x));
            _mm512_storeu_si512(dst.add(2 * (t * nb * 8 + j)) as *mut _, v);
        }
    }
}

/// A group of [`GROUP`] decoded rows: row `r`, super-block `i` starts at register
/// `(r·nb + i)·VPB`, its scales at `meta[r·nb + i]`.
struct Panel {
    regs: *const __m256i,
    meta: *const [f32; 2],
    nb: usize,
}

/// Expands a runtime (format tag, token count 1..=4) into `f::<K, NT>(args)`.
macro_rules! kt_dispatch {
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
            (Q2K, _) => $f::<Q2K, 4>($($arg),*),
            (_, 1) => $f::<IQ4XS, 1>($($arg),*),
            (_, 2) => $f::<IQ4XS, 2>($($arg),*),
            (_, 3) => $f::<IQ4XS, 3>($($arg),*),
            (_, _) => $f::<IQ4XS, 4>($($arg),*),
        }
    };
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_avx2(k: u8, nt: usize, p: &Panel, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize, live: usize) {
    for h in 0..GROUP / 2 {
        if 2 * h < live {
            let half = Panel { regs: p.regs.add(2 * h * p.nb * VPB), meta: p.meta.add(2 * h * p.nb), nb: p.nb };
            kt_dispatch!(k, nt, micro_avx2(&half, a, t0, out.add(2 * h), ldo, live - 2 * h));
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn group_avx512(k: u8, nt: usize, p: &Panel, xw: *const __m256i, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize, live: usize) {
    kt_dispatch!(k, nt, micro_avx512(p, xw, a, t0, out, ldo, live))
}

/// Writes `hsum(acc) − macc` of the first `live` rows (of `R`) × `NT` tokens (`macc[r]` lane
/// `t`), as the decode tile ends a row.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn store<const R: usize, const NT: usize>(acc: &[[__m256; NT]; R], macc: &[__m128; R], out: *mut f32, ldo: usize, live: usize) {
    for r in 0..R.min(live) {
        let mut m = [0f32; 4];
        _mm_storeu_ps(m.as_mut_ptr(), macc[r]);
        for t in 0..NT {
            *out.add(t * ldo + r) = hsum(acc[r][t]) - m[t];
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

/// The activation scales and bsums of tokens `t0..t0 + NT`, super-block `i`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn token_terms<const K: u8, const NT: usize>(a: &ActQ8K, nb: usize, i: usize, t0: usize) -> ([f32; 4], [__m256i; 4]) {
    let mut dxs = [0f32; 4];
    let mut bsv = [_mm256_setzero_si256(); 4];
    for t in 0..NT {
        let ab = (t0 + t) * nb + i;
        dxs[t] = *a.d.get_unchecked(ab);
        if K != IQ4XS {
            bsv[t] = _mm256_loadu_si256(a.bsums.as_ptr().add(ab * 16) as *const __m256i);
        }
    }
    (dxs, bsv)
}

/// `avx2_k::finish_block` for `R` rows × `NT` tokens of super-block `i`, the tokens side by
/// side: lane by lane the same integer and float operations (the block-sum terms of 4 tokens
/// come from one `vphaddd` tree instead of 4 horizontal sums; `macc[r]` lane `t` is token
/// `t`'s `macc`, updated as `macc + (dmin·dx)·corr`), so the bits are the decode tile's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn epilogue<const K: u8, const R: usize, const NT: usize>(
    isum: &mut [[__m256i; NT]; R],
    p: &Panel,
    i: usize,
    a: &ActQ8K,
    t0: usize,
    acc: &mut [[__m256; NT]; R],
    macc: &mut [__m128; R],
) {
    let nb = p.nb;
    let (dxs, bsv) = token_terms::<K, NT>(a, nb, i, t0);
    let dx4 = _mm_loadu_ps(dxs.as_ptr());
    for r in 0..R {
        let [d, dmin] = *p.meta.add(r * nb + i);
        if K != IQ4XS {
            let corr4 = corr4::<NT>(&bsv, *p.regs.add((r * nb + i) * VPB + 16));
            if K == Q3K {
                let c4 = _mm_slli_epi32::<2>(corr4);
                for t in 0..NT {
                    let ct = match t {
                        0 => c4,
                        1 => _mm_srli_si128::<4>(c4),
                        2 => _mm_srli_si128::<8>(c4),
                        _ => _mm_srli_si128::<12>(c4),
                    };
                    // Lane 0 only: Σ_j sc_j·Σ(u − 4)·x = Σ_j sc_j·Σ u·x − 4·Σ_j sc_j·bsum_j.
                    let lane0 = _mm256_blend_epi32::<1>(_mm256_setzero_si256(), _mm256_castsi128_si256(ct));
                    isum[r][t] = _mm256_sub_epi32(isum[r][t], lane0);
                }
            } else {
                macc[r] = _mm_add_ps(macc[r], _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(dmin), dx4), _mm_cvtepi32_ps(corr4)));
            }
        }
        for t in 0..NT {
            acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r][t]), _mm256_set1_ps(d * dxs[t]), acc[r][t]);
        }
    }
}

/// 2 panel rows × `NT` tokens, 256-bit: per 32-byte group, `vpmaddubsw` then `vpmaddwd` with
/// the group's scales, as the decode tile.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn micro_avx2<const K: u8, const NT: usize>(p: &Panel, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize, live: usize) {
    const R: usize = 2;
    let nb = p.nb;
    let mut acc = [[_mm256_setzero_ps(); NT]; R];
    let mut macc = [_mm_setzero_ps(); R];
    for i in 0..nb {
        let mut isum = [[_mm256_setzero_si256(); NT]; R];
        for g in 0..8 {
            let mut xs = [_mm256_setzero_si256(); NT];
            for t in 0..NT {
                xs[t] = _mm256_loadu_si256(a.qs.as_ptr().add(((t0 + t) * nb + i) * QK_K + 32 * g) as *const __m256i);
            }
            for r in 0..R {
                let blk = p.regs.add((r * nb + i) * VPB);
                let (q, s) = (*blk.add(g), *blk.add(8 + g));
                let qa = if K == IQ4XS { _mm256_sign_epi8(q, q) } else { q };
                for t in 0..NT {
                    let xv = if K == IQ4XS { _mm256_sign_epi8(xs[t], q) } else { xs[t] };
                    isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, xv), s));
                }
            }
        }
        epilogue::<K, R, NT>(&mut isum, p, i, a, t0, &mut acc, &mut macc);
    }
    store(&acc, &macc, out, ldo, live);
}

/// [`epilogue`] on the AVX-512 path, two tokens per 512-bit register: `acc[r][j]` holds
/// tokens 2j (low half) and 2j+1 (high half). Lane by lane the same operations: fold the two
/// halves of each token's integers, Q3_K's lane-0 term, `cvt`, `fma` with `d·dx`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn epilogue_wide<const K: u8, const NT: usize>(
    isum: &[[__m512i; NT]; GROUP],
    p: &Panel,
    i: usize,
    a: &ActQ8K,
    t0: usize,
    acc: &mut [[__m512; 2]; GROUP],
    macc: &mut [__m128; GROUP],
) {
    let nb = p.nb;
    let (dxs, bsv) = token_terms::<K, NT>(a, nb, i, t0);
    let dx4 = _mm_loadu_ps(dxs.as_ptr());
    let pair = |j: i32| {
        _mm512_set_epi32(
            2 * j + 1,
            2 * j + 1,
            2 * j + 1,
            2 * j + 1,
            2 * j + 1,
            2 * j + 1,
            2 * j + 1,
            2 * j + 1,
            2 * j,
            2 * j,
            2 * j,
            2 * j,
            2 * j,
            2 * j,
            2 * j,
            2 * j,
        )
    };
    let dx2 = [_mm512_permutexvar_ps(pair(0), _mm512_castps128_ps512(dx4)), _mm512_permutexvar_ps(pair(1), _mm512_castps128_ps512(dx4))];
    let zero = _mm512_setzero_si512();
    for r in 0..GROUP {
        let [d, dmin] = *p.meta.add(r * nb + i);
        let mut adj = [zero; 2];
        if K != IQ4XS {
            let corr4 = corr4::<NT>(&bsv, *p.regs.add((r * nb + i) * VPB + 16));
            if K == Q3K {
                // 4·corr of token 2j at lane 0, of token 2j+1 at lane 8 (as the tile's lane 0).
                let c4 = _mm512_castsi128_si512(_mm_slli_epi32::<2>(corr4));
                adj = [_mm512_maskz_permutexvar_epi32(0x0101, pair(0), c4), _mm512_maskz_permutexvar_epi32(0x0101, pair(1), c4)];
            } else {
                macc[r] = _mm_add_ps(macc[r], _mm_mul_ps(_mm_mul_ps(_mm_set1_ps(dmin), dx4), _mm_cvtepi32_ps(corr4)));
            }
        }
        let dv = _mm512_set1_ps(d);
        for j in 0..NT.div_ceil(2) {
            let v0 = isum[r][2 * j];
            let v1 = if 2 * j + 1 < NT { isum[r][2 * j + 1] } else { zero };
            let lo = _mm512_shuffle_i64x2::<0b01_00_01_00>(v0, v1);
            let hi = _mm512_shuffle_i64x2::<0b11_10_11_10>(v0, v1);
            let mut s = _mm512_add_epi32(lo, hi);
            if K == Q3K {
                s = _mm512_sub_epi32(s, adj[j]);
            }
            acc[r][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dv, dx2[j]), acc[r][j]);
        }
    }
}

/// 4 panel rows × `NT` tokens, 512-bit: per 32-element group one VNNI `vpdpwssd` of the
/// panel's i16 products-with-scales against the widened activations per (row, token); at the
/// end of a super-block the two 256-bit halves added give the decode tile's 8 lanes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn micro_avx512<const K: u8, const NT: usize>(
    p: &Panel,
    xw: *const __m256i,
    a: &ActQ8K,
    t0: usize,
    out: *mut f32,
    ldo: usize,
    live: usize,
) {
    const R: usize = GROUP;
    let nb = p.nb;
    let mut acc = [[_mm512_setzero_ps(); 2]; R];
    let mut macc = [_mm_setzero_ps(); R];
    let zero = _mm512_setzero_si512();
    for i in 0..nb {
        let mut isum = [[zero; NT]; R];
        for g in 0..8 {
            let mut xs = [zero; NT];
            for t in 0..NT {
                xs[t] = _mm512_loadu_si512(xw.add(2 * ((t * nb + i) * 8 + g)) as *const _);
            }
            for r in 0..R {
                let wv = _mm512_loadu_si512(p.regs.add((r * nb + i) * VPB + 2 * g) as *const _);
                for t in 0..NT {
                    isum[r][t] = _mm512_dpwssd_epi32(isum[r][t], wv, xs[t]);
                }
            }
        }
        epilogue_wide::<K, NT>(&isum, p, i, a, t0, &mut acc, &mut macc);
    }
    let mut acc8 = [[_mm256_setzero_ps(); NT]; R];
    for r in 0..R {
        for t in 0..NT {
            let v = _mm512_castps_pd(acc[r][t / 2]);
            acc8[r][t] = _mm256_castpd_ps(if t % 2 == 0 { _mm512_castpd512_pd256(v) } else { _mm512_extractf64x4_pd::<1>(v) });
        }
    }
    store(&acc8, &macc, out, ldo, live);
}
