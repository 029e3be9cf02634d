//! Writing GGUF files.
//!
//! Owns [`GgufWriter`], which collects metadata and tensors in memory and
//! serialises them as GGUF version 3, little-endian.
//!
//! Layout written: header, metadata (insertion order), tensor infos
//! (insertion order), zero padding to the alignment, then each tensor's data
//! followed by zero padding to the alignment.  Tensor offsets are assigned in
//! insertion order.  The alignment is `general.alignment` if it was added
//! (it must be a power of two), else 32.
//!
//! Invariant: everything the writer accepts is a file [`crate::Gguf::parse`]
//! accepts: tensors are checked in [`GgufWriter::add_tensor`]; metadata
//! (homogeneous arrays, length limits, alignment) is checked before the first
//! byte is written.

use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{GgufError, Result};
use crate::reader::*;
use crate::value::*;

struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: u32,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory and writes it out.
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl std::fmt::Debug for GgufWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field("metadata", &self.metadata)
            .field("tensors", &self.tensors.iter().map(|t| &t.name).collect::<Vec<_>>())
            .finish()
    }
}

impl GgufWriter {
    /// An empty writer (alignment 32 unless `general.alignment` is added).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets metadata `key` to `value`.  Adding an existing key replaces its
    /// value in place (GGUF keys are unique).  Values are validated by
    /// [`GgufWriter::write_to`].
    pub fn add(&mut self, key: &str, value: Value) {
        match self.metadata.iter_mut().find(|(k, _)| k == key) {
            Some((_, v)) => *v = value,
            None => self.metadata.push((key.to_string(), value)),
        }
    }

    /// Tensors added so far: the count the written file's header will hold.
    pub fn num_tensors(&self) -> usize {
        self.tensors.len()
    }

    /// Adds a tensor.  `dims` is in ggml order (`dims[0]` is the row length).
    /// Fails if the name is taken or too long, the type is unknown, the shape
    /// is invalid for the type, or `data.len()` is not the size the shape
    /// and type imply.
    pub fn add_tensor(&mut self, name: &str, dims: &[u64], ggml_type: u32, data: Vec<u8>) -> Result<()> {
        let invalid = |reason: String| GgufError::InvalidTensor { tensor: name.to_string(), reason };
        if name.len() as u64 > MAX_NAME_LEN {
            return Err(invalid(format!("name is longer than {MAX_NAME_LEN} bytes")));
        }
        if self.tensors.iter().any(|t| t.name == name) {
            return Err(invalid("name appears more than once".to_string()));
        }
        let n_bytes = tensor_n_bytes(name, dims, ggml_type)?;
        if data.len() as u64 != n_bytes {
            return Err(invalid(format!(
                "data is {} bytes, but shape {dims:?} of type {} needs {n_bytes}",
                data.len(),
                crate::ggml_type(ggml_type).map_or("?", |t| t.name)
            )));
        }
        self.tensors.push(PendingTensor { name: name.to_string(), dims: dims.to_vec(), ggml_type, data });
        Ok(())
    }

