//! StreamDecoder invariant: concat(push outputs) + flush == the text a full decode
//! adds after the prompt; random id sequences on byte-level and SentencePiece vocabularies.
use crate::common;
use common::*;
use engram_tokenizer::*;

/// Returns false when the expectation is ill-defined (prompt text is not a prefix).
fn check(tk: &Tokenizer, prompt: &[u32], gen: &[u32], skip: bool) -> bool {
    let mut sd = StreamDecoder::with_skip_special_tokens(tk, prompt, skip);
    let mut out = String::new();
    for &id in gen {
        let piece = sd.push(id).unwrap();
        out.push_str(&piece);
    }
    out.push_str(&sd.flush());
    let all: Vec<u32> = prompt.iter().chain(gen).copied().collect();
    let full = tk.decode(&all, skip).unwrap();
    let pre = tk.decode(prompt, skip).unwrap();
    let Some(want) = full.strip_prefix(pre.as_str()) else {
        return false;
    };
    assert_eq!(out, want, "prompt={prompt:?} gen={gen:?} skip={skip}");
    if prompt.is_empty() {
        assert_eq!(out, tk.decode(gen, skip).unwrap());
    }
    true
}

fn random_ids(rng: &mut Rng, tk: &Tokenizer, pools: &[Vec<u32>], len: usize) -> Vec<u32> {
    let v = tk.vocab_size();
    let mut ids = Vec::with_capacity(len);
    while ids.len() < len {
        match rng.below(10) {
            0..=3 => ids.push(rng.below(v) as u32),
            4..=6 => {
                // a run of tokens from a real encoding (multi-byte chars split across tokens)
                let pool = &pools[rng.below(pools.len())];
                if !pool.is_empty() {
                    let a = rng.below(pool.len());
                    let b = (a + 1 + rng.below(6)).min(pool.len());
                    ids.extend_from_slice(&pool[a..b]);
                }
            }
            _ => {
                let pool = &pools[pools.len() - 1]; // special "byte" pool
                ids.push(pool[rng.below(pool.len())]);
            }
        }
    }
    ids.truncate(len);
    ids
}

fn run_random(tk: &Tokenizer, byte_pool: Vec<u32>, seeds: u64) {
    let mut pools: Vec<Vec<u32>> = SAMPLES.iter().map(|s| tk.encode(s, false).unwrap().ids).collect();
    pools.push(byte_pool);
    let mut defined = 0;
    let mut total = 0;
    for seed in 1..=seeds {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let gen_len = 1 + rng.below(40);
        let gen = random_ids(&mut rng, tk, &pools, gen_len);
        let prompt = match rng.below(3) {
            0 => Vec::new(),
            1 => tk.encode(SAMPLES[rng.below(SAMPLES.len())], true).unwrap().ids,
            _ => {
                let n = rng.below(12);
                random_ids(&mut rng, tk, &pools, n)
            }
        };
        for skip in [true, false] {
            total += 1;
            if check(tk, &prompt, &gen, skip) {
                defined += 1;
            }
        }
    }
    assert!(defined * 10 >= total * 8, "only {defined}/{total} cases checkable");
}

#[test]
fn byte_level_random_sequences() {
    let tk = Tokenizer::from_tokenizers(fixture().clone()).unwrap();
    // single-byte tokens for UTF-8 lead and continuation bytes
    let byte_pool: Vec<u32> = "é日🚀—".bytes().map(|b| (4..260u32).find(|&id| byte_of(&tk, id) == Some(b)).unwrap()).collect();
    run_random(&tk, byte_pool, 600);
}

/// The raw byte a byte-level single-symbol token stands for.
fn byte_of(tk: &Tokenizer, id: u32) -> Option<u8> {
    let t = tk.id_to_token(id)?;
    let mut it = t.chars();
    let c = it.next()?;
    if it.next().is_some() {
        return None;
    }
    // GPT-2 bytes_to_unicode inverse
    let cp = c as u32;
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    if printable(cp) {
        return Some(cp as u8);
    }
    let mut n = 0u32;
    for b in 0..=255u32 {
        if !printable(b) {
            if 256 + n == cp {
                return Some(b as u8);
            }
            n += 1;
        }
    }
    None
}

#[test]
fn sentencepiece_random_sequences() {
    let tk = Tokenizer::from_gguf_vocab(&spm_vocab()).unwrap();
    let mut byte_pool: Vec<u32> = "é日🚀".bytes().map(|b| 3 + b as u32).collect();
    byte_pool.push(tk.token_to_id("▁").unwrap());
    byte_pool.push(tk.token_to_id("▁▁").unwrap());
    byte_pool.push(tk.token_to_id("<tag>").unwrap());
    byte_pool.push(1);
    run_random(&tk, byte_pool, 600);
}

#[test]
fn streams_text_as_it_completes() {
    let tk = Tokenizer::from_tokenizers(fixture().clone()).unwrap();
    let text = "Hello wörld — 日本語 🚀 done";
    let ids = tk.encode(text, false).unwrap().ids;
    let mut sd = StreamDecoder::new(&tk, &[]);
    let mut pieces = Vec::new();
    for &id in &ids {
        let p = sd.push(id).unwrap();
        assert!(!p.contains('\u{FFFD}'), "{p:?}");
        pieces.push(p);
    }
    assert_eq!(sd.flush(), "");
    assert_eq!(pieces.concat(), text);
    // text comes out while streaming, not all at the end
    assert!(pieces.iter().filter(|p| !p.is_empty()).count() >= 8, "{pieces:?}");
    assert_eq!(pieces[0], "H");

    // the leading space after a prompt is kept (SentencePiece strips it only at text start)
    let spm = Tokenizer::from_gguf_vocab(&spm_vocab()).unwrap();
    let prompt = spm.encode("hello", true).unwrap().ids;
    let gen = spm.encode("world", false).unwrap().ids; // "▁world"
    let mut sd = StreamDecoder::new(&spm, &prompt);
    let out: String = gen.iter().map(|&i| sd.push(i).unwrap()).collect::<String>() + &sd.flush();
    assert_eq!(out, " world");
    let mut sd = StreamDecoder::new(&spm, &[]);
    let out: String = gen.iter().map(|&i| sd.push(i).unwrap()).collect::<String>() + &sd.flush();
    assert_eq!(out, "world");
    // a byte-fallback character arrives whole
    let e = spm.encode("é", false).unwrap().ids; // ▁ <0xC3> <0xA9>
    let mut sd = StreamDecoder::new(&spm, &prompt);
    let mut outs: Vec<String> = e.iter().map(|&i| sd.push(i).unwrap()).collect();
    outs.push(sd.flush());
    assert_eq!(outs.concat(), " é");
    assert!(outs.iter().all(|o| !o.contains('\u{FFFD}')));
}
