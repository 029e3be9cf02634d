//! Re-laying GPT-OSS's Hugging Face expert tensors as the `[out, in]` rows the kernels
//! multiply: float matrices stored for `x @ W` (`[in, out]`) are transposed, and MXFP4
//! ones (`*_blocks` `[.., out, in/32, 16]` with `*_scales` `[.., out, in/32]`, rows already
//! `[out, in]`) become ggml's MXFP4 blocks.
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

/// Rows `first`, `first + step`, … of an MXFP4 matrix in transformers' layout (`blocks`:
/// `rows × cols/32` blocks of 16 bytes, byte `k` holding element `2k` in its low nibble and
/// `2k + 1` in its high one; `scales`: one E8M0 exponent per block) as ggml MXFP4 rows
/// (per block the exponent, then byte `j` holding element `j` low and `j + 16` high). Both
/// index the same FP4 values (ggml's `kvalues_mxfp4` doubled, its exponent halved).
pub fn mxfp4_rows_from_hf(blocks: &[u8], scales: &[u8], rows: usize, cols: usize, first: usize, step: usize) -> Vec<u8> {
    let per_row = cols / 32;
    let out_rows = (rows - first).div_ceil(step);
    let mut out = Vec::with_capacity(out_rows * per_row * 17);
    for r in (first..rows).step_by(step) {
        for g in 0..per_row {
            let b = &blocks[(r * per_row + g) * 16..][..16];
            let code = |i: usize| if i.is_multiple_of(2) { b[i / 2] & 0x0f } else { b[i / 2] >> 4 };
            out.push(scales[r * per_row + g]);
            out.extend((0..16).map(|j| code(j) | (code(j + 16) << 4)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One block through both layouts: transformers' dequantization of the HF bytes equals
    /// ggml's of the repacked ones.
    #[test]
    fn hf_mxfp4_blocks_repack_to_the_same_values() {
        const FP4: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
        let blocks: Vec<u8> = (0..16u8).map(|k| k.wrapping_mul(37).wrapping_add(11)).collect();
        let scale = 125u8;
        // transformers' `_convert_moe_packed_tensors`: element 2k low nibble, 2k+1 high, × 2^(e - 127).
        let want: Vec<f32> =
            (0..32).map(|i| FP4[(if i % 2 == 0 { blocks[i / 2] & 15 } else { blocks[i / 2] >> 4 }) as usize] * 0.25).collect();
        let ggml = mxfp4_rows_from_hf(&blocks, &[scale], 1, 32, 0, 1);
        let mut got = vec![0f32; 32];
        engram_kernels::dequantize_row(DType::MXFP4, &ggml, &mut got);
        assert_eq!(got, want);
    }

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
