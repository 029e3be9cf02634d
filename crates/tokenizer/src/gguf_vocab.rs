//! Building a tokenizer from the vocabulary a GGUF file carries
//! (`tokenizer.ggml.*` keys; the model loader fills [`GgufVocab`]).
//!
//! Owner: `engram-tokenizer`. Invariants:
//! * `model = "gpt2"` (or `"gemma4"`): BPE; vocabulary = `tokens` (id = index), merges =
//!   `merges` (`"a b"` strings, in rank order, split at the first space after the first
//!   byte as llama.cpp does; each half and the merged piece must be tokens); `pre`
//!   (missing: `default`) names one of llama.cpp's pre-tokenizers
//!   ([`crate::pre_tokenizers`]), which gives the split regexes, whether pieces are
//!   byte-level encoded (else byte fallback to `<0xXX>`), `ignore_merges` and the
//!   default for `add_bos`; a name llama.cpp does not know is an error naming it.
//!   NOTE: no NFC for `qwen2`: HF normalizes, llama.cpp does not, and llama.cpp is the
//!   reference for GGUF files;
//! * `model = "llama"`: SentencePiece-style BPE with byte fallback; merges are derived
//!   from the scores exactly as HF's `LlamaConverter`/`SentencePieceExtractor` do
//!   (`generate_merges`: every piece splittable into two vocabulary pieces gives a
//!   merge; merges are ranked by the merged piece's score, descending, ties by longer
//!   left then longer right half, then piece id order); normalizer
//!   `Prepend("▁") + Replace(" ", "▁")`; decoder `Replace("▁", " ") + ByteFallback
//!   + Fuse + Strip(left 1)`; without the `Prepend` and the `Strip` when
//!   `add_space_prefix` is false;
//! * token types: 3 (CONTROL), 2 (UNKNOWN) and 5 (UNUSED: vocabulary padding up
//!   to the embedding's rows, which llama.cpp renders as nothing) become special
//!   added tokens, 4 (USER_DEFINED) non-special added tokens (matched verbatim in
//!   text, kept by `decode(.., true)`), 6 (BYTE) stay plain vocabulary entries;
//!   the BOS/EOS/EOT/UNK/PAD ids are special whatever their type; a type outside
//!   0..=6 is an error naming the entry. NOTE: llama.cpp matches only CONTROL,
//!   UNKNOWN and USER_DEFINED pieces in text, so text spelling an UNUSED piece (or a
//!   NORMAL-typed BOS/EOS) becomes that token here and plain text there;
//! * BOS is prepended when `add_bos` (default: true for `llama`; for BPE the pre-tokenizer's
//!   default, false for most; always for Gemma 4, as llama.cpp forces it),
//!   EOS appended when `add_eos` (default false);
//! * stop ids: EOS and EOT.

use std::collections::HashSet;

use crate::chat_template::ChatTemplate;
use crate::error::{Result, TokenizerError};
use crate::pre_tokenizers::{self, PreFlags, PreType};
use crate::tokenizer::{SpecialFacts, Tokenizer};
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::{NormalizerWrapper, Prepend, Replace, Sequence as NormSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

/// The merges of a parsed byte-level BPE `tokenizer.json` in GGUF's form: `"a b"` strings in rank
/// order, whether the file writes a merge as `"a b"` or as `["a", "b"]`. `None` when the model has
/// no merges list or an entry is neither form.
pub fn gguf_merges(tokenizer_json: &serde_json::Value) -> Option<Vec<String>> {
    let merges = tokenizer_json["model"]["merges"].as_array()?;
    merges
        .iter()
        .map(|m| match m {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(p) if p.len() == 2 => Some(format!("{} {}", p[0].as_str()?, p[1].as_str()?)),
            _ => None,
        })
        .collect()
}

/// Facts a GGUF file carries about its tokenizer (the model loader fills this from
/// `tokenizer.ggml.*` keys).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GgufVocab {
    /// `tokenizer.ggml.model`: `"gpt2"` (byte-level BPE) or `"llama"` (SentencePiece).
    pub model: String,
    /// `tokenizer.ggml.pre`: pre-tokenizer flavour for `gpt2` (`"llama-bpe"`, `"qwen2"`, ...).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`: token strings, id = index.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`: SentencePiece scores (same length as `tokens`).
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`: 1 normal, 2 unknown, 3 control, 4 user-defined,
    /// 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`: `"left right"` strings in rank order (`gpt2`).
    pub merges: Option<Vec<String>>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn; a stop token).
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `tokenizer.ggml.add_space_prefix`: SentencePiece vocabularies put a space before the
    /// text (default true; Gemma's files say false). Unused by BPE vocabularies, as in llama.cpp.
    pub add_space_prefix: Option<bool>,
}

