//! The aarch64 NEON path (`Isa::Neon`) gives bitwise the scalar reference's results for every
//! format (quantized formats through its own integer dots, float formats through the scalar
//! kernel), alone and in batches, including activations and weights at the ends of their
//! ranges.
//!
//! A plain `main` (no test harness) on the calling thread only, through
//! `matmul_serial_with`: `scripts/neon-check.sh` cross-builds it and runs it under
//! `qemu-aarch64`, which hangs in this machine's VM on any thread creation (libtest starts a
//! thread per test). On x86-64 it only says so; `tests/it/forced.rs` checks there that forcing
//! `neon` is a clear error and that the serial path equals the pool's.

mod common;

#[cfg(target_arch = "aarch64")]
fn main() {
    use common::*;
    use engram_kernels::internal::{matmul_serial_with, Isa};
    use engram_kernels::*;

    let same_as_scalar = |d: DType, rows: usize, cols: usize, w: &[f32], x: &[f32], n: usize| {
        let bytes = quantize(d, w, cols).unwrap();
        let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
        matmul_serial_with(Isa::Scalar, &wm, x, n, &mut a);
        matmul_serial_with(Isa::Neon, &wm, x, n, &mut b);
        for (i, (p, q)) in a.iter().zip(&b).enumerate() {
            assert_eq!(p.to_bits(), q.to_bits(), "{d} n={n} element {i}: scalar {p} neon {q}");
        }
    };

    // Detection and forcing.
    assert!(Isa::Neon.is_available());
    assert_eq!(Isa::best(), Isa::Neon);
    assert_eq!(Isa::resolve("neon").unwrap(), Some(Isa::Neon));
    assert!(Isa::resolve("avx2").unwrap_err().to_string().contains("cannot run"));

    // Every format, one token and batches.
    let mut checks = 0;
    let cols = 512;
    for d in DType::ALL {
        let rows = 37;
        let w = data(rows * cols, 5);
        for n in [1usize, 2, 5, 17] {
            same_as_scalar(d, rows, cols, &w, &data(n * cols, 40 + n as u64), n);
            checks += 1;
        }
    }

    // Alternating ±large weights and activations drive every quantized value to the end of
    // its range (±127 activations, −127/127 Q8_0 weights, 0/15 nibbles, Q6_K's −32/31).
    let (rows, cols) = (9, 256);
    let w: Vec<f32> = (0..rows * cols).map(|i| if (i / 3) % 2 == 0 { 1.0 } else { -1.0 } * (1 + i % 7) as f32).collect();
    let x: Vec<f32> = (0..3 * cols).map(|i| if i % 2 == 0 { 1e3 } else { -1e3 }).collect();
    for d in DType::ALL.into_iter().filter(|d| d.block_elems() > 1) {
        same_as_scalar(d, rows, cols, &w, &x, 3);
        checks += 1;
    }
    println!("neon: {checks} checks, every result bitwise the scalar reference's");
}

#[cfg(not(target_arch = "aarch64"))]
fn main() {
    println!("neon: aarch64 only (scripts/neon-check.sh runs it under qemu-aarch64)");
}
