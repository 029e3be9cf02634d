//! The validating GGUF parser.
//!
//! Owns [`Gguf`] (the parsed header), [`TensorInfo`] and [`Gguf::parse`],
//! which works on a byte slice holding a whole file.  The parser never
//! panics, never overflows and never allocates more than a small multiple of
//! the input size: every length and count is checked against the bytes that
//! remain before anything is allocated, sizes use checked arithmetic, and
//! nesting depth is capped.  Array elements, which decode to 32 bytes each
//! however small on disk, share one budget for the whole header
//! ([`MAX_METADATA_ELEMENTS`]), so the decoded metadata stays under 512 MiB
//! plus a small multiple of the input size.
//!
//! Invariants of a `Gguf` returned by `parse` (relied on by
//! [`crate::GgufFile::tensor_data`]):
//! * `version` is 2 or 3; `alignment` is a power of two; `data_offset` is the
//!   end of the header rounded up to `alignment`;
//! * metadata keys are unique; every value type is known; arrays are
//!   homogeneous;
//! * tensor names are unique; every tensor has 0..=[`MAX_DIMS`] dims, a known
//!   ggml type, a row length (`dims[0]`) that is a whole number of blocks, a
//!   correct `n_bytes`, an `offset` that is a multiple of `alignment`, and
//!   data `[data_offset + offset, +n_bytes)` inside the input;
//! * tensor data ranges do not overlap.

use std::collections::HashSet;

use crate::error::{GgufError, Result};
use crate::types::ggml_type;
use crate::value::*;

/// `"GGUF"` read as a little-endian u32.
pub const GGUF_MAGIC: u32 = u32::from_le_bytes(*b"GGUF");
/// The version the writer produces.
pub const GGUF_VERSION: u32 = 3;
/// Alignment used when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 8;
/// Longest metadata key or tensor name, in bytes.
pub const MAX_NAME_LEN: u64 = 64 * 1024;
/// Longest string value, in bytes.
pub const MAX_STRING_LEN: u64 = 64 * 1024 * 1024;
/// Most elements in one array.
pub const MAX_ARRAY_LEN: u64 = 1 << 26;
/// Most array elements in all metadata values together (an array nested in an array
/// counts at both levels).  A decoded element is a 32-byte [`Value`] however few bytes
/// it takes on disk (one for `u8`/`bool`), so a header's arrays cost at most 512 MiB
/// whatever their length fields say; the largest real vocabularies (about 262k tokens,
/// with their scores, types and merges) use about 1M.
pub const MAX_METADATA_ELEMENTS: u64 = 1 << 24;
/// Deepest nesting of arrays inside arrays (a top-level array is depth 1).
pub const MAX_ARRAY_DEPTH: u32 = 8;
/// Largest accepted `general.alignment`.
pub const MAX_ALIGNMENT: u64 = 1 << 30;

/// One tensor's header entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the innermost (row length).
    pub dims: Vec<u64>,
    /// ggml type id (see [`crate::ggml_type`]).
    pub ggml_type: u32,
    /// Offset of the data relative to the data section start.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements (product of `dims`; 1 for zero dims).  Never
    /// overflows for a `TensorInfo` produced by the parser.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().fold(1u64, |a, &d| a.saturating_mul(d))
    }
}

/// A parsed GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct Gguf {
    /// File format version (2 or 3).
    pub version: u32,
    /// Tensor data alignment (`general.alignment`, default 32).
    pub alignment: u64,
    /// Metadata in file order; keys are unique.
    pub metadata: Vec<(String, Value)>,
    /// Tensor infos in file order; names are unique.
    pub tensors: Vec<TensorInfo>,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    /// Array elements decoded so far, against [`MAX_METADATA_ELEMENTS`].
    elements: u64,
}

