//! The checks every packed format passes (`repack.rs`, `repack_k.rs`): on every path that runs
//! packed kernels ([`packed_paths`]: AVX2, AVX-512 with its VNNI kernels, AMX) a packed matrix
//! gives bitwise the scalar reference's result, the scalar path ignores the packing, token by
//! token = batched, and inside `matmul_multi` = its own call.

use engram_kernels::internal::{matmul_multi_with, matmul_with, Isa};
use engram_kernels::{quantize, DType, Packed, WeightMatrix};

use super::data;

/// The bit patterns of `v` (to compare results exactly, NaN included).
pub fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The paths of this CPU that run packed kernels (`Isa::runs_packed`): AVX2 (`avx2_packed*`),
/// AVX-512 (`avx512_packed*`, VNNI) and AMX (its tiles read packed Q4_0 / Q8_0 from
/// `dispatch::amx_token_min` tokens; fewer, and other formats, run the AVX-512 path).
pub fn packed_paths() -> Vec<Isa> {
    [Isa::Avx2, Isa::Avx512, Isa::Amx].into_iter().filter(|i| i.is_available()).collect()
}

/// `wp` (`wm` with its packing) on every packed path = the scalar reference over `wm`,
/// bitwise, for the `n` tokens of `x`; the scalar path ignores the packing; each token alone =
/// batched.
pub fn assert_packed_equals_scalar(wm: &WeightMatrix, wp: &WeightMatrix, x: &[f32], n: usize) {
    let (d, rows, cols) = (wm.dtype, wm.rows, wm.cols);
    let mut want = vec![0f32; n * rows];
    matmul_with(Isa::Scalar, wm, x, n, &mut want);
    let mut s = vec![f32::NAN; n * rows];
    matmul_with(Isa::Scalar, wp, x, n, &mut s);
    assert_eq!(bits(&s), bits(&want), "the scalar path ignores the packing");
    for isa in packed_paths() {
        let mut got = vec![f32::NAN; n * rows];
        matmul_with(isa, wp, x, n, &mut got);
        assert_eq!(bits(&got), bits(&want), "{isa:?} {d} {rows}x{cols} n={n}");
        for t in 0..n {
            let mut one = vec![f32::NAN; rows];
            matmul_with(isa, wp, &x[t * cols..(t + 1) * cols], 1, &mut one);
            assert_eq!(bits(&one), bits(&got[t * rows..(t + 1) * rows]), "{isa:?} {d} n={n} token {t}");
        }
    }
}

/// Matrices of `shapes` (format, rows; 512 columns), packed where they can be, in one
/// `matmul_multi` = their own calls, and packed ones = the scalar path. `unpacked` names the
/// shape that must stay unpacked.
pub fn assert_multi_equals_separate(shapes: &[(DType, usize)], unpacked: usize) {
    let cols = 512;
    let bytes: Vec<Vec<u8>> =
        shapes.iter().enumerate().map(|(i, &(d, r))| quantize(d, &data(r * cols, 60 + i as u64), cols).unwrap()).collect();
    let plain: Vec<WeightMatrix> = shapes.iter().zip(&bytes).map(|(&(d, r), b)| WeightMatrix::new(d, r, cols, b).unwrap()).collect();
    let packs: Vec<Option<Packed>> = plain.iter().map(Packed::new).collect();
    assert!(packs[unpacked].is_none(), "{} rows stay unpacked", shapes[unpacked].1);
    let ws: Vec<WeightMatrix> = plain.iter().zip(&packs).map(|(w, p)| p.as_ref().map_or(*w, |p| w.with_packed(p))).collect();
    let wr: Vec<&WeightMatrix> = ws.iter().collect();
    for n in [1usize, 4, 11] {
        let x = data(n * cols, 70 + n as u64);
        for isa in packed_paths() {
            let mut multi: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; n * w.rows]).collect();
            let mut refs: Vec<&mut [f32]> = multi.iter_mut().map(|v| v.as_mut_slice()).collect();
            matmul_multi_with(isa, &wr, &x, n, &mut refs);
            for (i, w) in ws.iter().enumerate() {
                let mut one = vec![0f32; n * w.rows];
                matmul_with(isa, w, &x, n, &mut one);
                assert_eq!(bits(&one), bits(&multi[i]), "{isa:?} matrix {i} n={n}");
                if packs[i].is_some() {
                    let mut s = vec![0f32; n * w.rows];
                    matmul_with(Isa::Scalar, w, &x, n, &mut s);
                    assert_eq!(bits(&s), bits(&one), "{isa:?} matrix {i} n={n} vs scalar");
                }
            }
        }
    }
}
