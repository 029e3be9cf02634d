//! Instruction-throughput probe behind the packed kernels' design: how many
//! cycles a 256-bit `vpmaddubsw` / `vpmaddwd` / `vpsignb` / shift / add take alone and in
//! pairs (which ones share a pipe), and the Q4_0 / Q8_0 lane-per-row inner loops alone on
//! L1-resident data, per 8 rows × 32 columns × token (Q4_0 also with the activations stored
//! pre-broadcast, 32 bytes per 4, which saves the broadcasts). Every token's result is returned,
//! so the compiler cannot drop a token's work. Standalone: it does not call the crate.
//!
//! On AVX-512 machines a second section gives absolute rates (G instructions per second of
//! wall clock, one thread, no clock assumed): 512-bit FMAs alone (the float kernels' peak),
//! the F16 float tiles' loop bodies on L1-resident data (4 rows × 4 tokens, and 4 × 6 over
//! interleaved activations, in FMAs per second) and `vpdpbusd` alone.
//!
//! Run: `cargo bench -p engram-kernels --bench isa_probe` (AVX2/FMA/F16C machines). Times are
//! best-of; the clock is calibrated in the same run by assuming a 256-bit `vpmaddubsw` takes
//! 2 cycles of throughput (Zen 1's documented figure: two 128-bit µops on its one vector
//! multiply pipe; the clock of this VM moves with load, 2.5–3.0 GHz), or `ENGRAM_GHZ` fixes it.

#![allow(clippy::missing_safety_doc)]
#[cfg(target_arch = "x86_64")]
mod probe {
    use std::arch::x86_64::*;
    use std::time::Instant;

    /// Clock (GHz): `ENGRAM_GHZ`, else from `seconds_per_maddubs` taken as 2 cycles.
    fn ghz(seconds_per_maddubs: f64) -> f64 {
        std::env::var("ENGRAM_GHZ").ok().and_then(|v| v.parse().ok()).unwrap_or(2.0 / (seconds_per_maddubs * 1e9))
    }

