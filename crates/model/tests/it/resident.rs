//! Mapped weights the kernels read unpacked get a verbatim huge-page copy where the machine
//! grants huge pages: the same bytes, the same products, and no copy for row lookups.

use std::io::Write;
use std::sync::Arc;

use engram_kernels::{huge_pages_enabled, DType};
use engram_model::weights::Storage;
use engram_model::Weight;

#[test]
fn mapped_f16_weight_reads_the_same_bytes_from_its_resident_copy() {
    // 1,040 rows of 1,024 F16 columns: just over 2 MiB, so the copy is a mapping.
    let (rows, cols) = (1040, 1024);
    let bytes: Vec<u8> =
        (0..rows * cols).flat_map(|i| half::f16::from_f32(((i * 37 % 1001) as f32 - 500.0) / 256.0).to_le_bytes()).collect();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    file.write_all(&bytes).unwrap();
    let map = Arc::new(unsafe { memmap2::Mmap::map(file.as_file()) }.unwrap());
    let w = Weight::new("t.gguf", "w", DType::F16, rows, cols, Storage::Mapped(map, 0..bytes.len())).unwrap();

    assert_eq!(w.resident_bytes(), if huge_pages_enabled() { bytes.len() } else { 0 });
    assert_eq!(w.matrix().data, &bytes[..]);
    let mut row = vec![0f32; cols];
    w.row_f32(rows - 1, &mut row);
    let want: Vec<f32> = bytes[(rows - 1) * cols * 2..].chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect();
    assert_eq!(row, want);

    // A matrix read only row by row keeps no copy and still reads the same rows.
    let map = Arc::new(unsafe { memmap2::Mmap::map(file.as_file()) }.unwrap());
    let lookup = Weight::for_rows("t.gguf", "w", DType::F16, rows, cols, Storage::Mapped(map, 0..bytes.len())).unwrap();
    assert_eq!((lookup.resident_bytes(), lookup.packed_bytes()), (0, 0));
    assert_eq!(lookup.matrix().data, &bytes[..]);
    let mut again = vec![0f32; cols];
    lookup.row_f32(rows - 1, &mut again);
    assert_eq!(again, want);
}