type What<'w> = &'w dyn Fn() -> String;

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: What) -> Result<&'a [u8]> {
        let rem = self.remaining();
        if n > rem {
            return Err(GgufError::Truncated { what: format!("{} (need {n} bytes at offset {}, {rem} left)", what(), self.pos) });
        }
        let n = n as usize; // n <= rem <= usize::MAX
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: What) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: What) -> Result<u32> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: What) -> Result<u64> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, max: u64, what: What) -> Result<String> {
        let len = self.u64(&|| format!("{} length", what()))?;
        if len > max {
            return Err(GgufError::Malformed(format!("{} has length {len}, more than the limit of {max} bytes", what())));
        }
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(e) => Err(GgufError::Malformed(format!("{} is not valid UTF-8 ({e})", what()))),
        }
    }

    fn value(&mut self, ty: u32, depth: u32, what: What) -> Result<Value> {
        Ok(match ty {
            GGUF_TYPE_UINT8 => Value::U8(self.array::<1>(what)?[0]),
            GGUF_TYPE_INT8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            GGUF_TYPE_UINT16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            GGUF_TYPE_INT16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            GGUF_TYPE_UINT32 => Value::U32(self.u32(what)?),
            GGUF_TYPE_INT32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            GGUF_TYPE_UINT64 => Value::U64(self.u64(what)?),
            GGUF_TYPE_INT64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            GGUF_TYPE_FLOAT32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            GGUF_TYPE_FLOAT64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            GGUF_TYPE_BOOL => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(GgufError::Malformed(format!("{} is a bool with invalid byte {b} (expected 0 or 1)", what()))),
            },
            GGUF_TYPE_STRING => Value::String(self.string(MAX_STRING_LEN, what)?),
            GGUF_TYPE_ARRAY => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::Malformed(format!("{} nests arrays more than {MAX_ARRAY_DEPTH} deep", what())));
                }
                let elem_ty = self.u32(&|| format!("{} array element type", what()))?;
                let Some(min) = min_encoded_size(elem_ty) else {
                    return Err(GgufError::Malformed(format!("{} is an array with unknown element type {elem_ty}", what())));
                };
                let count = self.u64(&|| format!("{} array length", what()))?;
                if count > MAX_ARRAY_LEN {
                    return Err(GgufError::Malformed(format!(
                        "{} is an array of {count} elements, more than the limit of {MAX_ARRAY_LEN}",
                        what()
                    )));
                }
                let rem = self.remaining();
                // count <= 2^26 and min <= 12, so this cannot overflow.
                if count * min > rem {
                    return Err(GgufError::Truncated {
                        what: format!(
                            "{} (array of {count} {} elements needs at least {} bytes, {rem} left)",
                            what(),
                            value_type_name(elem_ty).unwrap_or("?"),
                            count * min
                        ),
                    });
                }
                // The bytes present bound `count`, but a 1-byte element becomes a 32-byte
                // `Value`: without a budget for the whole header, a file of N bytes of
                // `u8` arrays would allocate 32 N bytes here.  elements <= 2^24 before
                // this add and count <= 2^26, so it cannot overflow.
                self.elements += count;
                if self.elements > MAX_METADATA_ELEMENTS {
                    return Err(GgufError::Malformed(format!(
                        "{} is an array of {count} elements, which takes the metadata's arrays past the limit of {MAX_METADATA_ELEMENTS} elements in all",
                        what()
                    )));
                }
                let mut items = Vec::with_capacity(count as usize);
                for i in 0..count {
                    let ew = || format!("{} element #{i}", what());
                    items.push(self.value(elem_ty, depth + 1, &ew)?);
                }
                Value::Array(items)
            }
            other => return Err(GgufError::Malformed(format!("{} has unknown value type {other}", what()))),
        })
    }
}

fn align_up(x: u64, align: u64) -> Option<u64> {
    // align is a power of two.
    x.checked_add(align - 1).map(|v| v & !(align - 1))
}

