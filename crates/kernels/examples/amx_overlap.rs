//! Does vector work overlap the AMX tile unit on this CPU? `cargo run --release -p
//! engram-kernels --example amx_overlap`: times a loop of 4 independent `tdpbf16ps`, a loop of N
//! AVX-512 FMAs (8 independent chains), and both interleaved in one loop. Perfect overlap would
//! give the larger of the two; no overlap, their sum. On the Sapphire Rapids machine of the
//! README, up to ~64 FMAs hide beside 4 tile products (~16 per product: 512-bit vector work runs
//! at about one instruction per cycle while the tile unit works), and past that the times add
//! up. The attention softmax needs ~25-40 vector instructions per tile product, which is why
//! interleaving it with the tile work (tried: blocks software-pipelined) did not pay off there;
//! `amx_ports` shows the instruction mix is not the cause.

#[cfg(target_arch = "x86_64")]
fn main() {
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::time::Instant;

    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Line([u8; 64]);

    #[target_feature(enable = "avx512f")]
    unsafe fn run(iters: usize, tiles: bool, fmas: usize) -> f64 {
        let mut cfg = Line([0; 64]);
        cfg.0[0] = 1;
        for t in 0..8 {
            cfg.0[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
            cfg.0[48 + t] = 16;
        }
        let ones = vec![Line([0x3f; 64]); 16];
        asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
        asm!("tileloadd tmm4, [{0} + {1}*1]", "tileloadd tmm5, [{0} + {1}*1]", in(reg) ones.as_ptr(), in(reg) 64usize, options(nostack, readonly));
        let mut v = [_mm512_set1_ps(1.0); 8];
        let m = _mm512_set1_ps(0.999);
        let t = Instant::now();
        for _ in 0..iters {
            if tiles {
                asm!(
                    "tdpbf16ps tmm0, tmm4, tmm5",
                    "tdpbf16ps tmm1, tmm4, tmm5",
                    "tdpbf16ps tmm2, tmm4, tmm5",
                    "tdpbf16ps tmm3, tmm4, tmm5",
                    options(nostack, nomem)
                );
            }
            for _ in 0..fmas / 8 {
                for x in v.iter_mut() {
                    *x = _mm512_fmadd_ps(*x, m, m);
                }
            }
        }
        let ns = t.elapsed().as_secs_f64() * 1e9 / iters as f64;
        std::hint::black_box(v);
        asm!("tilerelease", options(nostack, nomem));
        ns
    }

    if !engram_kernels::flash::supported(64) {
        eprintln!("no AMX-BF16 on this machine");
        return;
    }
    let iters = 2_000_000;
    println!("| FMAs per iteration | 4 tile products alone | FMAs alone | interleaved | sum of the two |");
    println!("|---:|---:|---:|---:|---:|");
    for fmas in [16usize, 32, 64, 96, 128] {
        // SAFETY: `supported` checked AMX-BF16, AVX-512 and the OS tile permission.
        let (a, b, c) = unsafe { (run(iters, true, 0), run(iters, false, fmas), run(iters, true, fmas)) };
        println!("| {fmas} | {a:.1} ns | {b:.1} ns | {c:.1} ns | {:.1} ns |", a + b);
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn main() {
    eprintln!("AMX is x86-64 only");
}
