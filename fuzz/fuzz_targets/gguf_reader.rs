//! libFuzzer target: arbitrary bytes through `engram_gguf::Gguf::parse` and every typed
//! metadata accessor (see `engram_fuzz::gguf_reader`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| engram_fuzz::gguf_reader(data));
