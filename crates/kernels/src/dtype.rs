//! Weight storage formats ([`DType`]), the validated weight view ([`WeightMatrix`]) and the
//! crate's error type ([`KernelError`]).
//!
//! Invariant: a `WeightMatrix` that exists always has `cols % dtype.block_elems() == 0` and
//! `data.len() == rows * dtype.row_bytes(cols)`, so kernels may index blocks without checks.

/// Weight storage formats, byte-compatible with ggml/GGUF blocks (see `ggml-common.h`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE f32, 4 bytes per element.
    F32,
    /// IEEE f16, 2 bytes per element.
    F16,
    /// bfloat16 (the top 16 bits of an f32), 2 bytes per element.
    BF16,
    /// 32 elements: `f16 d` + 32 × `i8`; value = q·d.
    Q8_0,
    /// 32 elements: `f16 d` + 16 bytes of nibbles; value = (q−8)·d.
    Q4_0,
    /// 256 elements: `f16 d, f16 dmin`, 12 bytes of 6-bit scales/mins, 128 bytes of nibbles.
    Q4K,
    /// 256 elements: 128 bytes low nibbles, 64 bytes high 2-bit pairs, 16 × `i8` scales, `f16 d`.
    Q6K,
    /// 32 elements: `f16 d, f16 m` + 16 bytes of nibbles; value = q·d + m.
    Q4_1,
    /// 32 elements: `f16 d`, 4 bytes of fifth bits, 16 bytes of nibbles; value = (q−16)·d.
    Q5_0,
    /// 32 elements: `f16 d, f16 m`, 4 bytes of fifth bits, 16 bytes of nibbles; value = q·d + m.
    Q5_1,
    /// 256 elements: 16 bytes of 4-bit scale/min pairs, 64 bytes of 2-bit quants, `f16 d, dmin`;
    /// value = d·sc·q − dmin·m per 16 elements.
    Q2K,
    /// 256 elements: 32 bytes of high bits, 64 bytes of low 2 bits, 12 bytes of 6-bit scales,
    /// `f16 d`; value = d·(sc−32)·q with q in −4..3.
    Q3K,
    /// 256 elements: `f16 d, dmin`, 12 bytes of 6-bit scales/mins (as Q4_K), 32 bytes of fifth
    /// bits, 128 bytes of nibbles; value = d·sc·q − dmin·m.
    Q5K,
    /// 32 elements: `f16 d` + 16 bytes of nibbles indexing a fixed non-linear 16-value table.
    IQ4NL,
    /// 256 elements: `f16 d`, 6-bit scales of 8 sub-blocks (`u16` high bits, 4 bytes low
    /// bits), 128 bytes of IQ4_NL table indices; value = d·(ls−32)·table[q].
    IQ4XS,
    /// 32 elements: an E8M0 exponent byte + 16 bytes of FP4 (E2M1) codes; value =
    /// 2^(e−128)·table[q] (the table holds E2M1 values doubled).
    MXFP4,
    /// 256 elements: `f16 d`, 64 grid indices (4 magnitudes each), 8 words of 7-bit sign
    /// indices and a 4-bit scale per 32 elements; value = d·(2s+1)/4·±grid (`iq3.rs`).
    IQ3XXS,
    /// 256 elements: `f16 d`, 64 9-bit grid indices, one sign bit per element, 4-bit scales per
    /// 32 elements; value = d·(2s+1)·±grid (`iq3.rs`).
    IQ3S,
}

