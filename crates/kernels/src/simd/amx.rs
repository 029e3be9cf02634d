//! AMX-INT8 kernels for Q8_0 / Q4_0 weights (Sapphire Rapids and later), written with `asm!`
//! because Rust's AMX intrinsics are unstable. Every other format falls back to `avx512`.
//!
//! Formulation (≥ 4 tokens; fewer run [`vnni_group`], see below): `C[t][r] = Σ_k A[t][k] ·
//! B[k][r]` with
//! * `A` = the Q8 activations of up to 16 tokens, one 32-byte block each — loaded straight from
//!   [`ActQ8::qs`] with a row stride of `cols` bytes;
//! * `B` = one block of 16 weight rows in the VNNI layout AMX wants (`B[k/4][4r + k%4]`), made
//!   by [`repack`] once per row chunk into a per-thread buffer (Q4_0 nibbles are unpacked to
//!   signed bytes there, so both formats use `tdpbssd`).
//!
//! `K = 32` per `tdpbssd` (half a tile's depth) on purpose: each product tile is then the
//! *exact* integer dot product of one weight block with one activation block, which is scaled
//! and accumulated in f32 as `acc[t] += f32(C[t]) · (dw·dx[t])` — a multiply, then an add, no
//! FMA (a 16-lane vector over the 16 weight rows): the scalar reference's float sequence, so
//! this path's results are bitwise the reference's and the packed kernels' (`avx2_packed`,
//! `avx512_packed`). For 1–3 tokens [`vnni_group`] computes the same exact block sums with
//! `vpdpbusd` straight from the weights (no repack) and applies the same f32 sequence; with a
//! packed matrix, calls below `dispatch::amx_token_min` tokens run the AVX-512 packed kernels
//! instead (`matmul.rs`) and the tiles read their blocks from the packing ([`repack_packed`]).
//! Either way a token's result does not depend on the tokens per call (the invariant of
//! `simd/mod.rs`). The f32 scaling (≈4 vector µops per block × token) rather than the tile unit
//! bounds the GEMM speed; it is still several times the VNNI kernels' throughput.
//!
//! OS support: Linux must grant the process the AMX tile state (`arch_prctl`), done once in
//! [`available`]; elsewhere this path reports unavailable.

use super::TileCtx;
use crate::dtype::DType;
use crate::quantize::ActQ8;
use crate::repack::GROUP_ROWS;
use std::arch::asm;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Whether the CPU has AMX-TILE + AMX-INT8, the OS enables the tile state in XCR0 and (on
/// Linux) grants this process permission to use it. Cached.
pub(crate) fn available() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(detect)
}

