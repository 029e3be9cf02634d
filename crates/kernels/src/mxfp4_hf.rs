//! MXFP4 in the layout of Hugging Face checkpoints (gpt-oss's `*_blocks` / `*_scales`, as
//! transformers' `convert_moe_packed_tensors` reads them) repacked into ggml's MXFP4 blocks
//! (`DType::MXFP4`), as llama.cpp's converter (`GptOssModel.repack_mxfp4`) does.
//!
//! Invariant: only the order of the 4-bit codes within a block changes; codes and exponents
//! are kept, so the repacked block dequantizes to exactly the values transformers computes.

/// Rows `first`, `first + step`, … of an MXFP4 matrix of `rows × cols` in the checkpoint
/// layout — `blocks`: `rows × cols/32` blocks of 16 bytes, byte `k` holding element `2k` in its
/// low nibble and `2k + 1` in its high one; `scales`: one E8M0 exponent per block — as ggml
/// MXFP4 rows: per block the exponent, then byte `j` holding element `j` low and `j + 16` high.
/// Both index the same FP4 values (ggml's `kvalues_mxfp4` are them doubled, its exponent
/// halves them back).
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
    use crate::{dequantize_row, DType};

    /// One block through both layouts: transformers' dequantization of the checkpoint bytes
    /// equals ggml's of the repacked ones.
    #[test]
    fn hf_mxfp4_blocks_repack_to_the_same_values() {
        const FP4: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
        let blocks: Vec<u8> = (0..16u8).map(|k| k.wrapping_mul(37).wrapping_add(11)).collect();
        // transformers: element 2k from the low nibble, 2k + 1 from the high one, × 2^(e - 127).
        let want: Vec<f32> =
            (0..32).map(|i| FP4[(if i % 2 == 0 { blocks[i / 2] & 15 } else { blocks[i / 2] >> 4 }) as usize] * 0.25).collect();
        let ggml = mxfp4_rows_from_hf(&blocks, &[125], 1, 32, 0, 1);
        let mut got = vec![0f32; 32];
        dequantize_row(DType::MXFP4, &ggml, &mut got);
        assert_eq!(got, want);
        // Every other row of three: rows 0 and 2.
        let three: Vec<u8> = (0..48u8).collect();
        let picked = mxfp4_rows_from_hf(&three, &[1, 2, 3], 3, 32, 0, 2);
        assert_eq!((picked.len(), picked[0], picked[17]), (34, 1, 3));
    }
}