    fn alignment(&self) -> Result<u64> {
        match self.metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, v)) => {
                let bad = |reason: String| GgufError::InvalidValue { key: ALIGNMENT_KEY.to_string(), reason };
                let a = v.as_u64().ok_or_else(|| bad(format!("has type {}, expected an integer", v.describe())))?;
                if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                    return Err(bad(format!("alignment {a} is not a power of two between 1 and {MAX_ALIGNMENT}")));
                }
                Ok(a)
            }
        }
    }

    /// Checks everything `write_to` would otherwise fail on halfway.
    fn validate(&self) -> Result<u64> {
        // The reader's budget of array elements over the whole header.
        let mut elements = 0u64;
        for (key, value) in &self.metadata {
            if key.len() as u64 > MAX_NAME_LEN {
                return Err(GgufError::InvalidValue { key: key.clone(), reason: format!("key is longer than {MAX_NAME_LEN} bytes") });
            }
            validate_value(key, value, 0)?;
            elements += array_elements(value);
            if elements > MAX_METADATA_ELEMENTS {
                return Err(GgufError::InvalidValue {
                    key: key.clone(),
                    reason: format!("takes the metadata's arrays past the limit of {MAX_METADATA_ELEMENTS} elements in all"),
                });
            }
        }
        self.alignment()
    }

    /// Serialises the file to `w`.
    pub fn write_to(&self, w: impl Write) -> Result<()> {
        let alignment = self.validate()?;
        let mut w = BufWriter::with_capacity(1 << 20, w);
        let io = |e| GgufError::io("write failed", e);
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC.to_le_bytes());
        out.extend_from_slice(&GGUF_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_str(&mut out, key);
            out.extend_from_slice(&value.type_id().to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_str(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset += padded(t.data.len() as u64, alignment);
        }
        let pad = padded(out.len() as u64, alignment) - out.len() as u64;
        out.resize(out.len() + pad as usize, 0);
        w.write_all(&out).map_err(io)?;
        let zeros = vec![0u8; alignment as usize];
        for t in &self.tensors {
            w.write_all(&t.data).map_err(io)?;
            let pad = padded(t.data.len() as u64, alignment) - t.data.len() as u64;
            w.write_all(&zeros[..pad as usize]).map_err(io)?;
        }
        w.flush().map_err(io)?;
        Ok(())
    }

    /// Writes the file atomically: to a temporary file in the same directory,
    /// fsynced, then renamed over `path`.  On failure the temporary file is
    /// removed and `path` is untouched.  Errors carry the path.
    pub fn write_file(&self, path: &Path) -> Result<()> {
        self.write_file_inner(path).map_err(|e| e.in_file(path))
    }

    fn write_file_inner(&self, path: &Path) -> Result<()> {
        self.validate()?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let file_name = path.file_name().ok_or_else(|| GgufError::Malformed("output path has no file name".to_string()))?;
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp =
            dir.join(format!(".{}.tmp.{}.{}", file_name.to_string_lossy(), std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed)));
        let file =
            OpenOptions::new().write(true).create_new(true).open(&tmp).map_err(|e| GgufError::io("cannot create temporary file", e))?;
        let result = (|| {
            self.write_to(&file)?;
            file.sync_all().map_err(|e| GgufError::io("fsync failed", e))?;
            drop(file);
            fs::rename(&tmp, path).map_err(|e| GgufError::io("cannot rename temporary file into place", e))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
            return result;
        }
        // Persist the rename; not all platforms can open a directory.
        if let Ok(d) = File::open(&dir) {
            let _ = d.sync_all();
        }
        Ok(())
    }
}

fn padded(x: u64, align: u64) -> u64 {
    x.div_ceil(align) * align
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// The element type id written for an array (u8 for an empty array).
fn elem_type(a: &[Value]) -> u32 {
    a.first().map_or(GGUF_TYPE_UINT8, Value::type_id)
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(b) => out.push(*b as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => {
            out.extend_from_slice(&elem_type(a).to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for e in a {
                put_value(out, e);
            }
        }
    }
}

/// Array elements in `v`, nested ones included (what the reader counts against
/// [`MAX_METADATA_ELEMENTS`]).
fn array_elements(v: &Value) -> u64 {
    match v {
        Value::Array(a) => a.len() as u64 + a.iter().map(array_elements).sum::<u64>(),
        _ => 0,
    }
}

fn validate_value(key: &str, v: &Value, depth: u32) -> Result<()> {
    let bad = |reason: String| GgufError::InvalidValue { key: key.to_string(), reason };
    match v {
        Value::String(s) if s.len() as u64 > MAX_STRING_LEN => Err(bad(format!("string is longer than {MAX_STRING_LEN} bytes"))),
        Value::Array(a) => {
            if depth + 1 > MAX_ARRAY_DEPTH {
                return Err(bad(format!("arrays nest more than {MAX_ARRAY_DEPTH} deep")));
            }
            if a.len() as u64 > MAX_ARRAY_LEN {
                return Err(bad(format!("array has more than {MAX_ARRAY_LEN} elements")));
            }
            let ty = elem_type(a);
            for (i, e) in a.iter().enumerate() {
                if e.type_id() != ty {
                    return Err(bad(format!(
                        "array is not homogeneous: element #0 is {}, element #{i} is {}",
                        a[0].type_name(),
                        e.type_name()
                    )));
                }
                validate_value(key, e, depth + 1)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}