#[allow(unused_unsafe)] // `__cpuid` became safe in newer Rust versions
fn detect() -> bool {
    // SAFETY: cpuid is always available on x86-64.
    let l1 = unsafe { __cpuid(1) };
    if l1.ecx & (1 << 27) == 0 {
        return false; // no OSXSAVE → no xgetbv
    }
    let l7 = unsafe { __cpuid_count(7, 0) };
    let (tile, int8) = (l7.edx & (1 << 24) != 0, l7.edx & (1 << 25) != 0);
    if !(tile && int8) {
        return false;
    }
    let (lo, _hi): (u32, u32);
    // SAFETY: OSXSAVE checked above.
    unsafe { asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") _hi, options(nomem, nostack)) };
    // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA).
    if lo & (0b11 << 17) != 0b11 << 17 {
        return false;
    }
    request_permission()
}

#[cfg(target_os = "linux")]
fn request_permission() -> bool {
    // arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): process-wide, idempotent.
    const SYS_ARCH_PRCTL: i64 = 158;
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: a plain Linux syscall; it only touches the registers declared here.
    unsafe {
        asm!("syscall", inlateout("rax") SYS_ARCH_PRCTL => ret, in("rdi") ARCH_REQ_XCOMP_PERM,
             in("rsi") XFEATURE_XTILEDATA, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_permission() -> bool {
    false
}

/// Weight rows per repacked group (= the N of one product tile).
pub(crate) const GROUP: usize = 16;
/// Tokens per kernel call (= the M of one product tile).
const MAX_NT: usize = 16;

/// One 64-byte, 64-aligned line (tile rows are 64 bytes).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

thread_local! {
    /// Per-thread repack buffer: for each 16-row group, `nb` blocks of 8 B-tile lines followed
    /// by `nb` lines of 16 f32 row scales. Reused across calls (no per-call allocation).
    static REPACK: RefCell<Vec<Line>> = const { RefCell::new(Vec::new()) };
}

/// Computes rows `r0..r1` (`r0` a multiple of [`GROUP`]) for all tokens of a Q8_0/Q4_0 matmul;
/// the tiles take their blocks from `packed` (the matrix's packing) when given, else from the
/// matrix's own bytes. Bitwise the scalar reference's result either way.
///
/// # Safety
/// [`available`] and AVX-512 must hold; the rows must be in bounds; `packed` must be `c.w`'s
/// packing; no other thread may write these output rows concurrently.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn run_rows(c: &TileCtx, a: &ActQ8, packed: Option<&crate::Packed>, r0: usize, r1: usize, n_tokens: usize) {
    let w = c.w;
    let nb = a.blocks_per_row;
    let rb = w.row_bytes();
    let groups = (r1 - r0).div_ceil(GROUP);
    if n_tokens <= VNNI_MAX_NT {
        for g in 0..groups {
            let rows = GROUP.min(r1 - r0 - g * GROUP);
            let wp = w.data.as_ptr().add((r0 + g * GROUP) * rb);
            let out = c.out.add(r0 + g * GROUP);
            let mask = ((1u32 << rows) - 1) as u16;
            match (w.dtype, n_tokens) {
                (DType::Q8_0, 1) => vnni_group::<false, 1>(wp, rb, rows, a, 0, out, c.ldo, mask),
                (DType::Q8_0, 2) => vnni_group::<false, 2>(wp, rb, rows, a, 0, out, c.ldo, mask),
                (DType::Q8_0, _) => vnni_group::<false, 3>(wp, rb, rows, a, 0, out, c.ldo, mask),
                (_, 1) => vnni_group::<true, 1>(wp, rb, rows, a, 0, out, c.ldo, mask),
                (_, 2) => vnni_group::<true, 2>(wp, rb, rows, a, 0, out, c.ldo, mask),
                (_, _) => vnni_group::<true, 3>(wp, rb, rows, a, 0, out, c.ldo, mask),
            }
        }
        return;
    }
    let lines_per_group = nb * 9;
    REPACK.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < groups * lines_per_group {
            buf.resize(groups * lines_per_group, Line([0; 64]));
        }
        let base = buf.as_mut_ptr() as *mut u8;
        for g in 0..groups {
            let rows = GROUP.min(r1 - r0 - g * GROUP);
            let gp = base.add(g * lines_per_group * 64);
            let dw = gp.add(nb * 512) as *mut f32;
            match (packed, w.dtype) {
                (Some(p), DType::Q8_0) => repack_packed::<false>(p, (r0 + g * GROUP) / GROUP_ROWS, rows, nb, gp, dw),
                (Some(p), _) => repack_packed::<true>(p, (r0 + g * GROUP) / GROUP_ROWS, rows, nb, gp, dw),
                (None, d) => {
                    let wp = w.data.as_ptr().add((r0 + g * GROUP) * rb);
                    match d {
                        DType::Q8_0 => repack::<false>(wp, rb, rows, nb, gp, dw),
                        _ => repack::<true>(wp, rb, rows, nb, gp, dw),
                    }
                }
            }
        }
        let mut t0 = 0;
        while t0 < n_tokens {
            let nt = MAX_NT.min(n_tokens - t0);
            configure(nt);
            for g in 0..groups {
                let rows = GROUP.min(r1 - r0 - g * GROUP);
                let gp = base.add(g * lines_per_group * 64);
                let out = c.out.add(t0 * c.ldo + r0 + g * GROUP);
                let (xq, xd) = (a.qs.as_ptr().add(t0 * nb * 32), a.d.as_ptr().add(t0 * nb));
                let mask = ((1u32 << rows) - 1) as u16;
                let args = (gp as *const u8, gp.add(nb * 512) as *const f32, xq, xd, nb, out, c.ldo, mask);
                kernel_dispatch(nt, args);
            }
            // Drop the tile state so the OS need not save it while we do other work.
            asm!("tilerelease", options(nostack, nomem));
            t0 += nt;
        }
    });
}

/// Loads the tile configuration for `nt` tokens: tmm0/1 = A (nt × 32 B), tmm2/3 = B
/// (8 × 64 B), tmm4/5 = C (nt × 16 i32). Two of each so two blocks are in flight per step.
#[target_feature(enable = "avx512f")]
unsafe fn configure(nt: usize) {
    let mut cfg = Line([0; 64]);
    cfg.0[0] = 1; // palette 1
    let mut set = |t: usize, rows: usize, colsb: u16| {
        cfg.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
        cfg.0[48 + t] = rows as u8;
    };
    set(0, nt, 32);
    set(1, nt, 32);
    set(2, 8, 64);
    set(3, 8, 64);
    set(4, nt, 64);
    set(5, nt, 64);
    asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
}

type KArgs = (*const u8, *const f32, *const i8, *const f32, usize, *mut f32, usize, u16);

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn kernel_dispatch(nt: usize, a: KArgs) {
    macro_rules! k {
        ($($n:literal)*) => {
            match nt {
                $($n => kernel::<$n>(a.0, a.1, a.2, a.3, a.4, a.5, a.6, a.7),)*
                _ => unreachable!(),
            }
        };
    }
    k!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
}

/// 16 weight rows (repacked at `bw`, scales at `dw`) × `NT` tokens (activation blocks at `xq`,
/// row stride `nb·32`; scales at `xd`, row stride `nb`); writes `out[t·ldo + r]` for the rows
/// in `mask`. The tile configuration for `NT` must be loaded.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn kernel<const NT: usize>(
    bw: *const u8,
    dw: *const f32,
    xq: *const i8,
    xd: *const f32,
    nb: usize,
    out: *mut f32,
    ldo: usize,
    mask: u16,
) {
    let mut acc = [_mm512_setzero_ps(); NT];
    let mut cbuf = [Line([0; 64]); 2 * MAX_NT];
    let cp = cbuf.as_mut_ptr() as *mut u8;
    let stride_a = nb * 32;
    let mut i = 0;
    while i < nb {
        let two = i + 1 < nb;
        if two {
            asm!(
                "tileloadd tmm0, [{a} + {sa}*1]",
                "tileloadd tmm2, [{b} + {s64}*1]",
                "tileloadd tmm1, [{a} + {sa}*1 + 32]",
                "tileloadd tmm3, [{b} + {s64}*1 + 512]",
                "tilezero tmm4",
                "tilezero tmm5",
                "tdpbssd tmm4, tmm0, tmm2",
                "tdpbssd tmm5, tmm1, tmm3",
                "tilestored [{c} + {s64}*1], tmm4",
                "tilestored [{c} + {s64}*1 + 1024], tmm5",
                a = in(reg) xq.add(i * 32),
                sa = in(reg) stride_a,
                b = in(reg) bw.add(i * 512),
                s64 = in(reg) 64usize,
                c = in(reg) cp,
                options(nostack),
            );
        } else {
            asm!(
                "tileloadd tmm0, [{a} + {sa}*1]",
                "tileloadd tmm2, [{b} + {s64}*1]",
                "tilezero tmm4",
                "tdpbssd tmm4, tmm0, tmm2",
                "tilestored [{c} + {s64}*1], tmm4",
                a = in(reg) xq.add(i * 32),
                sa = in(reg) stride_a,
                b = in(reg) bw.add(i * 512),
                s64 = in(reg) 64usize,
                c = in(reg) cp,
                options(nostack),
            );
        }
        for j in 0..1 + two as usize {
            let d = _mm512_load_ps(dw.add((i + j) * 16));
            let cj = cp.add(j * 1024);
            for t in 0..NT {
                let v = _mm512_cvtepi32_ps(_mm512_load_si512(cj.add(t * 64) as *const __m512i));
                let s = _mm512_mul_ps(d, _mm512_set1_ps(*xd.add(t * nb + i + j)));
                acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(v, s));
            }
        }
        i += 2;
    }
    for t in 0..NT {
        _mm512_mask_storeu_ps(out.add(t * ldo), mask, acc[t]);
    }
}

