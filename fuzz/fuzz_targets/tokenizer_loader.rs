//! libFuzzer target: arbitrary bytes parsed as GGUF, their `tokenizer.ggml.*` keys read as
//! the model loader reads them, `Tokenizer::from_gguf_vocab`, then a short encode/decode
//! (see `engram_fuzz::tokenizer_loader`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| engram_fuzz::tokenizer_loader(data));