    macro_rules! pairbench {
        ($name:ident, $a:expr, $b:expr) => {
            #[target_feature(enable = "avx2")]
            unsafe fn $name(n: usize) -> __m256i {
                let c = _mm256_set1_epi8(3);
                let mut a = [_mm256_set1_epi8(1); 8];
                let mut b = [_mm256_set1_epi8(1); 8];
                for _ in 0..n {
                    for k in 0..8 {
                        a[k] = $a(a[k], c);
                        b[k] = $b(b[k], c);
                    }
                }
                let mut s = a[0];
                for k in 1..8 {
                    s = _mm256_xor_si256(s, a[k]);
                    s = _mm256_xor_si256(s, b[k]);
                }
                s
            }
        };
    }
    unsafe fn mub(a: __m256i, c: __m256i) -> __m256i {
        _mm256_maddubs_epi16(a, c)
    }
    unsafe fn srai(a: __m256i, _c: __m256i) -> __m256i {
        _mm256_srai_epi32(a, 1)
    }
    unsafe fn add(a: __m256i, c: __m256i) -> __m256i {
        _mm256_add_epi32(a, c)
    }
    unsafe fn sgn(a: __m256i, c: __m256i) -> __m256i {
        _mm256_sign_epi8(a, c)
    }
    unsafe fn shuf(a: __m256i, _c: __m256i) -> __m256i {
        _mm256_shuffle_epi32(a, 0x55)
    }
    pairbench!(p_mub_mub, mub, mub);
    pairbench!(p_mub_srai, mub, srai);
    pairbench!(p_srai_srai, srai, srai);
    pairbench!(p_mub_add, mub, add);
    pairbench!(p_add_add, add, add);
    pairbench!(p_sgn_sgn, sgn, sgn);
    pairbench!(p_sgn_add, sgn, add);
    pairbench!(p_shuf_shuf, shuf, shuf);
    pairbench!(p_mub_shuf, mub, shuf);
    // The q8 NT-token kernel over nb group-blocks resident in L1 (nb=8: 2.2 KB weights).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8<const NT: usize, const V: usize>(w: *const u8, x: *const i8, nb: usize, d: *const f32) -> [__m256; NT] {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [_mm256_setzero_ps(); NT];
        for i in 0..nb {
            let b = w.add(i * 272);
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
            let mut s = [_mm256_setzero_si256(); NT];
            for j in 0..8 {
                let wv = _mm256_loadu_si256(b.add(16 + 32 * j) as *const __m256i);
                let aw = _mm256_sign_epi8(wv, wv);
                for (t, st) in s.iter_mut().enumerate() {
                    let xp = x.add((t * nb + i) * 32);
                    let xb = if V == 0 {
                        _mm256_set1_epi32((xp.add(4 * j) as *const i32).read_unaligned())
                    } else {
                        _mm256_loadu_si256(xp as *const __m256i)
                    };
                    let m = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(xb, wv));
                    if V == 2 {
                        *st = _mm256_add_epi16(*st, m); // wrong math, port test only
                    } else {
                        *st = _mm256_add_epi32(*st, _mm256_madd_epi16(m, ones));
                    }
                }
            }
            for t in 0..NT {
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*d.add(t * nb + i)));
                acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(scale, _mm256_cvtepi32_ps(s[t])));
            }
        }
        acc
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q4<const NT: usize, const V: usize>(w: *const u8, x: *const i8, nb: usize, d: *const f32, bias: *const i32) -> [__m256; NT] {
        let ones = _mm256_set1_epi16(1);
        let m4 = _mm256_set1_epi8(0x0F);
        let mut acc = [_mm256_setzero_ps(); NT];
        for i in 0..nb {
            let b = w.add(i * 144);
            let dw = _mm256_cvtph_ps(_mm_loadu_si128(b as *const __m128i));
            let mut s = [_mm256_setzero_si256(); NT];
            for j in 0..4 {
                let v = _mm256_loadu_si256(b.add(16 + 32 * j) as *const __m256i);
                let lo = _mm256_and_si256(v, m4);
                let hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
                for (t, st) in s.iter_mut().enumerate() {
                    let (xl, xh) = if V == 0 {
                        let xp = x.add((t * nb + i) * 32);
                        (
                            _mm256_set1_epi32((xp.add(4 * j) as *const i32).read_unaligned()),
                            _mm256_set1_epi32((xp.add(16 + 4 * j) as *const i32).read_unaligned()),
                        )
                    } else {
                        let xp = x.add((t * nb + i) * 256);
                        (_mm256_loadu_si256(xp.add(32 * j) as *const __m256i), _mm256_loadu_si256(xp.add(128 + 32 * j) as *const __m256i))
                    };
                    *st = _mm256_add_epi16(*st, _mm256_add_epi16(_mm256_maddubs_epi16(lo, xl), _mm256_maddubs_epi16(hi, xh)));
                }
            }
            for t in 0..NT {
                let isum = _mm256_add_epi32(_mm256_madd_epi16(s[t], ones), _mm256_set1_epi32(*bias.add(t * nb + i)));
                let scale = _mm256_mul_ps(dw, _mm256_set1_ps(*d.add(t * nb + i)));
                acc[t] = _mm256_add_ps(acc[t], _mm256_mul_ps(scale, _mm256_cvtepi32_ps(isum)));
            }
        }
        acc
    }
    fn best<F: FnMut() -> R, R>(mut f: F, reps: usize) -> f64 {
        let mut best = f64::MAX;
        for _ in 0..reps {
            let s = Instant::now();
            std::hint::black_box(f());
            best = best.min(s.elapsed().as_secs_f64());
        }
        best
    }

    /// `CHAINS` independent 512-bit FMA chains, `n` rounds.
    #[target_feature(enable = "avx512f,fma")]
    unsafe fn fma512(n: usize) -> f32 {
        const CHAINS: usize = 24;
        let (b, c) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
        let mut a = [_mm512_set1_ps(1.0); CHAINS];
        for _ in 0..n {
            for v in a.iter_mut() {
                *v = _mm512_fmadd_ps(*v, b, c);
            }
        }
        a.iter().map(|v| _mm512_reduce_add_ps(*v)).sum()
    }

    /// 16 independent 512-bit `vpdpbusd` chains, `n` rounds.
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn dpbusd512(n: usize) -> i32 {
        let (u, x) = (_mm512_set1_epi8(3), _mm512_set1_epi8(5));
        let mut a = [_mm512_setzero_si512(); 16];
        for _ in 0..n {
            for v in a.iter_mut() {
                *v = _mm512_dpbusd_epi32(*v, u, x);
            }
        }
        a.iter().map(|v| _mm512_reduce_add_epi32(*v)).fold(0, i32::wrapping_add)
    }

    /// The F16 float tile's loop body (as `simd::avx512::float_tile`): `NR` f16 rows converted
    /// per 16 columns, `NT` tokens' activations (row-major, or interleaved per 16 columns when
    /// `INTERLEAVED`), `NR × NT` FMAs; `cols` columns, all L1-resident.
    #[target_feature(enable = "avx512f,avx512bw,fma,f16c")]
    unsafe fn f16_tile<const NR: usize, const NT: usize, const INTERLEAVED: bool>(w: *const u16, x: *const f32, cols: usize) -> f32 {
        let mut acc = [[_mm512_setzero_ps(); NT]; NR];
        for i in (0..cols).step_by(16) {
            let mut wv = [_mm512_setzero_ps(); NR];
            for (r, v) in wv.iter_mut().enumerate() {
                *v = _mm512_cvtph_ps(_mm256_loadu_si256(w.add(r * cols + i) as *const __m256i));
            }
            for t in 0..NT {
                let at = if INTERLEAVED { i * NT + 16 * t } else { t * cols + i };
                let xv = _mm512_loadu_ps(x.add(at));
                for (r, row) in acc.iter_mut().enumerate() {
                    row[t] = _mm512_fmadd_ps(wv[r], xv, row[t]);
                }
            }
        }
        acc.iter().flatten().map(|v| _mm512_reduce_add_ps(*v)).sum()
    }

    /// The 512-bit section (AVX-512 F/BW + VNNI machines only).
    fn wide() {
        if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vnni")) {
            println!("no AVX-512 F/BW/VNNI: no 512-bit section");
            return;
        }
        let n = 2_000_000;
        // SAFETY: AVX-512 F/BW/VNNI (and AVX2/FMA/F16C, checked by the caller) detected above.
        unsafe {
            let fma = (n * 24) as f64 / best(|| fma512(n), 5) / 1e9;
            println!("512-bit ops alone, one thread, G per second of wall clock:");
            println!("  vfmadd (24 chains): {fma:.2} G ({:.0} G multiply-adds)", fma * 16.0);
            println!("  vpdpbusd (16 chains): {:.2} G", (n * 16) as f64 / best(|| dpbusd512(n), 5) / 1e9);
            let cols = 1024;
            let w: Vec<u16> = (0..4 * cols).map(|i| 0x3c00 + (i % 1000) as u16).collect();
            let x: Vec<f32> = (0..6 * cols).map(|i| (i % 97) as f32 * 0.01).collect();
            let reps = 10_000;
            let rate = |fmas: usize, f: &dyn Fn() -> f32| {
                let s = best(|| (0..reps).map(|_| f()).sum::<f32>(), 5);
                let g = (reps * fmas) as f64 / s / 1e9;
                format!("{g:.2} G FMAs ({:.0}% of the FMAs alone)", 100.0 * g / fma)
            };
            let (wp, xp) = (w.as_ptr(), x.as_ptr());
            println!("F16 float tile bodies, {cols} L1-resident columns:");
            println!("  4 rows x 4 tokens, row-major activations: {}", rate(4 * 4 * cols / 16, &|| f16_tile::<4, 4, false>(wp, xp, cols)));
            println!("  4 rows x 6 tokens, interleaved activations: {}", rate(4 * 6 * cols / 16, &|| f16_tile::<4, 6, true>(wp, xp, cols)));
        }
    }

    pub fn main() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c")) {
            println!("no AVX2/FMA/F16C");
            return;
        }
        let n = 20_000;
        // SAFETY: AVX2 checked above.
        let g = ghz(unsafe { best(|| p_mub_mub(n), 300) } / (n * 16) as f64);
        println!("pairs of independent 256-bit ops (8 chains each), cycles per pair at {g:.2} GHz:");
        unsafe {
            for (name, f) in [
                ("maddubs+srai", p_mub_srai as unsafe fn(usize) -> __m256i),
                ("srai+srai", p_srai_srai),
                ("maddubs+add", p_mub_add),
                ("add+add", p_add_add),
                ("sign+sign", p_sgn_sgn),
                ("sign+add", p_sgn_add),
                ("shuf+shuf", p_shuf_shuf),
                ("maddubs+shuf", p_mub_shuf),
            ] {
                println!("  {name}: {:.2}", best(|| f(n), 300) * 1e9 * g / (n * 8) as f64);
            }
            let nb = 8;
            let w: Vec<u8> = (0..nb * 272).map(|i| (i * 37 % 251) as u8).collect();
            let x: Vec<i8> = (0..8 * nb * 256).map(|i| ((i * 13 % 200) as i32 - 100) as i8).collect();
            let d: Vec<f32> = vec![0.01; 8 * nb];
            let bias: Vec<i32> = vec![3; 8 * nb];
            let (wp, xp, dp, bp) = (w.as_ptr(), x.as_ptr(), d.as_ptr(), bias.as_ptr());
            let per = |units: usize, s: f64| s * 1e9 * g / (10 * units) as f64;
            println!("lane-per-row inner loops, L1-resident, cycles per 8 rows x 32 columns x token (floor: Q4_0 18, Q8_0 32):");
            // One call of a loop; every token's sums go to `black_box`.
            macro_rules! call {
                ($e:expr) => {
                    Box::new(|| {
                        std::hint::black_box($e);
                    }) as Box<dyn Fn()>
                };
            }
            let w = || std::hint::black_box(wp);
            let loops = [
                ("Q8_0 1 token", 1, call!(q8::<1, 0>(w(), xp, nb, dp))),
                ("Q8_0 4 tokens", 4, call!(q8::<4, 0>(w(), xp, nb, dp))),
                ("Q8_0 4 tokens without vpmaddwd (wrong sums, pipe test)", 4, call!(q8::<4, 2>(w(), xp, nb, dp))),
                ("Q4_0 1 token", 1, call!(q4::<1, 0>(w(), xp, nb, dp, bp))),
                ("Q4_0 4 tokens", 4, call!(q4::<4, 0>(w(), xp, nb, dp, bp))),
                ("Q4_0 8 tokens", 8, call!(q4::<8, 0>(w(), xp, nb, dp, bp))),
                ("Q4_0 1 token, activations pre-broadcast", 1, call!(q4::<1, 1>(w(), xp, nb, dp, bp))),
                ("Q4_0 4 tokens, activations pre-broadcast", 4, call!(q4::<4, 1>(w(), xp, nb, dp, bp))),
            ];
            for (name, tokens, call) in &loops {
                println!("  {name}: {:.1}", per(tokens * nb, best(|| (0..10).for_each(|_| call()), 3000)));
            }
        }
        wide();
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    probe::main();
}