/// Below this many tokens the AMX path runs [`vnni_group`] instead of tiles: with `M = 1..3`
/// a product tile is mostly idle and the per-call weight repack dominates, while the VNNI
/// kernel reads the weights in place (decode is memory-bound).
const VNNI_MAX_NT: usize = 3;
const _: () = assert!(VNNI_MAX_NT == 3, "run_rows dispatches NT = 1..=3");

/// `permutex2var` index pairs of the three "transpose and add" stages in [`vnni_group`]
/// (see there), for distances 4, 2, 1.
static REDUCE_IDX: [[i32; 16]; 6] = reduce_idx();

const fn reduce_idx() -> [[i32; 16]; 6] {
    let mut t = [[0i32; 16]; 6];
    let mut s = 0;
    while s < 3 {
        let d = 4 >> s;
        let mut lane = 0;
        while lane < 16 {
            let (h, l) = (lane / 8 * 8, lane % 8);
            let g = l / d;
            let src = if g & 1 == 1 { 16 } else { 0 };
            let base = (g >> 1) * 2 * d;
            t[2 * s][lane] = (src + h + base + l % d) as i32;
            t[2 * s + 1][lane] = (src + h + base + l % d + d) as i32;
            lane += 1;
        }
        s += 1;
    }
    t
}

