//! The ggml tensor type table.
//!
//! Owns the mapping from a ggml type id (as stored in a GGUF tensor info) to
//! its name and block geometry.  Every type is described by `block_elems`
//! (how many elements one block holds) and `block_bytes` (how many bytes one
//! block occupies); non-quantised types have `block_elems == 1`.
//!
//! Invariants: ids are unique, `block_elems >= 1`, `block_bytes >= 1`.  Sizes
//! follow ggml (`ggml/src/ggml.c` `type_traits`) and gguf-py's
//! `GGML_QUANT_SIZES`.  Ids the table does not know are rejected by the reader
//! and the writer (their sizes cannot be computed).

/// ggml type id of `F32`.
pub const GGML_TYPE_F32: u32 = 0;
/// ggml type id of `F16`.
pub const GGML_TYPE_F16: u32 = 1;
/// ggml type id of `Q4_0`.
pub const GGML_TYPE_Q4_0: u32 = 2;
/// ggml type id of `Q4_1`.
pub const GGML_TYPE_Q4_1: u32 = 3;
/// ggml type id of `Q5_0`.
pub const GGML_TYPE_Q5_0: u32 = 6;
/// ggml type id of `Q5_1`.
pub const GGML_TYPE_Q5_1: u32 = 7;
/// ggml type id of `Q8_0`.
pub const GGML_TYPE_Q8_0: u32 = 8;
/// ggml type id of `Q8_1`.
pub const GGML_TYPE_Q8_1: u32 = 9;
/// ggml type id of `Q2_K`.
pub const GGML_TYPE_Q2_K: u32 = 10;
/// ggml type id of `Q3_K`.
pub const GGML_TYPE_Q3_K: u32 = 11;
/// ggml type id of `Q4_K`.
pub const GGML_TYPE_Q4_K: u32 = 12;
/// ggml type id of `Q5_K`.
pub const GGML_TYPE_Q5_K: u32 = 13;
/// ggml type id of `Q6_K`.
pub const GGML_TYPE_Q6_K: u32 = 14;
/// ggml type id of `Q8_K`.
pub const GGML_TYPE_Q8_K: u32 = 15;
/// ggml type id of `I8`.
pub const GGML_TYPE_I8: u32 = 24;
/// ggml type id of `I16`.
pub const GGML_TYPE_I16: u32 = 25;
/// ggml type id of `I32`.
pub const GGML_TYPE_I32: u32 = 26;
/// ggml type id of `I64`.
pub const GGML_TYPE_I64: u32 = 27;
/// ggml type id of `F64`.
pub const GGML_TYPE_F64: u32 = 28;
/// ggml type id of `BF16`.
pub const GGML_TYPE_BF16: u32 = 30;

/// A ggml tensor type known to the reader: id, name and block geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType {
    /// The numeric id stored in GGUF tensor infos.
    pub id: u32,
    /// The ggml name, e.g. `"Q4_K"`.
    pub name: &'static str,
    /// Elements per block (1 for non-quantised types).
    pub block_elems: u64,
    /// Bytes per block.
    pub block_bytes: u64,
}

impl GgmlType {
    /// Bytes occupied by `n_elements` elements of this type, or `None` if
    /// `n_elements` is not a multiple of `block_elems` or the size overflows.
    pub fn bytes_for(&self, n_elements: u64) -> Option<u64> {
        if n_elements % self.block_elems != 0 {
            return None;
        }
        (n_elements / self.block_elems).checked_mul(self.block_bytes)
    }

    /// Whether this is a block-quantised type (`block_elems > 1`).
    pub fn is_quantized(&self) -> bool {
        self.block_elems > 1
    }
}

const QK_K: u64 = 256;

const fn t(id: u32, name: &'static str, block_elems: u64, block_bytes: u64) -> GgmlType {
    GgmlType { id, name, block_elems, block_bytes }
}