impl Gguf {
    /// Parses and validates a whole GGUF file held in `bytes`.
    ///
    /// Errors name the field being read; they carry no path (see
    /// [`crate::GgufFile::open`] for that).
    pub fn parse(bytes: &[u8]) -> Result<Gguf> {
        let mut c = Cursor { buf: bytes, pos: 0, elements: 0 };
        let magic = c.u32(&|| "magic".to_string())?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = c.u32(&|| "version".to_string())?;
        match version {
            2 | 3 => {}
            v if v & 0xffff == 0 && matches!(v.swap_bytes(), 2 | 3) => return Err(GgufError::BigEndian(v)),
            v => return Err(GgufError::UnsupportedVersion(v)),
        }
        let tensor_count = c.u64(&|| "tensor count".to_string())?;
        let kv_count = c.u64(&|| "metadata key/value count".to_string())?;

        // Smallest encodings: key (8-byte length) + type (4) + 1-byte value;
        // tensor info: name length (8) + n_dims (4) + type (4) + offset (8).
        const MIN_KV: u64 = 8 + 4 + 1;
        const MIN_TI: u64 = 8 + 4 + 4 + 8;
        let rem = c.remaining();
        if kv_count > rem / MIN_KV {
            return Err(GgufError::Malformed(format!(
                "metadata key/value count {kv_count} is impossible: {rem} bytes left hold at most {}",
                rem / MIN_KV
            )));
        }
        if tensor_count > rem / MIN_TI {
            return Err(GgufError::Malformed(format!(
                "tensor count {tensor_count} is impossible: {rem} bytes left hold at most {}",
                rem / MIN_TI
            )));
        }

        let mut metadata: Vec<(String, Value)> = Vec::with_capacity(kv_count as usize);
        let mut keys = HashSet::with_capacity(kv_count as usize);
        for i in 0..kv_count {
            let key = c.string(MAX_NAME_LEN, &|| format!("metadata key #{i} (name)"))?;
            let ty = c.u32(&|| format!("metadata key #{i} (\"{key}\" value type)"))?;
            let value = c.value(ty, 0, &|| format!("metadata key #{i} (\"{key}\" value)"))?;
            if !keys.insert(key.clone()) {
                return Err(GgufError::Malformed(format!("metadata key \"{key}\" appears more than once")));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some((_, v)) => {
                let a = v.as_u64().ok_or_else(|| GgufError::MetadataType {
                    key: ALIGNMENT_KEY.to_string(),
                    found: v.describe(),
                    expected: "an integer",
                })?;
                if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                    return Err(GgufError::InvalidValue {
                        key: ALIGNMENT_KEY.to_string(),
                        reason: format!("alignment {a} is not a power of two between 1 and {MAX_ALIGNMENT}"),
                    });
                }
                a
            }
        };

        let mut tensors: Vec<TensorInfo> = Vec::with_capacity(tensor_count as usize);
        for i in 0..tensor_count {
            let name = c.string(MAX_NAME_LEN, &|| format!("tensor info #{i} (name)"))?;
            let n_dims = c.u32(&|| format!("tensor info #{i} (\"{name}\" n_dims)"))?;
            if n_dims as usize > MAX_DIMS {
                return Err(GgufError::InvalidTensor {
                    tensor: name,
                    reason: format!("has {n_dims} dimensions, more than the limit of {MAX_DIMS}"),
                });
            }
            let mut dims = Vec::with_capacity(n_dims as usize);
            for d in 0..n_dims {
                dims.push(c.u64(&|| format!("tensor info #{i} (\"{name}\" dim {d})"))?);
            }
            let ggml_type = c.u32(&|| format!("tensor info #{i} (\"{name}\" type)"))?;
            let offset = c.u64(&|| format!("tensor info #{i} (\"{name}\" offset)"))?;
            tensors.push(TensorInfo { name, dims, ggml_type, offset, n_bytes: 0 });
        }

        let header_end = c.pos as u64;
        let data_offset =
            align_up(header_end, alignment).ok_or_else(|| GgufError::Malformed("data section offset overflows".to_string()))?;
        let file_size = bytes.len() as u64;

        let mut names = HashSet::with_capacity(tensors.len());
        for t in &mut tensors {
            if !names.insert(t.name.as_str()) {
                return Err(GgufError::InvalidTensor { tensor: t.name.clone(), reason: "name appears more than once".to_string() });
            }
            t.n_bytes = tensor_n_bytes(&t.name, &t.dims, t.ggml_type)?;
            if t.offset % alignment != 0 {
                return Err(GgufError::InvalidTensor {
                    tensor: t.name.clone(),
                    reason: format!("data offset {} is not a multiple of the alignment {alignment}", t.offset),
                });
            }
            let start = data_offset.checked_add(t.offset);
            let end = start.and_then(|s| s.checked_add(t.n_bytes));
            if end.map_or(true, |e| e > file_size) {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    offset: start.unwrap_or(u64::MAX),
                    n_bytes: t.n_bytes,
                    file_size,
                });
            }
        }

        // Overlap check: sort by offset, each must start at or after the end
        // of the previous one (ranges are in bounds, so no overflow).
        let mut order: Vec<&TensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
        order.sort_by_key(|t| t.offset);
        for w in order.windows(2) {
            if w[1].offset < w[0].offset + w[0].n_bytes {
                return Err(GgufError::InvalidTensor {
                    tensor: w[1].name.clone(),
                    reason: format!(
                        "data [offset {}, {} bytes] overlaps tensor \"{}\" [offset {}, {} bytes]",
                        w[1].offset, w[1].n_bytes, w[0].name, w[0].offset, w[0].n_bytes
                    ),
                });
            }
        }

        Ok(Gguf { version, alignment, metadata, tensors, data_offset })
    }

    /// The metadata value for `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The tensor info named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Like [`Gguf::get_u64_opt`] but a missing key is an error.
    pub fn get_u64(&self, key: &str) -> Result<u64> {
        self.get_u64_opt(key)?.ok_or_else(|| missing(key))
    }

    /// A non-negative integer of any width; `None` if the key is absent.
    pub fn get_u64_opt(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    /// Like [`Gguf::get_f32_opt`] but a missing key is an error.
    pub fn get_f32(&self, key: &str) -> Result<f32> {
        self.get_f32_opt(key)?.ok_or_else(|| missing(key))
    }

    /// An `F32` or `F64`; `None` if the key is absent.
    pub fn get_f32_opt(&self, key: &str) -> Result<Option<f32>> {
        self.typed(key, "a float", Value::as_f32)
    }

    /// Like [`Gguf::get_str_opt`] but a missing key is an error.
    pub fn get_str(&self, key: &str) -> Result<String> {
        self.get_str_opt(key)?.ok_or_else(|| missing(key))
    }

    /// A string (copied); `None` if the key is absent.  Use [`Gguf::get`]
    /// and [`Value::as_str`] to borrow instead.
    pub fn get_str_opt(&self, key: &str) -> Result<Option<String>> {
        self.typed(key, "a string", |v| v.as_str().map(str::to_string))
    }

    /// A bool; `None` if the key is absent.
    pub fn get_bool_opt(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", Value::as_bool)
    }

    /// An array of strings; `None` if the key is absent.
    pub fn get_str_array_opt(&self, key: &str) -> Result<Option<Vec<String>>> {
        self.typed_array(key, "an array of strings", |v| v.as_str().map(str::to_string))
    }

    /// An array of `F32`/`F64`; `None` if the key is absent.
    pub fn get_f32_array_opt(&self, key: &str) -> Result<Option<Vec<f32>>> {
        self.typed_array(key, "an array of floats", Value::as_f32)
    }

    /// An array of integers (any width) that all fit in i32; `None` if the
    /// key is absent.
    pub fn get_i32_array_opt(&self, key: &str) -> Result<Option<Vec<i32>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let arr = v.as_array().ok_or_else(|| type_err(key, v, "an array of integers"))?;
        let mut out = Vec::with_capacity(arr.len());
        for (i, e) in arr.iter().enumerate() {
            if !e.is_integer() {
                return Err(type_err(key, v, "an array of integers"));
            }
            match e.as_i64().and_then(|x| i32::try_from(x).ok()) {
                Some(x) => out.push(x),
                None => {
                    return Err(GgufError::InvalidValue {
                        key: key.to_string(),
                        reason: format!("element #{i} ({e:?}) does not fit in i32"),
                    })
                }
            }
        }
        Ok(Some(out))
    }

    fn typed<'s, T>(&'s self, key: &str, expected: &'static str, f: impl Fn(&'s Value) -> Option<T>) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| type_err(key, v, expected)),
        }
    }

    fn typed_array<T>(&self, key: &str, expected: &'static str, f: impl Fn(&Value) -> Option<T>) -> Result<Option<Vec<T>>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let arr = v.as_array().ok_or_else(|| type_err(key, v, expected))?;
        arr.iter().map(|e| f(e).ok_or_else(|| type_err(key, v, expected))).collect::<Result<Vec<T>>>().map(Some)
    }
}