/// VNNI version of the AMX path's arithmetic for few tokens, bitwise identical to [`kernel`]:
/// for 16 rows (`rows` valid, masked by `mask`) × `NT` tokens it computes each exact per-block
/// integer dot product and applies the same `acc += f32(isum) · (dw·dx)` per (row, token).
///
/// `vpdpbusd` with unsigned weights `w + k` (offset removed by the activation bias, as in
/// `avx512.rs`) leaves several partial sums per row; butterfly stages of `permutex2var` + add
/// reduce them to one vector whose lane `r` is row `r`'s exact block sum.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn vnni_group<const Q4: bool, const NT: usize>(
    w: *const u8,
    rb: usize,
    rows: usize,
    a: &ActQ8,
    t0: usize,
    out: *mut f32,
    ldo: usize,
    mask: u16,
) {
    let l8 = a.lanes8();
    let bb = if Q4 { 18 } else { 34 };
    let nb = a.blocks_per_row;
    // Rows past the end read row 0 again (valid memory); their outputs are masked off.
    let mut rp = [w; 16];
    for (m, p) in rp.iter_mut().enumerate().take(rows) {
        *p = w.add(m * rb);
    }
    let ix: [__m512i; 6] = std::array::from_fn(|k| _mm512_loadu_si512(REDUCE_IDX[k].as_ptr() as *const __m512i));
    let mut acc = [_mm512_setzero_ps(); NT];
    for i in 0..nb {
        let off = i * bb;
        // Q8_0: z[j] = [row j | row j+8] (unsigned w ^ 0x80), 8 partial sums per row.
        // Q4_0: z[j] = rows [j, j+4, j+8, j+12] (16 packed bytes each; low nibbles are elements
        // 0..16, high nibbles 16..32), 4 partial sums per row — already the layout after the
        // first reduction stage, so Q4_0 skips it and needs half the `vpdpbusd`s.
        let mut z = [_mm512_setzero_si512(); 8];
        if Q4 {
            for j in 0..4 {
                let ld = |m: usize| _mm_loadu_si128(rp[m].add(off + 2) as *const __m128i);
                let v = _mm512_inserti32x4(_mm512_castsi128_si512(ld(j)), ld(j + 4), 1);
                let v = _mm512_inserti32x4(_mm512_inserti32x4(v, ld(j + 8), 2), ld(j + 12), 3);
                z[2 * j] = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
                z[2 * j + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
            }
        } else {
            for j in 0..8 {
                let v = _mm512_inserti64x4(
                    _mm512_castsi256_si512(_mm256_loadu_si256(rp[j].add(off + 2) as *const __m256i)),
                    _mm256_loadu_si256(rp[j + 8].add(off + 2) as *const __m256i),
                    1,
                );
                z[j] = _mm512_xor_si512(v, _mm512_set1_epi8(-128));
            }
        }
        let mut h = [0u16; 16];
        for m in 0..16 {
            h[m] = (rp[m].add(off) as *const u16).read_unaligned();
        }
        let dwv = _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr() as *const __m256i));
        for t in 0..NT {
            let ab = (t0 + t) * nb + i;
            let xp = a.qs.as_ptr().add(ab * 32);
            let bp = l8.bias.as_ptr().add(ab * 8);
            let mut p = [_mm512_setzero_si512(); 8];
            let first_stage = if Q4 {
                let xlo = _mm512_broadcast_i32x4(_mm_loadu_si128(xp as *const __m128i));
                let xhi = _mm512_broadcast_i32x4(_mm_loadu_si128(xp.add(16) as *const __m128i));
                let bias = _mm512_broadcast_i32x4(_mm_loadu_si128(bp as *const __m128i));
                for j in 0..4 {
                    p[j] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(bias, z[2 * j], xlo), z[2 * j + 1], xhi);
                }
                1
            } else {
                let xv = _mm512_broadcast_i64x4(_mm256_loadu_si256(xp as *const __m256i));
                let bias = _mm512_broadcast_i64x4(_mm256_loadu_si256(bp as *const __m256i));
                for j in 0..8 {
                    p[j] = _mm512_dpbusd_epi32(bias, z[j], xv);
                }
                0
            };
            // Stage d (4, 2, 1): pair (p[j], p[j+d]) → one vector holding both rows' partial
            // sums, halved in count; after the last stage lane r is row r's exact block sum.
            for s in first_stage..3 {
                let d = 4 >> s;
                for j in 0..d {
                    p[j] = _mm512_add_epi32(
                        _mm512_permutex2var_epi32(p[j], ix[2 * s], p[j + d]),
                        _mm512_permutex2var_epi32(p[j], ix[2 * s + 1], p[j + d]),
                    );
                }
            }
            let sc = _mm512_mul_ps(dwv, _mm512_set1_ps(*a.d.get_unchecked(ab)));
            acc[t] = _mm512_add_ps(acc[t], _mm512_mul_ps(_mm512_cvtepi32_ps(p[0]), sc));
        }
    }
    for t in 0..NT {
        _mm512_mask_storeu_ps(out.add(t * ldo), mask, acc[t]);
    }
}

