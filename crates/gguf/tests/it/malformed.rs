use crate::common;
use common::*;
use engram_gguf::*;

#[test]
fn truncated_at_every_byte() {
    let bytes = sample_bytes();
    let g = Gguf::parse(&bytes).unwrap();
    let data_end = g.tensors.iter().map(|t| g.data_offset + t.offset + t.n_bytes).max().unwrap();
    for n in 0..data_end as usize {
        let r = Gguf::parse(&bytes[..n]);
        assert!(r.is_err(), "prefix of {n} bytes parsed");
    }
}

#[test]
fn truncation_messages_name_the_field() {
    let bytes = sample_bytes();
    assert!(err_of(&bytes[..2]).starts_with("truncated while reading magic"));
    assert!(err_of(&bytes[..20]).starts_with("truncated while reading metadata key/value count"));
    let mut r = Raw::header(3, 1, 0);
    r.str("weight").u32(2).u64(4);
    let e = err_of(&r.0);
    assert!(e.starts_with("truncated while reading tensor info #0 (\"weight\" dim 1)"), "{e}");
    let mut r = Raw::header(3, 0, 1);
    r.u64(10).bytes(b"abc");
    // One key/value needs at least 13 bytes; 11 are left.
    assert!(err_of(&r.0).contains("metadata key/value count 1 is impossible"));
    let mut r = Raw::header(3, 0, 1);
    r.str("general.name").u32(8).u64(100).bytes(b"short");
    let e = err_of(&r.0);
    assert!(e.starts_with("truncated while reading metadata key #0 (\"general.name\" value) (need 100 bytes"), "{e}");
}

#[test]
fn wrong_magic() {
    let mut bytes = sample_bytes();
    bytes[..4].copy_from_slice(b"glTF");
    assert_eq!(err_of(&bytes), "not a GGUF file (magic 0x46546c67, expected \"GGUF\")");
    assert!(matches!(Gguf::parse(&bytes), Err(GgufError::BadMagic { found: 0x46546c67 })));
}

#[test]
fn unsupported_versions() {
    let mut bytes = sample_bytes();
    for v in [0u32, 1, 4, u32::MAX] {
        bytes[4..8].copy_from_slice(&v.to_le_bytes());
        assert_eq!(err_of(&bytes), format!("unsupported GGUF version {v} (supported: 2, 3)"));
    }
    bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(err_of(&bytes).starts_with("big-endian GGUF files are not supported"));
}

#[test]
fn huge_counts_and_lengths() {
    // Each of these would allocate petabytes if trusted.
    let e = err_of(&Raw::header(3, u64::MAX, 0).0);
    assert!(e.starts_with("tensor count 18446744073709551615 is impossible"), "{e}");
    let e = err_of(&Raw::header(3, 0, u64::MAX).0);
    assert!(e.starts_with("metadata key/value count 18446744073709551615 is impossible"), "{e}");

    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX).bytes(&[0; 16]);
    let e = err_of(&r.0);
    assert!(e.starts_with("metadata key #0 (name) has length 18446744073709551615, more than the limit"), "{e}");

    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(1 << 40).bytes(&[0; 16]);
    assert!(err_of(&r.0).contains("has length 1099511627776, more than the limit"));

    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(4).u64(1 << 20).bytes(&[0; 64]);
    let e = err_of(&r.0);
    assert!(
        e.starts_with("truncated while reading metadata key #0 (\"k\" value) (array of 1048576 u32 elements needs at least 4194304 bytes"),
        "{e}"
    );
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(4).u64(u64::MAX).bytes(&[0; 64]);
    assert!(err_of(&r.0).contains("array of 18446744073709551615 elements, more than the limit"));

    // A tower of nested arrays is cut off, not a stack overflow.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9);
    for _ in 0..10_000 {
        r.u32(9).u64(1);
    }
    assert!(err_of(&r.0).contains("nests arrays more than 8 deep"));

    let mut r = Raw::header(3, 1, 0);
    r.str("t").u32(u32::MAX).bytes(&[0; 64]);
    assert!(err_of(&r.0).contains("tensor \"t\": has 4294967295 dimensions"));

    // Element count overflow.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[u64::MAX, 3], GGML_TYPE_F32, 0).data(32, 64);
    assert!(err_of(&r.0).contains("element count of shape [18446744073709551615, 3] overflows"));
    // Byte count overflow.
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[1 << 62], GGML_TYPE_F32, 0).data(32, 64);
    assert!(err_of(&r.0).contains("overflows"));
}

#[test]
fn unknown_value_type_and_bad_values() {
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u64(0);
    assert_eq!(err_of(&r.0), "metadata key #0 (\"k\" value) has unknown value type 13");
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(77).u64(0);
    assert!(err_of(&r.0).contains("array with unknown element type 77"));
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(7).bytes(&[2, 0, 0, 0]);
    assert!(err_of(&r.0).contains("bool with invalid byte 2"));
    let mut r = Raw::header(3, 0, 1);
    r.u64(2).bytes(&[0xff, 0xfe]).u32(0).bytes(&[0]);
    assert!(err_of(&r.0).contains("metadata key #0 (name) is not valid UTF-8"));
    let mut r = Raw::header(3, 0, 2);
    r.str("k").u32(0).bytes(&[1]).str("k").u32(0).bytes(&[2]);
    assert_eq!(err_of(&r.0), "metadata key \"k\" appears more than once");
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(4).u32(24);
    assert!(err_of(&r.0).contains("alignment 24 is not a power of two"));
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(8).str("32");
    assert_eq!(err_of(&r.0), "metadata key \"general.alignment\" has type string, expected an integer");
}

