//! Shared helpers for the integration tests.
#![allow(dead_code)]

use engram_gguf::*;

/// A small but varied valid file: all value types, nested arrays, several
/// tensors of different types.
pub fn sample_writer() -> GgufWriter {
    let mut w = GgufWriter::new();
    w.add("general.architecture", Value::from("llama"));
    w.add("u8", Value::U8(7));
    w.add("i8", Value::I8(-7));
    w.add("u16", Value::U16(65535));
    w.add("i16", Value::I16(-300));
    w.add("u32", Value::U32(4_000_000_000));
    w.add("i32", Value::I32(-2_000_000_000));
    w.add("u64", Value::U64(u64::MAX));
    w.add("i64", Value::I64(i64::MIN));
    w.add("f32", Value::F32(1.5));
    w.add("f64", Value::F64(-2.25));
    w.add("bool", Value::Bool(true));
    w.add("unicode", Value::from("héllo ✓"));
    w.add("tokens", Value::from(vec!["a", "bc", ""]));
    w.add("scores", Value::from(vec![0.5f32, -1.0]));
    w.add("types", Value::from(vec![1i32, 2, 3]));
    w.add("nested", Value::Array(vec![Value::from(vec![1u8, 2]), Value::Array(vec![]), Value::from(vec!["x"])]));
    w.add("empty", Value::Array(vec![]));
    w.add_tensor("f32", &[3, 2], GGML_TYPE_F32, (0..24).collect()).unwrap();
    w.add_tensor("f16", &[5], GGML_TYPE_F16, vec![0xAB; 10]).unwrap();
    w.add_tensor("q8", &[64, 2], GGML_TYPE_Q8_0, vec![0x11; 4 * 34]).unwrap();
    w.add_tensor("q4k", &[256], GGML_TYPE_Q4_K, vec![0x22; 144]).unwrap();
    w.add_tensor("bf16", &[1, 1, 1, 3], GGML_TYPE_BF16, vec![0x33; 6]).unwrap();
    w
}

pub fn sample_bytes() -> Vec<u8> {
    let mut out = Vec::new();
    sample_writer().write_to(&mut out).unwrap();
    out
}

/// Hand-assembles GGUF bytes, for building malformed files.
#[derive(Default)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    pub fn header(version: u32, tensors: u64, kvs: u64) -> Raw {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(tensors).u64(kvs);
        r
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64).bytes(s.as_bytes())
    }
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for d in dims {
            self.u64(*d);
        }
        self.u32(ty).u64(offset)
    }
    /// Pads to `align` and appends `n` data bytes.
    pub fn data(&mut self, align: usize, n: usize) -> &mut Self {
        while self.0.len() % align != 0 {
            self.0.push(0);
        }
        self.0.resize(self.0.len() + n, 0x5a);
        self
    }
}

pub fn err_of(bytes: &[u8]) -> String {
    match Gguf::parse(bytes) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}