/// Repacks `rows` (≤ 16; missing rows are zero) weight rows of Q8_0 or Q4_0 (`Q4`) blocks into
/// AMX B tiles: for block `i`, 8 lines at `dst + 512·i` with line `k` holding dword `k` (bytes
/// `4k..4k+4`, signed) of rows 0..16; the rows' f32 scales go to `dw[16·i..16·i+16]`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn repack<const Q4: bool>(w: *const u8, rb: usize, rows: usize, nb: usize, dst: *mut u8, dw: *mut f32) {
    let bb = if Q4 { 18 } else { 34 };
    // Index vectors of the three butterfly stages of an 8×8 dword transpose done in both
    // 256-bit halves at once (see `transpose_idx`).
    let idx = [transpose_idx(4), transpose_idx(2), transpose_idx(1)];
    for i in 0..nb {
        let block = |m: usize| -> __m256i {
            if m >= rows {
                return _mm256_setzero_si256();
            }
            let b = w.add(m * rb + i * bb + 2);
            if Q4 {
                let v = _mm_loadu_si128(b as *const __m128i);
                let m4 = _mm_set1_epi8(0x0F);
                let lo = _mm_and_si128(v, m4);
                let hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
                _mm256_sub_epi8(_mm256_set_m128i(hi, lo), _mm256_set1_epi8(8))
            } else {
                _mm256_loadu_si256(b as *const __m256i)
            }
        };
        // z[j] = [row j | row j+8] as 2 × 8 dwords.
        let mut z = [_mm512_setzero_si512(); 8];
        for j in 0..8 {
            z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(block(j)), block(j + 8), 1);
        }
        for (s, d) in [4usize, 2, 1].into_iter().enumerate() {
            for j in 0..8 {
                if j & d == 0 {
                    let (a, b) = (z[j], z[j + d]);
                    z[j] = _mm512_permutex2var_epi32(a, idx[s].0, b);
                    z[j + d] = _mm512_permutex2var_epi32(a, idx[s].1, b);
                }
            }
        }
        // Now z[k] lane r = dword k of row r: B-tile line k.
        for k in 0..8 {
            _mm512_store_si512(dst.add(i * 512 + k * 64) as *mut __m512i, z[k]);
        }
        let mut h = [0u16; 16];
        for (m, h) in h.iter_mut().enumerate().take(rows) {
            *h = (w.add(m * rb + i * bb) as *const u16).read_unaligned();
        }
        _mm512_store_ps(dw.add(16 * i), _mm512_cvtph_ps(_mm256_loadu_si256(h.as_ptr() as *const __m256i)));
    }
}

