//! Entry points of the fuzz targets, shared by the libFuzzer binaries (`fuzz_targets/`)
//! and by the replay test below, which runs every committed input (`seeds/`,
//! `regressions/`) and any local corpus (`corpus/`) through them under plain `cargo test`.
//!
//! Each entry point takes arbitrary bytes and must return without panicking; a panic
//! (including a failed invariant assertion or an arithmetic overflow, which the fuzz
//! profile checks) is a finding. Allocation is bounded by running libFuzzer with
//! `-malloc_limit_mb` / `-rss_limit_mb` (see README.md).

use engram_gguf::{tensor_n_bytes, Gguf, MAX_DIMS};
use engram_tokenizer::Tokenizer;

/// Texts encoded with every tokenizer that loads: ASCII, a SentencePiece space mark, a
/// spelled special token, bytes outside any small vocabulary, digits, newlines.
const TEXTS: [&str; 3] = ["Hello world, 1234!", " <s>héllo ▁wörld</s>\n\n  x", "<|im_start|>user\nñ 中文 🙂<|im_end|>"];

/// Parses `data` as GGUF; when it parses, checks the invariants `Gguf::parse` documents
/// and calls every typed metadata accessor on every key. Errors must have a message.
pub fn gguf_reader(data: &[u8]) {
    let g = match Gguf::parse(data) {
        Ok(g) => g,
        Err(e) => {
            assert!(!e.to_string().is_empty(), "an error without a message: {e:?}");
            return;
        }
    };
    check_header(&g, data.len() as u64);
    for (key, _) in &g.metadata {
        let _ = g.get_u64_opt(key);
        let _ = g.get_f32_opt(key);
        let _ = g.get_str_opt(key);
        let _ = g.get_bool_opt(key);
        let _ = g.get_str_array_opt(key);
        let _ = g.get_f32_array_opt(key);
        let _ = g.get_i32_array_opt(key);
    }
}

/// The invariants of a parsed header (see `engram_gguf::reader`'s module docs).
fn check_header(g: &Gguf, file_size: u64) {
    assert!(matches!(g.version, 2 | 3));
    assert!(g.alignment.is_power_of_two());
    assert_eq!(g.data_offset % g.alignment, 0);
    assert!(g.data_offset <= file_size.next_multiple_of(g.alignment));
    let mut keys: Vec<&str> = g.metadata.iter().map(|(k, _)| k.as_str()).collect();
    keys.sort_unstable();
    assert!(keys.windows(2).all(|w| w[0] != w[1]), "duplicate metadata key");
    let mut names: Vec<&str> = g.tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    assert!(names.windows(2).all(|w| w[0] != w[1]), "duplicate tensor name");
    let mut ranges = Vec::new();
    for t in &g.tensors {
        assert!(t.dims.len() <= MAX_DIMS);
        assert_eq!(tensor_n_bytes(&t.name, &t.dims, t.ggml_type).ok(), Some(t.n_bytes), "tensor {}", t.name);
        assert_eq!(t.offset % g.alignment, 0, "tensor {}", t.name);
        let end = g.data_offset + t.offset + t.n_bytes;
        assert!(end <= file_size, "tensor {} ends at {end}, past {file_size}", t.name);
        if t.n_bytes > 0 {
            ranges.push((t.offset, t.offset + t.n_bytes));
        }
    }
    ranges.sort_unstable();
    assert!(ranges.windows(2).all(|w| w[0].1 <= w[1].0), "overlapping tensor data");
}

/// Parses `data` as GGUF, reads its vocabulary as the model loader does, builds the
/// tokenizer; when it loads, encodes [`TEXTS`] and decodes the ids back. Every id must
/// index `tokenizer.ggml.tokens` (the model's embedding rows): the loader puts every token
/// string in the vocabulary, so neither added tokens nor byte fallback may invent ids. Errors must have a message.
pub fn tokenizer_loader(data: &[u8]) {
    let Ok(g) = Gguf::parse(data) else { return };
    let vocab = match engram_model::load::gguf::read_vocab(&g, "fuzz input") {
        Ok(v) => v,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    let tk = match Tokenizer::from_gguf_vocab(&vocab) {
        Ok(tk) => tk,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    for text in TEXTS {
        let Ok(enc) = tk.encode(text, true) else { continue };
        let n = vocab.tokens.len();
        assert!(enc.ids.iter().all(|&id| (id as usize) < n), "ids {:?} outside a vocabulary of {n} tokens", enc.ids);
        let _ = tk.decode(&enc.ids, false);
        let _ = tk.decode(&enc.ids, true);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Runs every file under `fuzz/{seeds,regressions,corpus}/<target>/` through `f`;
    /// returns how many ran.
    fn replay(target: &str, f: fn(&[u8])) -> usize {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut n = 0;
        for dir in ["seeds", "regressions", "corpus"] {
            let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else { continue };
            let mut paths: Vec<_> = entries.map(|e| e.unwrap().path()).filter(|p| p.is_file()).collect();
            paths.sort();
            for p in paths {
                let bytes = std::fs::read(&p).unwrap();
                eprintln!("{}", p.display());
                f(&bytes);
                n += 1;
            }
        }
        n
    }

    #[test]
    fn gguf_reader_replays_committed_inputs() {
        let n = replay("gguf_reader", super::gguf_reader);
        assert!(n > 0, "no inputs under fuzz/seeds/gguf_reader");
    }

    #[test]
    fn tokenizer_loader_replays_committed_inputs() {
        let n = replay("tokenizer_loader", super::tokenizer_loader);
        assert!(n > 0, "no inputs under fuzz/seeds/tokenizer_loader");
    }

    /// The seeds are valid files: each loads a tokenizer (so the fuzzer starts from inputs
    /// that reach `from_gguf_vocab` and the encoder, not just the header parser).
    #[test]
    fn tokenizer_seeds_load() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds/tokenizer_loader");
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            let g = engram_gguf::Gguf::parse(&std::fs::read(&p).unwrap()).unwrap();
            let v = engram_model::load::gguf::read_vocab(&g, "seed").unwrap();
            engram_tokenizer::Tokenizer::from_gguf_vocab(&v).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        }
    }
}