/// GGUF token types (`llama_token_type`).
const TYPE_UNKNOWN: i32 = 2;
const TYPE_CONTROL: i32 = 3;
const TYPE_UNUSED: i32 = 5;
const TYPE_USER_DEFINED: i32 = 4;

fn err(msg: impl Into<String>) -> TokenizerError {
    TokenizerError::GgufVocab(msg.into())
}

impl Tokenizer {
    /// Build a tokenizer from a GGUF file's vocabulary (see the module docs for the rules).
    pub fn from_gguf_vocab(v: &GgufVocab) -> Result<Tokenizer> {
        let n = v.tokens.len();
        if n == 0 {
            return Err(err("tokenizer.ggml.tokens is empty"));
        }
        if let Some(s) = &v.scores {
            if s.len() != n {
                return Err(err(format!("tokenizer.ggml.scores has {} entries for {n} tokens", s.len())));
            }
        }
        if let Some(t) = &v.token_types {
            if t.len() != n {
                return Err(err(format!("tokenizer.ggml.token_type has {} entries for {n} tokens", t.len())));
            }
            // llama.cpp's `llama_token_type`: 0 undefined .. 6 byte.
            if let Some((i, ty)) = t.iter().enumerate().find(|(_, ty)| !(0..=6).contains(*ty)) {
                return Err(err(format!("tokenizer.ggml.token_type[{i}] = {ty} is not a token type (0..=6)")));
            }
        }
        for (name, id) in [
            ("bos_token_id", v.bos_id),
            ("eos_token_id", v.eos_id),
            ("eot_token_id", v.eot_id),
            ("unknown_token_id", v.unk_id),
            ("padding_token_id", v.pad_id),
        ] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(err(format!("tokenizer.ggml.{name} = {id} is outside the vocabulary of {n} tokens")));
                }
            }
        }

        let mut vocab: Vocab = Vocab::default();
        for (i, t) in v.tokens.iter().enumerate() {
            vocab.entry(t.clone()).or_insert(i as u32);
        }

        let (mut inner, add_bos) = match v.model.as_str() {
            "gpt2" | "gemma4" => {
                // llama.cpp: a `gemma4` model is BPE whatever `pre` says; a missing `pre` is "default".
                let name = if v.model == "gemma4" { "gemma4" } else { v.pre.as_deref().unwrap_or("default") };
                let (pre, flags) = pre_tokenizers::lookup(name).ok_or_else(|| {
                    err(format!(
                        "tokenizer.ggml.pre {name:?} is not a pre-tokenizer llama.cpp knows (the list: {})",
                        pre_tokenizers::SOURCE
                    ))
                })?;
                // llama.cpp turns BOS on for Gemma 4 whatever the file says.
                let forced_bos = pre.kind == "GEMMA4";
                (build_bpe(v, vocab, &pre, &flags)?, if forced_bos { Some(true) } else { v.add_bos.or(Some(flags.add_bos)) })
            }
            "llama" => (build_llama(v, vocab)?, v.add_bos.or(Some(true))),
            other => {
                return Err(err(format!("tokenizer.ggml.model {other:?} is not supported (supported: \"gpt2\", \"gemma4\", \"llama\")")))
            }
        };

        // Added tokens: control/unknown (+ the named special ids) special, user-defined not.
        let named: Vec<u32> = [v.bos_id, v.eos_id, v.eot_id, v.unk_id, v.pad_id].into_iter().flatten().collect();
        let mut specials = Vec::new();
        let mut user = Vec::new();
        for (i, t) in v.tokens.iter().enumerate() {
            let ty = v.token_types.as_ref().map(|ts| ts[i]).unwrap_or(1);
            if ty == TYPE_CONTROL || ty == TYPE_UNKNOWN || ty == TYPE_UNUSED || named.contains(&(i as u32)) {
                specials.push(AddedToken::from(t.clone(), true).normalized(false));
            } else if ty == TYPE_USER_DEFINED {
                user.push(AddedToken::from(t.clone(), false).normalized(false));
            }
        }
        inner.add_special_tokens(&specials);
        inner.add_tokens(&user);

        // Post-processor: BOS / EOS.
        let add_bos = add_bos.unwrap_or(false) && v.bos_id.is_some();
        let add_eos = v.add_eos.unwrap_or(false) && v.eos_id.is_some();
        if add_bos || add_eos {
            let bos = v.bos_id.map(|i| (v.tokens[i as usize].clone(), i));
            let eos = v.eos_id.map(|i| (v.tokens[i as usize].clone(), i));
            let mut single = Vec::new();
            let mut pair = Vec::new();
            let mut special_tokens = Vec::new();
            if add_bos {
                let (b, id) = bos.clone().expect("checked");
                single.push(format!("{b}:0"));
                special_tokens.push((b, id));
            }
            single.push("$A:0".to_string());
            if add_eos {
                let (e, id) = eos.clone().expect("checked");
                single.push(format!("{e}:0"));
                if !special_tokens.iter().any(|(s, _)| *s == e) {
                    special_tokens.push((e, id));
                }
            }
            pair.extend(single.iter().cloned());
            pair.extend(single.iter().map(|p| p.replace("$A", "$B").replace(":0", ":1")));
            let pp = TemplateProcessing::builder()
                .try_single(single)
                .map_err(|e| err(format!("post-processor: {e}")))?
                .try_pair(pair)
                .map_err(|e| err(format!("post-processor: {e}")))?
                .special_tokens(special_tokens)
                .build()
                .map_err(|e| err(format!("post-processor: {e}")))?;
            inner.with_post_processor(Some(pp));
        }

        let tok_of = |id: Option<u32>| id.map(|i| v.tokens[i as usize].clone());
        let facts = SpecialFacts {
            bos_token: tok_of(v.bos_id),
            eos_token: tok_of(v.eos_id),
            extra_stop_ids: v.eot_id.into_iter().collect(),
            add_bos_override: None,
        };
        let chat_template = match &v.chat_template {
            Some(src) => Some(ChatTemplate::new(src).map_err(|e| err(format!("tokenizer.chat_template: {e}")))?),
            None => None,
        };
        Tokenizer::from_parts(inner, facts, chat_template)
    }
}