/// [`repack`] from the matrix's packing (`repack.rs`): rows `8·g0 ..` (≤ 16, two 8-row groups;
/// a missing second group is zero). A group-block holds the 8 rows' f16 scales, then 32-byte
/// registers whose dword `r` is row `r`'s: register `k` is B-tile line `k`'s half for Q8_0; for
/// Q4_0 line `k` is register `k`'s low nibbles (`k < 4`) or register `k − 4`'s high ones, less 8.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn repack_packed<const Q4: bool>(p: &crate::Packed, g0: usize, rows: usize, nb: usize, dst: *mut u8, dw: *mut f32) {
    let gbb = crate::repack::group_block_bytes(p.dtype());
    let halves = rows.div_ceil(GROUP_ROWS);
    let gp: [*const u8; 2] = std::array::from_fn(|h| if h < halves { p.group(g0 + h).as_ptr() } else { std::ptr::null() });
    for i in 0..nb {
        let reg = |h: usize, k: usize| -> __m256i {
            if h >= halves {
                return _mm256_setzero_si256();
            }
            _mm256_loadu_si256(gp[h].add(i * gbb + 16 + 32 * k) as *const __m256i)
        };
        for k in 0..8 {
            let line = |h: usize| -> __m256i {
                if Q4 {
                    if h >= halves {
                        return _mm256_setzero_si256();
                    }
                    let v = reg(h, k % 4);
                    let v = if k < 4 { v } else { _mm256_srli_epi16(v, 4) };
                    _mm256_sub_epi8(_mm256_and_si256(v, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8))
                } else {
                    reg(h, k)
                }
            };
            let z = _mm512_inserti64x4(_mm512_castsi256_si512(line(0)), line(1), 1);
            _mm512_store_si512(dst.add(i * 512 + k * 64) as *mut __m512i, z);
        }
        let h = |g: usize| if g < halves { _mm_loadu_si128(gp[g].add(i * gbb) as *const __m128i) } else { _mm_setzero_si128() };
        let scales = _mm256_set_m128i(h(1), h(0));
        _mm512_store_ps(dw.add(16 * i), _mm512_cvtph_ps(scales));
    }
}

/// `permutex2var` indices for the butterfly stage of distance `d` of an 8×8 transpose held as
/// `z[j][l]` (vector j, dword l of each 256-bit half): it swaps `z[j][l]` (l & d ≠ 0) with
/// `z[j+d][l-d]`. Returns (index for the new `z[j]`, index for the new `z[j+d]`), where
/// 0..16 selects from `z[j]` and 16..32 from `z[j+d]`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn transpose_idx(d: usize) -> (__m512i, __m512i) {
    let mut lo = [0i32; 16];
    let mut hi = [0i32; 16];
    for lane in 0..16 {
        let l = lane % 8;
        lo[lane] = if l & d == 0 { lane } else { 16 + lane - d } as i32;
        hi[lane] = if l & d != 0 { 16 + lane } else { lane + d } as i32;
    }
    (_mm512_loadu_si512(lo.as_ptr() as *const __m512i), _mm512_loadu_si512(hi.as_ptr() as *const __m512i))
}
