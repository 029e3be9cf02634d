//! Opening GGUF files.
//!
//! Owns [`GgufFile`]: a read-only memory map of a file plus its parsed,
//! validated header.  Tensor bytes are borrowed straight from the map (no
//! copies).  Every error returned from here names the file.
//!
//! Invariant: `header` was produced by [`Gguf::parse`] on exactly the bytes
//! of `map`, so every tensor's data range lies inside the map.
//!
//! Like any memory-mapped reader, this assumes the file is not truncated or
//! modified by another process while it is open.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::error::{GgufError, Result};
use crate::reader::{Gguf, TensorInfo};

/// An opened GGUF file: the mmap plus the parsed header.
pub struct GgufFile {
    path: PathBuf,
    map: Arc<Mmap>,
    header: Gguf,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("size", &self.bytes().len())
            .field("version", &self.header.version)
            .field("metadata", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

macro_rules! delegate {
    ($($(#[$m:meta])* $name:ident -> $t:ty;)*) => {$(
        $(#[$m])*
        pub fn $name(&self, key: &str) -> Result<$t> {
            self.header.$name(key).map_err(|e| e.in_file(&self.path))
        }
    )*};
}

impl GgufFile {
    /// Maps `path` read-only and parses its header.  Errors carry the path.
    pub fn open(path: &Path) -> Result<GgufFile> {
        let wrap = |e: GgufError| e.in_file(path);
        let file = File::open(path).map_err(|e| wrap(GgufError::io("cannot open", e)))?;
        let len = file.metadata().map_err(|e| wrap(GgufError::io("cannot stat", e)))?.len();
        if len == 0 {
            // Zero-length files cannot be mapped portably.
            return Err(wrap(GgufError::Truncated { what: "magic (the file is empty)".to_string() }));
        }
        // SAFETY: the map is read-only; we rely (as every mmap reader does)
        // on the file not being modified while it is open.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| wrap(GgufError::io("cannot mmap", e)))?;
        let header = Gguf::parse(&map).map_err(wrap)?;
        Ok(GgufFile { path: path.to_path_buf(), map: Arc::new(map), header })
    }

    /// The parsed header.
    pub fn header(&self) -> &Gguf {
        &self.header
    }

    /// The path the file was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The shared read-only map of the whole file, for callers that keep
    /// tensor bytes alive beyond this `GgufFile` (clone the `Arc`).  Tensor
    /// `t` lives at `header().data_offset + t.offset`, `t.n_bytes` long.
    pub fn mmap(&self) -> &Arc<Mmap> {
        &self.map
    }

    /// The data bytes of `t`, borrowed from the map.
    ///
    /// # Panics
    /// If `t` did not come from this file's header and its range lies outside
    /// the file (bounds of this file's own tensors were validated at open).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = self.header.data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        let bytes = self.bytes();
        match (start, end) {
            (Some(s), Some(e)) if e <= bytes.len() as u64 => &bytes[s as usize..e as usize],
            _ => panic!("{}: tensor \"{}\" is not from this file (data range outside the file)", self.path.display(), t.name),
        }
    }

    /// The info and data of the tensor named `name`, if present.
    pub fn find_tensor(&self, name: &str) -> Option<(&TensorInfo, &[u8])> {
        let t = self.header.tensor(name)?;
        Some((t, self.tensor_data(t)))
    }

    /// The metadata value for `key`, if present.
    pub fn get(&self, key: &str) -> Option<&crate::Value> {
        self.header.get(key)
    }

    delegate! {
        /// A required non-negative integer of any width.
        get_u64 -> u64;
        /// An optional non-negative integer of any width.
        get_u64_opt -> Option<u64>;
        /// A required `F32`/`F64`.
        get_f32 -> f32;
        /// An optional `F32`/`F64`.
        get_f32_opt -> Option<f32>;
        /// A required string.
        get_str -> String;
        /// An optional string.
        get_str_opt -> Option<String>;
        /// An optional bool.
        get_bool_opt -> Option<bool>;
        /// An optional array of strings.
        get_str_array_opt -> Option<Vec<String>>;
        /// An optional array of `F32`/`F64`.
        get_f32_array_opt -> Option<Vec<f32>>;
        /// An optional array of integers that fit in i32.
        get_i32_array_opt -> Option<Vec<i32>>;
    }
}
