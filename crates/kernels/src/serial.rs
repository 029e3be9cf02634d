//! [`matmul_serial_with`]: a path's tile kernels run on the calling thread alone.
//!
//! For checks where no thread can be started — the NEON tests under user-mode emulation
//! (`scripts/neon-check.sh`: `qemu-aarch64` hangs in this machine's VM on any thread
//! creation). By the tile invariant (`simd`: a (row, token) result does not depend on the
//! tiling), it gives bitwise what [`crate::matmul::matmul_with`] gives on the same path for an
//! unpacked matrix (`tests/it/forced.rs`), except under `Isa::Amx`, whose Q4_0/Q8_0 rows run
//! AMX tiles in `matmul_with` and the AVX-512 tiles here.

use crate::dtype::WeightMatrix;
use crate::simd::{run_tile, tile_limits, Acts, Isa, TileCtx};

/// `out[t * rows + r] = Σ_c w[r][c] · x[t * cols + c]` with `isa`'s tile kernels, tile by tile
/// on this thread (activations quantized here too, never on the pool for the small inputs
/// this is for); `w.packed` is ignored.
///
/// # Panics
/// If `isa` is not available on this CPU or a slice's length does not fit the shapes.
pub fn matmul_serial_with(isa: Isa, w: &WeightMatrix, x: &[f32], n_tokens: usize, out: &mut [f32]) {
    assert!(isa.is_available(), "the {} kernels cannot run on this CPU", isa.name());
    assert_eq!(x.len(), n_tokens * w.cols, "activations are n_tokens × cols");
    assert_eq!(out.len(), n_tokens * w.rows, "the output is n_tokens × rows");
    let unpacked = WeightMatrix { packed: None, ..*w };
    let acts = Acts::prepare(w.dtype, x, n_tokens, w.cols);
    let c = TileCtx { w: &unpacked, acts: &acts, out: out.as_mut_ptr(), ldo: w.rows };
    let (mr, mt) = tile_limits(isa, w.dtype, n_tokens);
    for t0 in (0..n_tokens).step_by(mt) {
        for r0 in (0..w.rows).step_by(mr) {
            // SAFETY: `isa` is available, the tile lies inside the shapes checked above, and
            // this thread is the only writer of `out`.
            unsafe { run_tile(isa, &c, r0, mr.min(w.rows - r0), t0, mt.min(n_tokens - t0)) };
        }
    }
}
