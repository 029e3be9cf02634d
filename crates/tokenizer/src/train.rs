//! Training the byte-level BPE tokenizer used by the random-weight fixture models.
//!
//! Owner: `engram-tokenizer`. Invariants:
//! * special tokens get ids `0..special_tokens.len()` in the order given;
//! * the 256 byte-level symbols follow (sorted by code point), then merges in
//!   the order the trainer found them;
//! * training is deterministic: the same corpus, size and specials give a
//!   byte-identical `tokenizer.json` (checked across processes by the tests).
//!   The `tokenizers` trainer breaks count ties by pair ids, which are fixed by
//!   the two rules above, so hash-map iteration order does not leak into the result.
//! * the result is a standard `tokenizer.json` (`to_string`) that Python
//!   `tokenizers` / `transformers.AutoTokenizer` load.

use crate::error::{Result, TokenizerError};
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::AddedToken;

/// The fixture training corpus: project spec prose plus some Rust/Python code and
/// multilingual text (é, —, 日本語, emoji), ~230 KB of UTF-8.
pub const FIXTURE_CORPUS: &str = include_str!("../data/corpus.txt");

/// Special tokens of the fixture tokenizer, in id order (ids 0..4).
pub const FIXTURE_SPECIAL_TOKENS: [&str; 4] = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"];

/// Train the deterministic byte-level BPE used by the fixture models.
///
/// * pre-tokenizer: `ByteLevel` (GPT-2 split regex, `add_prefix_space = false`);
///   decoder: `ByteLevel`;
/// * trainer: `BpeTrainer` with the full 256-symbol byte alphabet, `min_frequency = 2`,
///   no progress bar; training stops early if no pair occurs twice any more, so
///   the vocabulary can be smaller than `vocab_size`;
/// * `special_tokens` are added first (ids `0..`) and registered as special;
/// * if `"<s>"` is among the specials, a `TemplateProcessing` post-processor
///   prepends it to every single sequence (`"<s> $A"`), like Llama tokenizers.
///
/// The corpus is fed line by line with line endings kept, so newline tokens exist.
pub fn train_bpe(corpus: &str, vocab_size: usize, special_tokens: &[&str]) -> Result<tokenizers::Tokenizer> {
    let min = 256 + special_tokens.len();
    if vocab_size < min {
        return Err(TokenizerError::Invalid(format!(
            "train_bpe: vocab_size {vocab_size} is below the byte alphabet plus specials ({min})"
        )));
    }
    for (i, s) in special_tokens.iter().enumerate() {
        if s.is_empty() || special_tokens[..i].contains(s) {
            return Err(TokenizerError::Invalid(format!("train_bpe: special token {s:?} is empty or repeated")));
        }
    }
    let specials: Vec<AddedToken> = special_tokens.iter().map(|s| AddedToken::from(s.to_string(), true)).collect();
    let trainer = BpeTrainer::builder()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut trainer = TrainerWrapper::from(trainer);

    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevelDecoder::new(false, true, true)));
    tok.train(&mut trainer, corpus.split_inclusive('\n')).map_err(TokenizerError::tk)?;

    if special_tokens.contains(&"<s>") {
        let bos_id = tok.token_to_id("<s>").ok_or_else(|| TokenizerError::tk("trained vocabulary lacks <s>"))?;
        let pp = TemplateProcessing::builder()
            .try_single("<s>:0 $A:0")
            .map_err(TokenizerError::tk)?
            .try_pair("<s>:0 $A:0 <s>:1 $B:1")
            .map_err(TokenizerError::tk)?
            .special_tokens(vec![("<s>", bos_id)])
            .build()
            .map_err(TokenizerError::tk)?;
        tok.with_post_processor(Some(pp));
    }
    Ok(tok)
}
