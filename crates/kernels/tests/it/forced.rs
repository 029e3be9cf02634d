//! `ENGRAM_SIMD` forces the kernel dispatch: every path this CPU runs can be forced, and the
//! forced public `matmul` gives bitwise the results of `matmul_with` on that path (whose
//! accuracy against the f64 reference `tests/it/matmul.rs` checks); unknown names and paths the
//! CPU lacks are clear errors. The environment is read once per process, so each forced path
//! runs in a child process of this test binary.

use crate::common;
use common::*;
use engram_kernels::internal::{matmul_with, Isa};
use engram_kernels::*;

#[test]
fn resolve_accepts_available_paths_and_refuses_the_rest() {
    assert_eq!(Isa::resolve("").unwrap(), None);
    assert_eq!(Isa::resolve("auto").unwrap(), None);
    assert_eq!(Isa::resolve("Scalar").unwrap(), Some(Isa::Scalar));
    for isa in Isa::available() {
        assert_eq!(Isa::resolve(isa.name()).unwrap(), Some(isa));
    }
    let e = Isa::resolve("neon9").unwrap_err().to_string();
    assert!(e.contains("ENGRAM_SIMD=neon9") && e.contains("unknown") && e.contains("scalar"), "{e}");
    for isa in [Isa::Avx2, Isa::Avx512, Isa::Amx, Isa::Neon].into_iter().filter(|i| !i.is_available()) {
        let e = Isa::resolve(isa.name()).unwrap_err().to_string();
        assert!(e.contains("cannot run") && e.contains(isa.name()), "{e}");
    }
}

/// Run by [`every_available_path_can_be_forced`] in a child with `ENGRAM_SIMD` set; a no-op
/// otherwise.
#[test]
fn forced_child() {
    let Ok(want) = std::env::var("ENGRAM_SIMD_TEST_CHILD") else { return };
    let isa = Isa::detect();
    assert_eq!(isa.name(), want, "ENGRAM_SIMD did not force the dispatch");
    let cols = 512;
    for d in DType::ALL {
        let rows = 70;
        let bytes = quantize(d, &data(rows * cols, 21), cols).unwrap();
        let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        for n in [1usize, 4, 17] {
            let x = data(n * cols, 22 + n as u64);
            let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
            matmul(&wm, &x, n, &mut a);
            matmul_with(isa, &wm, &x, n, &mut b);
            assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "{d} {isa:?} n={n}");
        }
    }
}

#[test]
fn every_available_path_can_be_forced() {
    let exe = std::env::current_exe().unwrap();
    for isa in Isa::available() {
        let out = std::process::Command::new(&exe)
            .args(["--exact", "forced::forced_child", "--test-threads", "1"])
            .env("ENGRAM_SIMD", isa.name())
            .env("ENGRAM_SIMD_TEST_CHILD", isa.name())
            .output()
            .unwrap();
        assert!(out.status.success(), "{isa:?}: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"), "{isa:?}: the child ran no test");
    }
}

#[test]
fn the_serial_path_equals_the_pools_on_every_tile_path() {
    use engram_kernels::internal::matmul_serial_with;
    let cols = 512;
    for isa in Isa::available().into_iter().filter(|i| *i != Isa::Amx) {
        for d in DType::ALL {
            let rows = 37;
            let bytes = quantize(d, &data(rows * cols, 31), cols).unwrap();
            let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
            for n in [1usize, 5, 17] {
                let x = data(n * cols, 32 + n as u64);
                let (mut a, mut b) = (vec![0f32; n * rows], vec![0f32; n * rows]);
                matmul_with(isa, &wm, &x, n, &mut a);
                matmul_serial_with(isa, &wm, &x, n, &mut b);
                assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()), "{d} {isa:?} n={n}");
            }
        }
    }
}