#[test]
fn tensor_data_out_of_bounds() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("blk.0.attn_q.weight", &[16], GGML_TYPE_F32, 0).data(32, 63);
    let len = r.0.len();
    assert_eq!(
        err_of(&r.0),
        format!("tensor \"blk.0.attn_q.weight\" data [offset 96, 64 bytes] lies past the end of the file (size {len})",)
    );
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[1], GGML_TYPE_F32, u64::MAX - 31).data(32, 64);
    assert!(err_of(&r.0).contains("lies past the end of the file"));
}

#[test]
fn misaligned_offset() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("t", &[1], GGML_TYPE_F32, 4).data(32, 64);
    assert_eq!(err_of(&r.0), "tensor \"t\": data offset 4 is not a multiple of the alignment 32");
}

#[test]
fn unknown_ggml_type() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("weird", &[32], 4, 0).data(32, 64);
    assert_eq!(err_of(&r.0), "tensor \"weird\" has unknown ggml type 4");
    assert!(matches!(Gguf::parse(&r.0), Err(GgufError::UnknownGgmlType { id: 4, .. })));
}

#[test]
fn row_not_multiple_of_block() {
    let mut r = Raw::header(3, 1, 0);
    r.tensor("q", &[16, 4], GGML_TYPE_Q4_0, 0).data(32, 64);
    assert_eq!(err_of(&r.0), "tensor \"q\": row length 16 (dims [16, 4]) is not a multiple of the Q4_0 block size 32");
}

#[test]
fn duplicate_tensor_name() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("t", &[8], GGML_TYPE_F32, 0).tensor("t", &[8], GGML_TYPE_F32, 32).data(32, 64);
    assert_eq!(err_of(&r.0), "tensor \"t\": name appears more than once");
}

#[test]
fn overlapping_tensors() {
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[16], GGML_TYPE_F32, 0).tensor("b", &[8], GGML_TYPE_F32, 32).data(32, 64);
    assert_eq!(err_of(&r.0), "tensor \"b\": data [offset 32, 32 bytes] overlaps tensor \"a\" [offset 0, 64 bytes]");
    // Adjacent is fine, order in the header need not match order in the data.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], GGML_TYPE_F32, 32).tensor("b", &[8], GGML_TYPE_F32, 0).data(32, 64);
    let g = Gguf::parse(&r.0).unwrap();
    assert_eq!(g.tensor("a").unwrap().offset, 32);
}

#[test]
fn typed_getters_report_key() {
    let g = Gguf::parse(&sample_bytes()).unwrap();
    let e = g.get_u64("general.architecture").unwrap_err();
    assert_eq!(e.to_string(), "metadata key \"general.architecture\" has type string, expected a non-negative integer");
    assert_eq!(
        g.get_u64("i8").unwrap_err().to_string(),
        "metadata key \"i8\" has type i8 (negative value -7), expected a non-negative integer"
    );
    assert_eq!(g.get_u64("u16").unwrap(), 65535);
    assert_eq!(g.get_u64_opt("nope").unwrap(), None);
    assert_eq!(g.get_u64("nope").unwrap_err().to_string(), "metadata key \"nope\" is missing");
    assert_eq!(
        g.get_str_array_opt("scores").unwrap_err().to_string(),
        "metadata key \"scores\" has type array of f32, expected an array of strings"
    );
    assert!(g.get_f32("u8").is_err());
    assert_eq!(g.get_f32("f64").unwrap(), -2.25);
    assert!(g.get_bool_opt("u8").is_err());
    assert!(g.get_i32_array_opt("tokens").is_err());
    assert_eq!(g.get_i32_array_opt("empty").unwrap(), Some(vec![]));
}

/// An array's length field, checked only against the bytes present, let a 64 MiB file
/// holding one `u8` array of 2^26 elements allocate 2 GiB (a one-byte element decodes to a
/// 32-byte `Value`); the fuzz target found it under `-malloc_limit_mb=1024`.  All arrays
/// now share one budget of elements, and the error names the key that exceeds it.
#[test]
fn array_length_fields_share_one_element_budget() {
    let n = MAX_METADATA_ELEMENTS + 1;
    let mut r = Raw::header(3, 0, 1);
    r.str("tokenizer.ggml.token_type").u32(9).u32(0).u64(n);
    r.0.resize(r.0.len() + n as usize, 1);
    let e = err_of(&r.0);
    assert!(
        e.starts_with(
            "metadata key #0 (\"tokenizer.ggml.token_type\" value) is an array of 16777217 elements, \
             which takes the metadata's arrays past the limit of 16777216 elements in all"
        ),
        "{e}"
    );

    // Each array fits alone; together they do not, and the second one is named.
    let mut r = Raw::header(3, 0, 2);
    r.str("a").u32(9).u32(7).u64(1000).bytes(&[0; 1000]);
    let n = MAX_METADATA_ELEMENTS - 999;
    r.str("b").u32(9).u32(0).u64(n);
    r.0.resize(r.0.len() + n as usize, 0);
    let e = err_of(&r.0);
    assert!(e.starts_with("metadata key #1 (\"b\" value) is an array of 16776217 elements, which takes"), "{e}");

    // Nested arrays count at every level.
    let mut r = Raw::header(3, 0, 1);
    r.str("nested").u32(9).u32(9).u64(2);
    r.u32(0).u64(3).bytes(&[1, 2, 3]);
    r.u32(0).u64(MAX_METADATA_ELEMENTS - 4);
    r.0.resize(r.0.len() + (MAX_METADATA_ELEMENTS - 4) as usize, 0);
    let e = err_of(&r.0);
    assert!(e.starts_with("metadata key #0 (\"nested\" value) element #1 is an array of 16777212 elements, which takes"), "{e}");
}
