//! Multi-token (prefill) path of the formats of `avx2_k` — Q5_K, Q3_K, Q2_K, IQ4_XS — on the
//! AVX2 path (AVX-512 CPUs run `vnni_k` instead).
//!
//! The decode tiles (`avx2_k::tile`, one row × ≤ 4 tokens) decode every weight super-block
//! again for each group of 4 tokens. Here a chunk's rows are decoded **once per call** into a
//! per-thread panel ([`KBlock`]'s 8 value and 8 scale registers per (row, super-block)), and a
//! 2-row × 4-token micro-kernel of `vpmaddubsw` + `vpmaddwd`, as the decode tile, sweeps all the
//! call's tokens over it.
//!
//! Bitwise the scalar reference, as the decode tiles: each (row, token, super-block) gets the
//! same exact integers (the 8 lanes of 4 tokens summed by one `vphaddd` tree), then
//! `avx2_k::block_term`'s float operations, so a token's output does not depend on whether it
//! came in a prefill or a decode call.

use super::avx2_k::{block_bytes, block_term, decode_block, tag, KBlock, IQ4XS, Q2K, Q3K, Q5K};
use super::{Acts, Isa, TileCtx};
use crate::blocks::QK_K;
use crate::dtype::DType;
use crate::quantize::ActQ8K;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Fewest tokens in a call for this path; smaller calls (decode) keep the decode tiles, which
/// need no panel store.
pub(crate) const MIN_TOKENS: usize = 8;

/// Rows of a panel group (two 2-row micro-kernel calls). A chunk's last group is padded with
/// zero rows whose results are not stored.
const GROUP: usize = 4;

/// Panel registers per (row, super-block): `q[0..8]`, `s[0..8]`, `corr_w`.
const VPB: usize = 17;

/// Whether the multi-token path takes a call of `n_tokens` tokens of format `d` on `isa`. On
/// the AVX-512 and AMX paths it takes the calls the token-lane kernel (`vnni_k`) leaves below
/// its threshold (the caller asks `vnni_k` first); the panels give the decode tiles' bits, as
/// that kernel does, so which of them runs moves only time.
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
    /// This thread's panel: registers and per (row, super-block) `[d, dmin]`.
    static PANEL: RefCell<(Vec<__m256i>, Vec<[f32; 2]>)> = const { RefCell::new((Vec::new(), Vec::new())) };
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
    let padded = rows.div_ceil(GROUP) * GROUP;
    PANEL.with(|cell| {
        let (regs, meta) = &mut *cell.borrow_mut();
        // Grown, never cleared: every register the kernels read is written below (the padding
        // rows zeroed), so reuse costs no memset.
        grow(regs, padded * nb * VPB, _mm256_setzero_si256());
        grow(meta, padded * nb, [0.0; 2]);
        regs[rows * nb * VPB..padded * nb * VPB].fill(_mm256_setzero_si256());
        meta[rows * nb..padded * nb].fill([0.0; 2]);
        let w = c.w.data.as_ptr().add(r0 * c.w.row_bytes());
        match k {
            Q5K => fill::<Q5K>(w, rows * nb, regs, meta),
            Q3K => fill::<Q3K>(w, rows * nb, regs, meta),
            Q2K => fill::<Q2K>(w, rows * nb, regs, meta),
            _ => fill::<IQ4XS>(w, rows * nb, regs, meta),
        }
        let mut t0 = 0;
        while t0 < n_tokens {
            let nt = (n_tokens - t0).min(4);
            for g in (0..padded).step_by(GROUP) {
                let p = Panel { regs: regs.as_ptr().add(g * nb * VPB), meta: meta.as_ptr().add(g * nb), nb };
                let out = c.out.add(t0 * c.ldo + r0 + g);
                let live = (rows - g).min(GROUP);
                group_avx2(k, nt, &p, a, t0, out, c.ldo, live);
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

/// Writes `acc[r][t]` of the first `live` rows (of `R`) × `NT` tokens.
#[inline]
unsafe fn store<const R: usize, const NT: usize>(acc: &[[f32; NT]; R], out: *mut f32, ldo: usize, live: usize) {
    for r in 0..R.min(live) {
        for t in 0..NT {
            *out.add(t * ldo + r) = acc[r][t];
        }
    }
}

/// Lane t: the sum of `v[t]`'s 8 lanes, exactly (t < NT; the rest 0).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum4<const NT: usize>(v: &[__m256i; NT]) -> __m128i {
    let mut w = [_mm256_setzero_si256(); 4];
    w[..NT].copy_from_slice(v);
    let h = _mm256_hadd_epi32(_mm256_hadd_epi32(w[0], w[1]), _mm256_hadd_epi32(w[2], w[3]));
    _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h))
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

/// The end of super-block `i` for `R` rows × `NT` tokens: exact per-token integer sums (one
/// `vphaddd` tree for the lanes, one for the block-sum terms), then
/// [`block_term`] added to each (row, token) accumulator, as the decode tile does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn epilogue<const K: u8, const R: usize, const NT: usize>(
    isum: &[[__m256i; NT]; R],
    p: &Panel,
    i: usize,
    a: &ActQ8K,
    t0: usize,
    acc: &mut [[f32; NT]; R],
) {
    let nb = p.nb;
    let (dxs, bsv) = token_terms::<K, NT>(a, nb, i, t0);
    for r in 0..R {
        let [d, dmin] = *p.meta.add(r * nb + i);
        let mut tot = [0i32; 4];
        _mm_storeu_si128(tot.as_mut_ptr() as *mut __m128i, hsum4::<NT>(&isum[r]));
        let mut corr = [0i32; 4];
        if K != IQ4XS {
            _mm_storeu_si128(corr.as_mut_ptr() as *mut __m128i, corr4::<NT>(&bsv, *p.regs.add((r * nb + i) * VPB + 16)));
        }
        for t in 0..NT {
            acc[r][t] += block_term::<K>(tot[t], corr[t], d, dmin, dxs[t]);
        }
    }
}

/// 2 panel rows × `NT` tokens, 256-bit: per 32-byte group, `vpmaddubsw` then `vpmaddwd` with
/// the group's scales, as the decode tile.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn micro_avx2<const K: u8, const NT: usize>(p: &Panel, a: &ActQ8K, t0: usize, out: *mut f32, ldo: usize, live: usize) {
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
                let blk = p.regs.add((r * nb + i) * VPB);
                let (q, s) = (*blk.add(g), *blk.add(8 + g));
                let qa = if K == IQ4XS { _mm256_sign_epi8(q, q) } else { q };
                for t in 0..NT {
                    let xv = if K == IQ4XS { _mm256_sign_epi8(xs[t], q) } else { xs[t] };
                    isum[r][t] = _mm256_add_epi32(isum[r][t], _mm256_madd_epi16(_mm256_maddubs_epi16(qa, xv), s));
                }
            }
        }
        epilogue::<K, R, NT>(&isum, p, i, a, t0, &mut acc);
    }
    store(&acc, out, ldo, live);
}