fn missing(key: &str) -> GgufError {
    GgufError::MissingKey { key: key.to_string() }
}

fn type_err(key: &str, v: &Value, expected: &'static str) -> GgufError {
    let found = match v.as_i64() {
        Some(x) if x < 0 => format!("{} (negative value {x})", v.type_name()),
        _ => v.describe(),
    };
    GgufError::MetadataType { key: key.to_string(), found, expected }
}

/// Size in bytes of a tensor with the given shape and ggml type, validating
/// that the type is known, there are at most [`MAX_DIMS`] dims, the row
/// length is a whole number of blocks and nothing overflows.
pub fn tensor_n_bytes(name: &str, dims: &[u64], ggml_type_id: u32) -> Result<u64> {
    let invalid = |reason: String| GgufError::InvalidTensor { tensor: name.to_string(), reason };
    if dims.len() > MAX_DIMS {
        return Err(invalid(format!("has {} dimensions, more than the limit of {MAX_DIMS}", dims.len())));
    }
    let ty = ggml_type(ggml_type_id).ok_or_else(|| GgufError::UnknownGgmlType { tensor: name.to_string(), id: ggml_type_id })?;
    let n_elements = dims
        .iter()
        .try_fold(1u64, |a, &d| a.checked_mul(d))
        .ok_or_else(|| invalid(format!("element count of shape {dims:?} overflows")))?;
    let row = dims.first().copied().unwrap_or(1);
    if row % ty.block_elems != 0 {
        return Err(invalid(format!(
            "row length {row} (dims {dims:?}) is not a multiple of the {} block size {}",
            ty.name, ty.block_elems
        )));
    }
    ty.bytes_for(n_elements).ok_or_else(|| invalid(format!("byte size of shape {dims:?} as {} overflows", ty.name)))
}
