//! Does vector work overlap the AMX tile unit on this CPU? `cargo run --release -p
//! engram-kernels --example amx_overlap` prints two tables. First: a loop of 4 independent
//! `tdpbf16ps`, a loop of N AVX-512 FMAs (8 independent chains), and both interleaved in one
//! loop. Perfect overlap would give the larger of the two; no overlap, their sum. On the Sapphire
//! Rapids machine of the README, up to ~64 FMAs hide beside 4 tile products (~16 per product:
//! 512-bit vector work runs at about one instruction per cycle while the tile unit works), and
//! past that the times add up. Second: the same at 64 for each instruction the attention softmax
//! uses — all overlap alike, so it is the amount of vector work, not the mix. The softmax needs
//! ~25-40 vector instructions per tile product, which is why interleaving it with the tile work
//! (tried: blocks software-pipelined) did not pay off there. Third: tile loads and stores beside
//! 64 FMAs — unlike products, they do not overlap vector work at all (interleaved ≈ the sum),
//! so every `tileloadd`/`tilestored` of the attention kernel adds to its time.

#[cfg(target_arch = "x86_64")]
fn main() {
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::time::Instant;

    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Line([u8; 64]);

    /// 4 independent tile products of the operands in tmm4 and tmm5.
    #[inline(always)]
    unsafe fn four_products() {
        asm!(
            "tdpbf16ps tmm0, tmm4, tmm5",
            "tdpbf16ps tmm1, tmm4, tmm5",
            "tdpbf16ps tmm2, tmm4, tmm5",
            "tdpbf16ps tmm3, tmm4, tmm5",
            options(nostack, nomem)
        );
    }

    /// What each iteration of [`run`] issues on the tile unit before its FMAs.
    #[derive(Clone, Copy)]
    enum TileWork {
        Nothing,
        /// [`four_products`].
        Products,
        /// 4 `tileloadd` of the 16 lines at `src` (tiles 4-7: the same `ones` the products
        /// read, from L1).
        Loads,
        /// One `tilestored` of tile 0 into the 16 lines at `dst`.
        Store,
    }

    /// `iters` iterations of `work` then `fmas` AVX-512 FMAs (8 independent chains); ns per
    /// iteration.
    #[target_feature(enable = "avx512f")]
    unsafe fn run(iters: usize, work: TileWork, fmas: usize, src: *const Line, dst: *mut Line) -> f64 {
        let mut v = [_mm512_set1_ps(1.0); 8];
        let m = _mm512_set1_ps(0.999);
        let t = Instant::now();
        for _ in 0..iters {
            match work {
                TileWork::Nothing => {}
                TileWork::Products => four_products(),
                TileWork::Loads => asm!(
                    "tileloadd tmm4, [{0} + {1}*1]",
                    "tileloadd tmm5, [{0} + {1}*1]",
                    "tileloadd tmm6, [{0} + {1}*1]",
                    "tileloadd tmm7, [{0} + {1}*1]",
                    in(reg) src, in(reg) 64usize, options(nostack, readonly)
                ),
                TileWork::Store => asm!("tilestored [{0} + {1}*1], tmm0", in(reg) dst, in(reg) 64usize, options(nostack)),
            }
            for _ in 0..fmas / 8 {
                for x in v.iter_mut() {
                    *x = _mm512_fmadd_ps(*x, m, m);
                }
            }
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / iters as f64;
        std::hint::black_box(v);
        ns
    }

    macro_rules! bench {
        ($name:literal, $ins:literal) => {{
            #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
            unsafe fn run(iters: usize, tiles: bool, vec: bool) -> f64 {
                let t = Instant::now();
                for _ in 0..iters {
                    if tiles {
                        four_products();
                    }
                    if vec {
                        for _ in 0..8 {
                            asm!(
                                concat!($ins, " zmm0, zmm0, zmm8"),
                                concat!($ins, " zmm1, zmm1, zmm8"),
                                concat!($ins, " zmm2, zmm2, zmm8"),
                                concat!($ins, " zmm3, zmm3, zmm8"),
                                concat!($ins, " zmm4, zmm4, zmm8"),
                                concat!($ins, " zmm5, zmm5, zmm8"),
                                concat!($ins, " zmm6, zmm6, zmm8"),
                                concat!($ins, " zmm7, zmm7, zmm8"),
                                out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                                out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                                options(nostack, nomem)
                            );
                        }
                    }
                }
                t.elapsed().as_secs_f64() * 1e9 / iters as f64
            }
            let iters = 1_000_000;
            // SAFETY: `supported` checked AMX-BF16, AVX-512 BF16 and the tile permission.
            let (a, b, c) = unsafe { (run(iters, true, false), run(iters, false, true), run(iters, true, true)) };
            println!("| `{}` | {a:.1} ns | {b:.1} ns | {c:.1} ns | {:.0}% |", $name, 100.0 * (a + b - c) / a.min(b));
        }};
    }

    if !engram_kernels::flash::supported(64) {
        eprintln!("no AMX-BF16 on this machine");
        return;
    }
    // All eight tiles 16 rows × 64 bytes; tmm4 and tmm5 hold the products' operands.
    let mut cfg = Line([0; 64]);
    cfg.0[0] = 1;
    for t in 0..8 {
        cfg.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
        cfg.0[48 + t] = 16;
    }
    let ones = vec![Line([0x3f; 64]); 16];
    // SAFETY: `supported` checked AMX-BF16, AVX-512 and the OS tile permission; the tiles read
    // 16 lines of `ones`.
    unsafe {
        asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        asm!("tileloadd tmm4, [{0} + {1}*1]", "tileloadd tmm5, [{0} + {1}*1]", in(reg) ones.as_ptr(), in(reg) 64usize, options(nostack, readonly));
    }
    let iters = 2_000_000;
    let mut stored = vec![Line([0; 64]); 16];
    let (src, dst) = (ones.as_ptr(), stored.as_mut_ptr());
    println!("| FMAs per iteration | 4 tile products alone | FMAs alone | interleaved | sum of the two |");
    println!("|---:|---:|---:|---:|---:|");
    for fmas in [16usize, 32, 64, 96, 128] {
        // SAFETY: as above.
        let (a, b, c) = unsafe {
            use TileWork::{Nothing, Products};
            (run(iters, Products, 0, src, dst), run(iters, Nothing, fmas, src, dst), run(iters, Products, fmas, src, dst))
        };
        println!("| {fmas} | {a:.1} ns | {b:.1} ns | {c:.1} ns | {:.1} ns |", a + b);
    }
    println!();
    println!("| 64 of | 4 tile products | the 64 alone | interleaved | overlap (of the shorter) |");
    println!("|---|---:|---:|---:|---:|");
    bench!("vfmadd231ps", "vfmadd231ps");
    bench!("vaddps", "vaddps");
    bench!("vmulps", "vmulps");
    bench!("vmaxps", "vmaxps");
    bench!("vsubps", "vsubps");
    bench!("vscalefps", "vscalefps");
    bench!("vpaddd", "vpaddd");
    bench!("vpandd", "vpandd");
    bench!("vpermw", "vpermw");
    bench!("vpermps", "vpermps");
    bench!("vpermt2ps", "vpermt2ps");
    bench!("vpunpcklwd", "vpunpcklwd");
    bench!("vcvtne2ps2bf16", "vcvtne2ps2bf16");
    bench!("vpsllvd", "vpsllvd");
    bench!("vpsrlvd", "vpsrlvd");
    bench!("vpshufb", "vpshufb");

    println!();
    println!("| beside 64 FMAs | the tile operations alone | the FMAs alone | interleaved | sum of the two |");
    println!("|---|---:|---:|---:|---:|");
    for (work, name) in [(TileWork::Loads, "4 `tileloadd` (L1)"), (TileWork::Store, "1 `tilestored`")] {
        // SAFETY: as above; the loads read the 16 lines of `ones`, the store writes the 16 lines
        // of `stored`.
        let (a, b, c) =
            unsafe { (run(iters, work, 0, src, dst), run(iters, TileWork::Nothing, 64, src, dst), run(iters, work, 64, src, dst)) };
        println!("| {name} | {a:.1} ns | {b:.1} ns | {c:.1} ns | {:.1} ns |", a + b);
    }

    // SAFETY: releases the tile state configured above.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("AMX is x86-64 only");
}