fn build_bpe(v: &GgufVocab, vocab: Vocab, pre: &PreType, flags: &PreFlags) -> Result<tokenizers::Tokenizer> {
    let merges_src = v.merges.as_ref().ok_or_else(|| err(format!("model {:?} needs tokenizer.ggml.merges", v.model)))?;
    let mut merges = Vec::with_capacity(merges_src.len());
    for (i, m) in merges_src.iter().enumerate() {
        // llama.cpp splits at the first space after the first byte (`word.find(' ', 1)`).
        let at = m.bytes().skip(1).position(|c| c == b' ').map(|p| p + 1);
        let (a, b) =
            at.map(|p| (&m[..p], &m[p + 1..])).ok_or_else(|| err(format!("tokenizer.ggml.merges[{i}] {m:?} is not \"left right\"")))?;
        for half in [a, b] {
            if !vocab.contains_key(half) {
                return Err(err(format!("tokenizer.ggml.merges[{i}] {m:?}: {half:?} is not in tokenizer.ggml.tokens")));
            }
        }
        if !vocab.contains_key(&format!("{a}{b}")) {
            return Err(err(format!(
                "tokenizer.ggml.merges[{i}] {m:?}: the merged {:?} is not in tokenizer.ggml.tokens",
                format!("{a}{b}")
            )));
        }
        merges.push((a.to_string(), b.to_string()));
    }
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(flags.ignore_merges)
        .byte_fallback(!pre.byte_encode)
        .build()
        .map_err(|e| err(format!("byte-level BPE: {e}")))?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    let mut steps = Vec::with_capacity(pre.regexes.len() + 1);
    for re in pre.regexes {
        let split = Split::new(SplitPattern::Regex(re.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| err(format!("pre-tokenizer {} regex {re:?}: {e}", pre.kind)))?;
        steps.push(PreTokenizerWrapper::Split(split));
    }
    if pre.byte_encode {
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)));
        tok.with_decoder(Some(ByteLevelDecoder::new(false, true, true)));
    } else {
        tok.with_decoder(Some(DecoderSequence::new(vec![
            DecoderWrapper::Replace(Replace::new("▁", " ").map_err(|e| err(e.to_string()))?),
            DecoderWrapper::ByteFallback(ByteFallback::new()),
            DecoderWrapper::Fuse(Fuse::new()),
        ])));
    }
    if pre.escape_whitespaces {
        tok.with_normalizer(Some(Replace::new(" ", "▁").map_err(|e| err(e.to_string()))?));
    }
    tok.with_pre_tokenizer(Some(PreSequence::new(steps)));
    Ok(tok)
}