impl DType {
    /// All formats, in a fixed order (handy for tests and benches).
    pub const ALL: [DType; 18] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4K,
        DType::Q6K,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q2K,
        DType::Q3K,
        DType::Q5K,
        DType::IQ4NL,
        DType::IQ4XS,
        DType::MXFP4,
        DType::IQ3XXS,
        DType::IQ3S,
    ];

    /// The `ggml_type` enum value used in GGUF tensor infos.
    pub fn ggml_type_id(self) -> u32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::Q4_0 => 2,
            DType::Q8_0 => 8,
            DType::Q4K => 12,
            DType::Q6K => 14,
            DType::BF16 => 30,
            DType::Q4_1 => 3,
            DType::Q5_0 => 6,
            DType::Q5_1 => 7,
            DType::Q2K => 10,
            DType::Q3K => 11,
            DType::Q5K => 13,
            DType::IQ4NL => 20,
            DType::IQ4XS => 23,
            DType::MXFP4 => 39,
            DType::IQ3XXS => 18,
            DType::IQ3S => 21,
        }
    }

    /// Inverse of [`DType::ggml_type_id`]; `None` for ggml types this crate does not support.
    pub fn from_ggml_type_id(id: u32) -> Option<DType> {
        Some(match id {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::Q4_0,
            8 => DType::Q8_0,
            12 => DType::Q4K,
            14 => DType::Q6K,
            30 => DType::BF16,
            3 => DType::Q4_1,
            6 => DType::Q5_0,
            7 => DType::Q5_1,
            10 => DType::Q2K,
            11 => DType::Q3K,
            13 => DType::Q5K,
            20 => DType::IQ4NL,
            23 => DType::IQ4XS,
            39 => DType::MXFP4,
            18 => DType::IQ3XXS,
            21 => DType::IQ3S,
            _ => return None,
        })
    }

    /// Lower-case ggml name ("f32", "q4_k", ...).
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::Q8_0 => "q8_0",
            DType::Q4_0 => "q4_0",
            DType::Q4K => "q4_k",
            DType::Q6K => "q6_k",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q5_1 => "q5_1",
            DType::Q2K => "q2_k",
            DType::Q3K => "q3_k",
            DType::Q5K => "q5_k",
            DType::IQ4NL => "iq4_nl",
            DType::IQ4XS => "iq4_xs",
            DType::MXFP4 => "mxfp4",
            DType::IQ3XXS => "iq3_xxs",
            DType::IQ3S => "iq3_s",
        }
    }

    /// Number of elements one block encodes (1 for the float formats).
    pub fn block_elems(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::IQ4NL | DType::MXFP4 => 32,
            DType::Q4K | DType::Q6K | DType::Q2K | DType::Q3K | DType::Q5K | DType::IQ4XS | DType::IQ3XXS | DType::IQ3S => 256,
        }
    }

    /// Size in bytes of one block.
    pub fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4K => 144,
            DType::Q6K => 210,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q2K => 84,
            DType::Q3K => 110,
            DType::Q5K => 176,
            DType::IQ4NL => 18,
            DType::IQ4XS => 136,
            DType::MXFP4 => 17,
            DType::IQ3XXS => 98,
            DType::IQ3S => 110,
        }
    }

    /// Bytes of one row of `cols` elements; `None` if `cols` is not a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Option<usize> {
        if cols % self.block_elems() != 0 {
            return None;
        }
        (cols / self.block_elems()).checked_mul(self.block_bytes())
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Errors reported by the kernels' public entry points (they never panic on bad shapes
/// passed to the fallible constructors/quantizers).
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    /// `cols` is not a multiple of the format's block size.
    #[error("{dtype}: cols {cols} is not a multiple of the block size {block}")]
    BadCols {
        /// Format.
        dtype: DType,
        /// Offending column count.
        cols: usize,
        /// Required multiple.
        block: usize,
    },
    /// The byte buffer does not hold exactly `rows` rows.
    #[error("{dtype}: expected {expected} bytes for {rows}x{cols}, got {got}")]
    BadLength {
        /// Format.
        dtype: DType,
        /// Rows.
        rows: usize,
        /// Columns.
        cols: usize,
        /// Required length in bytes (or f32 elements for `quantize`).
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// `ENGRAM_SIMD` names an unknown kernel path or one this CPU cannot run.
    #[error("ENGRAM_SIMD={value}: {reason}")]
    ForcedPath {
        /// The variable's value.
        value: String,
        /// Why it was refused (and which paths this CPU has).
        reason: String,
    },
}

/// A row-major weight matrix `[rows = out features, cols = in features]` in `dtype` layout
/// (each row is `cols / block_elems` consecutive blocks).
///
/// `data` may be unaligned (it is often a slice of a memory-mapped GGUF or safetensors file);
/// the kernels only use unaligned loads on it.
#[derive(Clone, Copy, Debug)]
pub struct WeightMatrix<'a> {
    /// Storage format of `data`.
    pub dtype: DType,
    /// Number of rows (output features).
    pub rows: usize,
    /// Number of columns (input features).
    pub cols: usize,
    /// Raw block bytes, `rows * dtype.row_bytes(cols)` long.
    pub data: &'a [u8],
    /// The same matrix repacked for the AVX2 GEMV ([`crate::Packed`]), if the loader made
    /// one; the AVX2 path then reads it instead of `data` (bitwise the scalar reference's
    /// result), other paths ignore it. Must be the packing of `data`.
    pub packed: Option<&'a crate::Packed>,
}

impl<'a> WeightMatrix<'a> {
    /// Validates that `cols` is a whole number of blocks and `data` has exactly the right length.
    pub fn new(dtype: DType, rows: usize, cols: usize, data: &'a [u8]) -> Result<Self, KernelError> {
        let rb = dtype.row_bytes(cols).ok_or(KernelError::BadCols { dtype, cols, block: dtype.block_elems() })?;
        let expected = rb.saturating_mul(rows);
        if data.len() != expected {
            return Err(KernelError::BadLength { dtype, rows, cols, expected, got: data.len() });
        }
        Ok(WeightMatrix { dtype, rows, cols, data, packed: None })
    }

    /// This matrix with its AVX2 packing attached.
    ///
    /// # Panics
    /// If `p` does not have this matrix's format and shape.
    pub fn with_packed(self, p: &'a crate::Packed) -> Self {
        assert!(p.dtype() == self.dtype && p.rows() == self.rows && p.cols() == self.cols, "packing of another matrix");
        WeightMatrix { packed: Some(p), ..self }
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.dtype.row_bytes(self.cols).expect("validated in new")
    }

    /// The raw bytes of row `r`.
    pub fn row(&self, r: usize) -> &'a [u8] {
        let rb = self.row_bytes();
        &self.data[r * rb..(r + 1) * rb]
    }
}
