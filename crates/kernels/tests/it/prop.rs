//! Property tests on random shapes: best path vs scalar, and batch == single tokens bitwise.

use crate::common;
use common::*;
use engram_kernels::internal::{matmul_with, Isa};
use engram_kernels::*;
use proptest::prelude::*;

fn dtype() -> impl Strategy<Value = DType> {
    prop::sample::select(DType::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_shapes(d in dtype(), rows in 1usize..20, blocks in 1usize..4, n in 1usize..10, seed in 0u64..1000) {
        let cols = blocks * d.block_elems().max(32) + if d.block_elems() == 1 { seed as usize % 7 } else { 0 };
        let w = data(rows * cols, seed);
        let bytes = quantize(d, &w, cols).unwrap();
        let wm = WeightMatrix::new(d, rows, cols, &bytes).unwrap();
        let wd = dequant(d, &bytes, rows, cols);
        let x = data(n * cols, seed + 1);
        let (refv, bound) = reference(d, &wd, &x, rows, cols, n);
        let mut out = vec![0f32; n * rows];
        matmul(&wm, &x, n, &mut out);
        for i in 0..n * rows {
            prop_assert!((out[i] as f64 - refv[i]).abs() <= bound[i], "{} i={}: {} vs {}", d, i, out[i], refv[i]);
        }
        let isa = Isa::detect();
        let t = n - 1;
        let mut one = vec![0f32; rows];
        matmul_with(isa, &wm, &x[t * cols..], 1, &mut one);
        for r in 0..rows {
            prop_assert_eq!(one[r].to_bits(), out[t * rows + r].to_bits());
        }
    }

    #[test]
    fn weight_matrix_rejects_bad_lengths(d in dtype(), rows in 0usize..5, blocks in 0usize..3, extra in 1usize..40) {
        let cols = blocks * d.block_elems();
        let len = rows * d.row_bytes(cols).unwrap();
        let buf = vec![0u8; len + extra];
        prop_assert!(WeightMatrix::new(d, rows, cols, &buf[..len]).is_ok());
        prop_assert!(WeightMatrix::new(d, rows, cols, &buf).is_err());
        if d.block_elems() > 1 {
            prop_assert!(WeightMatrix::new(d, rows, cols + 1, &buf).is_err());
        }
    }
}
