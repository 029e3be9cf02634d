//! `model.safetensors`, memory-mapped: tensors are looked up by their
//! checkpoint names (with or without the `bert.` prefix of task heads) and
//! checked for shape and type before anything runs.
//!
//! Invariant: a [`Tensor`] handed out lies inside the mapped data section,
//! has exactly the shape asked for and an f32, f16 or bf16 element type; the
//! file's header was validated whole (offsets in bounds, data section size
//! equal to the file's) when it was opened, so a truncated or foreign file
//! fails here, never in a matmul.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use engram_kernels::{DType, WeightMatrix};
use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;

use crate::error::{io_err, tensor_err, EmbedError, Result};

/// One tensor's bytes in the mapped file, as a row-major `[rows, cols]` matrix
/// (a vector is `[1, len]`).
#[derive(Clone)]
pub(crate) struct Tensor {
    map: Arc<Mmap>,
    range: Range<usize>,
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
}

impl Tensor {
    /// The bytes as the kernels' weight matrix (`out = x · Wᵀ`).
    pub fn matrix(&self) -> WeightMatrix<'_> {
        WeightMatrix::new(self.dtype, self.rows, self.cols, &self.map[self.range.clone()])
            .expect("shape checked when the tensor was looked up")
    }

    /// Row `r` decoded to f32 into `out` (`cols` long).
    pub fn row_into(&self, r: usize, out: &mut [f32]) {
        let m = self.matrix();
        decode(self.dtype, m.row(r), out);
    }

    /// The whole tensor decoded to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.rows * self.cols];
        decode(self.dtype, &self.map[self.range.clone()], &mut out);
        out
    }
}

fn decode(dtype: DType, bytes: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        DType::F16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        DType::BF16 => {
            for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        other => unreachable!("{other:?} is refused when tensors are looked up"),
    }
}

/// The mapped file and its validated header.
pub(crate) struct Weights {
    path: PathBuf,
    map: Arc<Mmap>,
    data_start: usize,
    meta: Metadata,
    prefix: &'static str,
}

impl Weights {
    /// Maps `path` and validates its header.
    pub fn open(path: &Path) -> Result<Weights> {
        let file = std::fs::File::open(path).map_err(|e| io_err(path, e))?;
        // SAFETY: the file is opened read-only; like every mmap user we rely on it not
        // being truncated underneath us while the encoder lives.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| io_err(path, e))?;
        let (header_len, meta) =
            SafeTensors::read_metadata(&map).map_err(|e| EmbedError::Safetensors { path: path.to_path_buf(), reason: e.to_string() })?;
        let prefix =
            if meta.info("embeddings.word_embeddings.weight").is_none() && meta.info("bert.embeddings.word_embeddings.weight").is_some() {
                "bert."
            } else {
                ""
            };
        Ok(Weights { path: path.to_path_buf(), map: Arc::new(map), data_start: 8 + header_len, meta, prefix })
    }

    /// The tensor `name`, which must have shape `shape` (`[len]` or `[rows, cols]`).
    pub fn get(&self, name: &str, shape: &[usize]) -> Result<Tensor> {
        let full = format!("{}{name}", self.prefix);
        let info = self.meta.info(&full).ok_or_else(|| tensor_err(&self.path, &full, "missing"))?;
        if info.shape != shape {
            return Err(tensor_err(&self.path, &full, format!("shape {:?}, expected {:?}", info.shape, shape)));
        }
        let dtype = match info.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            other => return Err(tensor_err(&self.path, &full, format!("element type {other:?} (expected F32, F16 or BF16)"))),
        };
        let (rows, cols) = match shape {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            _ => unreachable!("callers ask for vectors and matrices"),
        };
        let (a, b) = info.data_offsets;
        let range = self.data_start + a..self.data_start + b;
        // read_metadata checked offsets against shapes and the file size; this keeps the
        // matrix view's own length check from ever firing.
        WeightMatrix::new(dtype, rows, cols, &self.map[range.clone()]).map_err(|e| tensor_err(&self.path, &full, e.to_string()))?;
        Ok(Tensor { map: self.map.clone(), range, dtype, rows, cols })
    }

    /// The tensor `name` of shape `[len]`, decoded to f32.
    pub fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        Ok(self.get(name, &[len])?.to_f32())
    }
}