/// Merges of a SentencePiece vocabulary, as HF's `generate_merges(vocab, vocab_scores)`
/// (used by `SentencePieceExtractor` / `LlamaConverter`): for every piece, each split
/// into two vocabulary pieces is a merge (ordered by the ids of the halves); then all
/// merges are sorted, stably, by (score, left length, right length) descending, lengths
/// in characters.
pub(crate) fn spm_merges(tokens: &[String], scores: &[f32], vocab: &Vocab) -> Vec<(String, String)> {
    // A half can only be a vocabulary piece if some piece has its byte length. Checking
    // that first keeps a long piece from costing its length squared in hashing (each
    // split hashes the half): a file with one 100k-character token took 27 s to load.
    let lengths: HashSet<usize> = vocab.keys().map(String::len).collect();
    // (left id, right id, score, left chars, right chars)
    let mut merges: Vec<(u32, u32, f32, usize, usize)> = Vec::new();
    for (id, (piece, &score)) in tokens.iter().zip(scores).enumerate() {
        if vocab.get(piece.as_str()) != Some(&(id as u32)) {
            continue; // a duplicate spelling: only its first id is in the vocabulary
        }
        let n_chars = piece.chars().count();
        let mut local = Vec::new();
        for (k, (i, _)) in piece.char_indices().enumerate().skip(1) {
            if !lengths.contains(&i) || !lengths.contains(&(piece.len() - i)) {
                continue;
            }
            let (l, r) = piece.split_at(i);
            if let (Some(&li), Some(&ri)) = (vocab.get(l), vocab.get(r)) {
                local.push((li, ri, score, k, n_chars - k));
            }
        }
        local.sort_by_key(|&(l, r, ..)| (l, r));
        merges.extend(local);
    }
    merges.sort_by(|a, b| b.2.partial_cmp(&a.2).unwrap_or(std::cmp::Ordering::Equal).then(b.3.cmp(&a.3)).then(b.4.cmp(&a.4)));
    merges.into_iter().map(|(l, r, ..)| (tokens[l as usize].clone(), tokens[r as usize].clone())).collect()
}

fn build_llama(v: &GgufVocab, vocab: Vocab) -> Result<tokenizers::Tokenizer> {
    let scores: Vec<f32> = match &v.scores {
        Some(s) => s.clone(),
        None => (0..v.tokens.len()).map(|i| -(i as f32)).collect(),
    };
    let merges = spm_merges(&v.tokens, &scores, &vocab);
    let unk = v.unk_id.map(|i| v.tokens[i as usize].clone()).or_else(|| vocab.contains_key("<unk>").then(|| "<unk>".to_string()));
    let mut builder = BPE::builder().vocab_and_merges(vocab, merges).fuse_unk(true).byte_fallback(true);
    if let Some(u) = unk {
        builder = builder.unk_token(u);
    }
    let bpe = builder.build().map_err(|e| err(format!("SentencePiece BPE: {e}")))?;
    let mut tok = tokenizers::Tokenizer::new(bpe);
    // llama.cpp puts a space before every text fragment (the start, and after each special
    // or user-defined token) unless `add_space_prefix` is false (Gemma); HF's Prepend runs on
    // each fragment between added tokens, which is the same set.
    let space_prefix = v.add_space_prefix.unwrap_or(true);
    let mut norm = Vec::new();
    if space_prefix {
        norm.push(NormalizerWrapper::Prepend(Prepend::new("▁".to_string())));
    }
    norm.push(NormalizerWrapper::Replace(Replace::new(" ", "▁").map_err(|e| err(e.to_string()))?));
    tok.with_normalizer(Some(NormSequence::new(norm)));
    let mut dec = vec![
        DecoderWrapper::Replace(Replace::new("▁", " ").map_err(|e| err(e.to_string()))?),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if space_prefix {
        dec.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    tok.with_decoder(Some(DecoderSequence::new(dec)));
    Ok(tok)
}
