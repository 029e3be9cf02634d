//! engram-gguf: a validating GGUF v2/v3 reader (memory-mapped) and a writer.
//!
//! GGUF (little-endian only) is laid out as: magic `"GGUF"`, version `u32`,
//! tensor count `u64`, metadata count `u64`, metadata key/values (key =
//! `u64` length + UTF-8 bytes, value type `u32`, value), tensor infos (name,
//! `n_dims u32`, `dims u64 × n_dims`, ggml type `u32`, offset `u64`), zero
//! padding to `general.alignment` (default 32), then the tensor data.  Tensor
//! offsets are relative to the data section and aligned.
//!
//! Modules:
//! * [`mod@value`] — metadata [`Value`]s and the on-disk value type ids;
//! * [`mod@types`] — the ggml tensor type table ([`ggml_type`]);
//! * [`mod@reader`] — [`Gguf::parse`], which validates a whole file held in a byte
//!   slice (bounds, alignment, overlap, sizes, limits) and never panics or
//!   allocates unboundedly on hostile input;
//! * [`mod@file`] — [`GgufFile`], an mmapped file plus its header; tensor data is
//!   borrowed from the map and every error names the file;
//! * [`mod@writer`] — [`GgufWriter`], which writes version 3 files (atomically
//!   for [`GgufWriter::write_file`]);
//! * [`mod@error`] — [`GgufError`].
//!
//! ```
//! use engram_gguf::{Gguf, GgufWriter, Value, GGML_TYPE_F32};
//! let mut w = GgufWriter::new();
//! w.add("general.architecture", Value::from("llama"));
//! w.add_tensor("x", &[2], GGML_TYPE_F32, vec![0; 8]).unwrap();
//! let mut bytes = Vec::new();
//! w.write_to(&mut bytes).unwrap();
//! let g = Gguf::parse(&bytes).unwrap();
//! assert_eq!(g.get_str("general.architecture").unwrap(), "llama");
//! assert_eq!(g.tensor("x").unwrap().n_bytes, 8);
//! ```

#![forbid(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod error;
pub mod file;
pub mod reader;
pub mod types;
pub mod value;
pub mod writer;

pub use error::{GgufError, Result};
pub use file::GgufFile;
pub use reader::{
    tensor_n_bytes, Gguf, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC, GGUF_VERSION, MAX_ALIGNMENT, MAX_ARRAY_DEPTH,
    MAX_ARRAY_LEN, MAX_DIMS, MAX_METADATA_ELEMENTS, MAX_NAME_LEN, MAX_STRING_LEN,
};
pub use types::*;
pub use value::{value_type_name, Value};
pub use writer::GgufWriter;
