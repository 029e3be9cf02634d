use crate::common;
use common::*;
use engram_gguf::*;

#[test]
fn round_trip_all_value_types_and_tensors() {
    let w = sample_writer();
    let bytes = sample_bytes();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.version, 3);
    assert_eq!(g.alignment, 32);
    assert_eq!(g.data_offset % 32, 0);
    assert_eq!(bytes.len() % 32, 0, "data is padded after each tensor");

    assert_eq!(g.get("u8"), Some(&Value::U8(7)));
    assert_eq!(g.get("i8"), Some(&Value::I8(-7)));
    assert_eq!(g.get("u16"), Some(&Value::U16(65535)));
    assert_eq!(g.get("i16"), Some(&Value::I16(-300)));
    assert_eq!(g.get("u32"), Some(&Value::U32(4_000_000_000)));
    assert_eq!(g.get("i32"), Some(&Value::I32(-2_000_000_000)));
    assert_eq!(g.get("u64"), Some(&Value::U64(u64::MAX)));
    assert_eq!(g.get("i64"), Some(&Value::I64(i64::MIN)));
    assert_eq!(g.get("f32"), Some(&Value::F32(1.5)));
    assert_eq!(g.get("f64"), Some(&Value::F64(-2.25)));
    assert_eq!(g.get("bool"), Some(&Value::Bool(true)));
    assert_eq!(g.get_str("unicode").unwrap(), "héllo ✓");
    assert_eq!(g.get_str_array_opt("tokens").unwrap().unwrap(), vec!["a", "bc", ""]);
    assert_eq!(g.get_f32_array_opt("scores").unwrap().unwrap(), vec![0.5, -1.0]);
    assert_eq!(g.get_i32_array_opt("types").unwrap().unwrap(), vec![1, 2, 3]);
    assert_eq!(g.get("nested"), Some(&Value::Array(vec![Value::from(vec![1u8, 2]), Value::Array(vec![]), Value::from(vec!["x"]),])));
    assert_eq!(g.get("empty"), Some(&Value::Array(vec![])));
    assert_eq!(g.metadata.first().unwrap().0, "general.architecture", "order kept");
    assert_eq!(g.get("absent"), None);

    let names: Vec<_> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["f32", "f16", "q8", "q4k", "bf16"]);
    let q8 = g.tensor("q8").unwrap();
    assert_eq!(q8.dims, vec![64, 2]);
    assert_eq!(q8.ggml_type, GGML_TYPE_Q8_0);
    assert_eq!(q8.n_bytes, 136);
    assert_eq!(q8.n_elements(), 128);
    for t in &g.tensors {
        assert_eq!(t.offset % 32, 0, "{} aligned", t.name);
    }
    let f32t = g.tensor("f32").unwrap();
    let start = (g.data_offset + f32t.offset) as usize;
    assert_eq!(&bytes[start..start + 24], &(0..24).collect::<Vec<u8>>()[..]);

    // Writing the same writer twice is deterministic.
    let mut again = Vec::new();
    w.write_to(&mut again).unwrap();
    assert_eq!(again, bytes);
}

#[test]
fn custom_alignment_respected() {
    let mut w = GgufWriter::new();
    w.add("general.alignment", Value::U32(64));
    w.add_tensor("a", &[3], GGML_TYPE_F32, vec![1; 12]).unwrap();
    w.add_tensor("b", &[70], GGML_TYPE_I8, vec![2; 70]).unwrap();
    w.add_tensor("c", &[1], GGML_TYPE_F64, vec![3; 8]).unwrap();
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.alignment, 64);
    assert_eq!(g.data_offset % 64, 0);
    let offs: Vec<u64> = g.tensors.iter().map(|t| t.offset).collect();
    assert_eq!(offs, [0, 64, 192]);
}

#[test]
fn writer_rejects_bad_input() {
    let mut w = GgufWriter::new();
    let e = w.add_tensor("t", &[4], GGML_TYPE_F32, vec![0; 15]).unwrap_err();
    assert_eq!(e.to_string(), "tensor \"t\": data is 15 bytes, but shape [4] of type F32 needs 16");
    let e = w.add_tensor("t", &[4], 99, vec![]).unwrap_err();
    assert_eq!(e.to_string(), "tensor \"t\" has unknown ggml type 99");
    let e = w.add_tensor("t", &[33], GGML_TYPE_Q4_0, vec![]).unwrap_err();
    assert!(e.to_string().contains("not a multiple of the Q4_0 block size 32"), "{e}");
    let e = w.add_tensor("t", &[1; 9], GGML_TYPE_F32, vec![0; 4]).unwrap_err();
    assert!(e.to_string().contains("9 dimensions"), "{e}");
    w.add_tensor("t", &[1], GGML_TYPE_F32, vec![0; 4]).unwrap();
    let e = w.add_tensor("t", &[1], GGML_TYPE_F32, vec![0; 4]).unwrap_err();
    assert_eq!(e.to_string(), "tensor \"t\": name appears more than once");

    w.add("mixed", Value::Array(vec![Value::U8(1), Value::from("x")]));
    let e = w.write_to(Vec::new()).unwrap_err();
    assert!(e.to_string().contains("metadata key \"mixed\": array is not homogeneous"), "{e}");
    w.add("mixed", Value::U8(1)); // replaces in place
    w.add("general.alignment", Value::U32(48));
    let e = w.write_to(Vec::new()).unwrap_err();
    assert!(e.to_string().contains("not a power of two"), "{e}");
    w.add("general.alignment", Value::U64(16));
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert_eq!(g.alignment, 16);
    assert_eq!(g.metadata.len(), 2);
}

#[test]
fn zero_tensors_and_version_2() {
    let mut bytes = Vec::new();
    GgufWriter::new().write_to(&mut bytes).unwrap();
    let g = Gguf::parse(&bytes).unwrap();
    assert!(g.tensors.is_empty() && g.metadata.is_empty());
    // A version-2 file has the same layout.
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(Gguf::parse(&bytes).unwrap().version, 2);
}
