//! A GGUF metadata reader for the tests: the key/value section of a file (tensors are
//! not read), and the `GgufVocab` its `tokenizer.ggml.*` keys describe — as the model
//! loader fills it, which the tokenizer crate cannot depend on.

use engram_tokenizer::GgufVocab;
use std::collections::HashMap;
use std::io::{BufReader, Read};
use std::path::Path;

/// A GGUF metadata value.
#[derive(Debug, Clone)]
pub enum Value {
    Int(i64),
    F32(f32),
    Bool(bool),
    Str(String),
    Arr(Vec<Value>),
}

fn rd<const N: usize>(r: &mut impl Read) -> [u8; N] {
    let mut b = [0u8; N];
    r.read_exact(&mut b).expect("GGUF truncated");
    b
}

fn string(r: &mut impl Read) -> String {
    let n = u64::from_le_bytes(rd(r)) as usize;
    let mut b = vec![0u8; n];
    r.read_exact(&mut b).expect("GGUF truncated");
    String::from_utf8_lossy(&b).into_owned()
}

fn value(r: &mut impl Read, ty: u32) -> Value {
    match ty {
        0 => Value::Int(rd::<1>(r)[0] as i64),
        1 => Value::Int(rd::<1>(r)[0] as i8 as i64),
        2 => Value::Int(u16::from_le_bytes(rd(r)) as i64),
        3 => Value::Int(i16::from_le_bytes(rd(r)) as i64),
        4 => Value::Int(u32::from_le_bytes(rd(r)) as i64),
        5 => Value::Int(i32::from_le_bytes(rd(r)) as i64),
        6 => Value::F32(f32::from_le_bytes(rd(r))),
        7 => Value::Bool(rd::<1>(r)[0] != 0),
        8 => Value::Str(string(r)),
        9 => {
            let et = u32::from_le_bytes(rd(r));
            let n = u64::from_le_bytes(rd(r));
            Value::Arr((0..n).map(|_| value(r, et)).collect())
        }
        10 => Value::Int(u64::from_le_bytes(rd(r)) as i64),
        11 => Value::Int(i64::from_le_bytes(rd(r))),
        12 => Value::F32(f64::from_le_bytes(rd(r)) as f32),
        t => panic!("GGUF value type {t}"),
    }
}

/// The metadata of a GGUF file.
pub fn read_meta(path: &Path) -> HashMap<String, Value> {
    let mut r = BufReader::new(std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())));
    assert_eq!(&rd::<4>(&mut r), b"GGUF", "{}", path.display());
    let _version = u32::from_le_bytes(rd(&mut r));
    let _n_tensors = u64::from_le_bytes(rd(&mut r));
    let n_kv = u64::from_le_bytes(rd(&mut r));
    (0..n_kv)
        .map(|_| {
            let k = string(&mut r);
            let ty = u32::from_le_bytes(rd(&mut r));
            (k, value(&mut r, ty))
        })
        .collect()
}

/// The vocabulary a GGUF file's `tokenizer.ggml.*` keys describe.
pub fn read_vocab(path: &Path) -> GgufVocab {
    let m = read_meta(path);
    let s = |k: &str| match m.get(k) {
        Some(Value::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let id = |k: &str| match m.get(k) {
        Some(Value::Int(i)) => Some(*i as u32),
        _ => None,
    };
    let b = |k: &str| match m.get(k) {
        Some(Value::Bool(b)) => Some(*b),
        _ => None,
    };
    let arr = |k: &str| match m.get(k) {
        Some(Value::Arr(a)) => Some(a.clone()),
        _ => None,
    };
    let strs = |k: &str| {
        arr(k).map(|a| {
            a.into_iter()
                .map(|v| match v {
                    Value::Str(s) => s,
                    v => panic!("{k}: {v:?}"),
                })
                .collect::<Vec<_>>()
        })
    };
    GgufVocab {
        model: s("tokenizer.ggml.model").expect("tokenizer.ggml.model"),
        pre: s("tokenizer.ggml.pre"),
        tokens: strs("tokenizer.ggml.tokens").expect("tokenizer.ggml.tokens"),
        scores: arr("tokenizer.ggml.scores").map(|a| {
            a.into_iter()
                .map(|v| match v {
                    Value::F32(f) => f,
                    v => panic!("score {v:?}"),
                })
                .collect()
        }),
        token_types: arr("tokenizer.ggml.token_type").map(|a| {
            a.into_iter()
                .map(|v| match v {
                    Value::Int(i) => i as i32,
                    v => panic!("token type {v:?}"),
                })
                .collect()
        }),
        merges: strs("tokenizer.ggml.merges"),
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_id: id("tokenizer.ggml.eos_token_id"),
        eot_id: id("tokenizer.ggml.eot_token_id"),
        unk_id: id("tokenizer.ggml.unknown_token_id"),
        pad_id: id("tokenizer.ggml.padding_token_id"),
        add_bos: b("tokenizer.ggml.add_bos_token"),
        add_eos: b("tokenizer.ggml.add_eos_token"),
        chat_template: s("tokenizer.chat_template"),
        add_space_prefix: b("tokenizer.ggml.add_space_prefix"),
    }
}