/// Every ggml type this crate can size, ordered by id.
pub const GGML_TYPES: &[GgmlType] = &[
    t(0, "F32", 1, 4),
    t(1, "F16", 1, 2),
    t(2, "Q4_0", 32, 2 + 16),
    t(3, "Q4_1", 32, 2 + 2 + 16),
    // 4 (Q4_2) and 5 (Q4_3) were removed from ggml.
    t(6, "Q5_0", 32, 2 + 4 + 16),
    t(7, "Q5_1", 32, 2 + 2 + 4 + 16),
    t(8, "Q8_0", 32, 2 + 32),
    // block_q8_1 is { ggml_half d; ggml_half s; int8_t qs[32]; }.
    t(9, "Q8_1", 32, 2 + 2 + 32),
    t(10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4),
    t(11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12),
    t(12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12),
    t(13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12),
    t(14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16),
    t(15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8),
    t(16, "IQ2_XXS", QK_K, 2 + QK_K / 4),
    t(17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32),
    t(18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8),
    t(19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16),
    t(20, "IQ4_NL", 32, 2 + 16),
    t(21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4),
    t(22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16),
    t(23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64),
    t(24, "I8", 1, 1),
    t(25, "I16", 1, 2),
    t(26, "I32", 1, 4),
    t(27, "I64", 1, 8),
    t(28, "F64", 1, 8),
    t(29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32),
    t(30, "BF16", 1, 2),
    // 31-33 (Q4_0_4_4 and friends) were removed from ggml.
    t(34, "TQ1_0", QK_K, 2 + 4 * 13),
    t(35, "TQ2_0", QK_K, 2 + 64),
    t(39, "MXFP4", 32, 1 + 16),
];

/// Looks up a ggml type by id; `None` for ids this crate cannot size.
pub fn ggml_type(id: u32) -> Option<GgmlType> {
    GGML_TYPES.iter().copied().find(|t| t.id == id)
}

/// Looks up a ggml type by its ggml name (case-insensitive, e.g. `"q4_k"`).
pub fn ggml_type_by_name(name: &str) -> Option<GgmlType> {
    GGML_TYPES.iter().copied().find(|t| t.name.eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_sizes() {
        let sz = |id| {
            let t = ggml_type(id).unwrap();
            (t.block_elems, t.block_bytes)
        };
        assert_eq!(sz(GGML_TYPE_F32), (1, 4));
        assert_eq!(sz(GGML_TYPE_F16), (1, 2));
        assert_eq!(sz(GGML_TYPE_BF16), (1, 2));
        assert_eq!(sz(GGML_TYPE_Q4_0), (32, 18));
        assert_eq!(sz(GGML_TYPE_Q4_1), (32, 20));
        assert_eq!(sz(GGML_TYPE_Q5_0), (32, 22));
        assert_eq!(sz(GGML_TYPE_Q5_1), (32, 24));
        assert_eq!(sz(GGML_TYPE_Q8_0), (32, 34));
        assert_eq!(sz(GGML_TYPE_Q8_1), (32, 36));
        assert_eq!(sz(GGML_TYPE_Q2_K), (256, 84));
        assert_eq!(sz(GGML_TYPE_Q3_K), (256, 110));
        assert_eq!(sz(GGML_TYPE_Q4_K), (256, 144));
        assert_eq!(sz(GGML_TYPE_Q5_K), (256, 176));
        assert_eq!(sz(GGML_TYPE_Q6_K), (256, 210));
        assert_eq!(sz(GGML_TYPE_Q8_K), (256, 292));
        assert!(ggml_type(4).is_none());
        assert!(ggml_type(u32::MAX).is_none());
    }

    #[test]
    fn table_is_consistent() {
        for (i, a) in GGML_TYPES.iter().enumerate() {
            assert!(a.block_elems >= 1 && a.block_bytes >= 1);
            for b in &GGML_TYPES[i + 1..] {
                assert!(a.id < b.id, "ids must be unique and sorted");
                assert_ne!(a.name, b.name);
            }
        }
        assert_eq!(ggml_type_by_name("q6_k").unwrap().id, GGML_TYPE_Q6_K);
    }

    #[test]
    fn bytes_for() {
        let q = ggml_type(GGML_TYPE_Q4_0).unwrap();
        assert_eq!(q.bytes_for(64), Some(36));
        assert_eq!(q.bytes_for(33), None);
        let f = ggml_type(GGML_TYPE_F32).unwrap();
        assert_eq!(f.bytes_for(u64::MAX), None);
    }
}
