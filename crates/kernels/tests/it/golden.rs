//! `dequantize_row` against golden vectors written by the `gguf` Python package
//! (`gguf.quants.dequantize`, a NumPy port of ggml's `dequantize_row_*`): for every block format,
//! a few pseudo-random blocks (`scripts/golden_dequant.py` makes them and the file
//! `tests/golden/dequant.json`) decode to bitwise the same f32s.

use engram_kernels::{dequantize_row, DType};

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn dequantize_matches_gguf_py_bitwise() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/dequant.json")).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut seen = Vec::new();
    for t in doc["types"].as_array().unwrap() {
        let id = t["ggml_type"].as_u64().unwrap() as u32;
        let d = DType::from_ggml_type_id(id).unwrap_or_else(|| panic!("ggml type {id} not supported"));
        assert_eq!(d.name(), t["name"].as_str().unwrap());
        let blocks = hex(t["blocks"].as_str().unwrap());
        let want: Vec<u32> =
            hex(t["f32_bits"].as_str().unwrap()).chunks_exact(4).map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_eq!(blocks.len(), t["n_blocks"].as_u64().unwrap() as usize * d.block_bytes(), "{d}");
        let mut out = vec![f32::NAN; want.len()];
        dequantize_row(d, &blocks, &mut out);
        for (i, (o, w)) in out.iter().zip(&want).enumerate() {
            assert_eq!(o.to_bits(), *w, "{d} element {i}: got {o}, gguf-py {}", f32::from_bits(*w));
        }
        seen.push(d);
    }
    // Every quantized format the crate supports has golden vectors.
    for d in DType::ALL.into_iter().filter(|d| d.block_elems() > 1) {
        assert!(seen.contains(&d), "no golden vectors for {d}");
    }
}
