//! Re-laying GPT-OSS's Hugging Face expert tensors as the `[out, in]` rows the kernels
//! multiply: float matrices stored for `x @ W` (`[in, out]`) are transposed, and MXFP4
//! ones (`*_blocks` `[.., out, in/32, 16]` with `*_scales` `[.., out, in/32]`, rows already
//! `[out, in]`) become ggml's MXFP4 blocks (`engram_kernels::mxfp4_rows_from_hf`).
//!
//! Invariant: only whole elements move (f32, f16 or bf16 bytes copied as they are; MXFP4
//! codes and exponents kept, only their order within a block changes), so a weight reads the
//! same values however it was stored.

use engram_kernels::DType;

/// From `src` (`rows × cols` elements of `dtype`, row-major), the columns `first`,
/// `first + step`, … as the rows of a new row-major matrix: output row `r` is input
/// column `first + r·step`, `rows` elements long.
pub fn columns_as_rows(src: &[u8], dtype: DType, rows: usize, cols: usize, first: usize, step: usize) -> Vec<u8> {
    let size = dtype.row_bytes(1).expect("a plain float dtype");
    let out_rows = (cols - first).div_ceil(step);
    let mut out = vec![0u8; out_rows * rows * size];
    for r in 0..out_rows {
        let col = first + r * step;
        for c in 0..rows {
            let s = (c * cols + col) * size;
            let d = (r * rows + c) * size;
            out[d..d + size].copy_from_slice(&src[s..s + size]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_columns_become_rows() {
        // 2 rows × 4 columns of f32: [[0, 1, 2, 3], [4, 5, 6, 7]].
        let src: Vec<u8> = (0..8).flat_map(|i| (i as f32).to_le_bytes()).collect();
        let floats = |b: Vec<u8>| -> Vec<f32> { b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
        assert_eq!(floats(columns_as_rows(&src, DType::F32, 2, 4, 0, 2)), [0.0, 4.0, 2.0, 6.0]);
        assert_eq!(floats(columns_as_rows(&src, DType::F32, 2, 4, 1, 2)), [1.0, 5.0, 3.0, 7.0]);
        assert_eq!(floats(columns_as_rows(&src, DType::F32, 2, 4, 0, 1)), [0.0, 4.0, 1.0, 5.0, 2.0, 6.0, 3.0, 7.0]);
    }
}
