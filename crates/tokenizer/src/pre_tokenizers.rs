//! The byte-level BPE pre-tokenizers llama.cpp knows: every `tokenizer.ggml.pre` name
//! it accepts, mapped to its `LLAMA_VOCAB_PRE_TYPE_*`, that type's split regexes and
//! the flags llama.cpp sets with it.
//!
//! Owner: `engram-tokenizer`. Source of truth: `src/llama-vocab.cpp` of llama.cpp (the
//! `tokenizer_pre == "..."` chain in `llama_vocab::impl::load` and the constructor of
//! `llm_tokenizer_bpe`) and `src/unicode.cpp` (`unicode_regex_split`). Invariants:
//! * each regex of a type splits every piece the previous one left, keeping both the
//!   matches and the text between them (llama.cpp's `unicode_regex_split_stl`, HF's
//!   `Split` with `Isolated`);
//! * the regexes are llama.cpp's, rewritten for Oniguruma so that they mean what
//!   llama.cpp runs: llama.cpp collapses every code point above U+007F to one byte per
//!   category (letter, number, punctuation, mark, symbol; whitespace to `\x0B`) before
//!   `std::regex` sees it, so `\p{Lu}`, `\p{Ll}`, `\p{Lt}`, `\p{Lm}` and `\p{Lo}` all
//!   mean `\p{L}` there; `\d` is ECMAScript's `[0-9]`; `$` is the end of the piece
//!   (`\z`); the patterns llama.cpp runs with custom code (`\p{Han}+` for Kimi K2,
//!   `\p{AFMoE_digits}`, Tiny Aya's digit groups) are spelled as the regex that code
//!   implements;
//! * a name llama.cpp does not know is not here: [`lookup`] returns `None` and the
//!   caller reports it, never falling back to another type.

/// One llama.cpp pre-tokenizer type (`LLAMA_VOCAB_PRE_TYPE_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreType {
    /// llama.cpp's enum name, without the `LLAMA_VOCAB_PRE_TYPE_` prefix.
    pub kind: &'static str,
    /// The split regexes, in order (Oniguruma syntax, see the module doc).
    pub regexes: &'static [&'static str],
    /// Bytes are mapped through GPT-2's byte-to-character table before BPE (false for
    /// SentencePiece-style BPE on raw UTF-8: Gemma 4, Sarvam, whitespace).
    pub byte_encode: bool,
    /// Spaces become `▁` before splitting (`escape_whitespaces`; Gemma 4, Sarvam).
    pub escape_whitespaces: bool,
}

/// Flags llama.cpp sets per `tokenizer.ggml.pre` name (not per type: two names of one
/// type may differ, e.g. `chatglm-bpe` and `glm4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreFlags {
    /// A piece that is itself a vocabulary entry becomes that token without merging.
    pub ignore_merges: bool,
    /// llama.cpp's `clean_spaces` (`clean_up_tokenization_spaces`) for detokenization.
    /// NOTE: recorded, not applied: the streaming decoder must concatenate to the full
    /// decode, which a cleanup that looks at the next token would break.
    pub clean_spaces: bool,
    /// The default for `add_bos` when the file has no `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
    /// llama.cpp clears the BOS id for this name (`chatglm-bpe`, `glm4`, `glm5`), but a
    /// `tokenizer.ggml.bos_token_id` in the file sets it again.
    pub clears_bos: bool,
}

const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// `\p{AFMoE_digits}` (and Tiny Aya's `\d{1,3}(?=(?:\d{3})*\b)`, which llama.cpp runs with
/// the same code): a run of numbers split in threes from the right.
const DIGIT_GROUPS: &str = r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))";
/// `[^\n]+|[\n]+`: runs of newlines apart from the rest.
const NEWLINES: &str = r"[^\n]+|[\n]+";
/// llama.cpp's `unicode_cpt_is_han` ranges.
macro_rules! han {
    () => {
        r"\x{4E00}-\x{9FFF}\x{3400}-\x{4DBF}\x{20000}-\x{2A6DF}\x{2A700}-\x{2B73F}\x{2B740}-\x{2B81F}\x{2B820}-\x{2CEAF}\x{2CEB0}-\x{2EBEF}\x{F900}-\x{FAFF}\x{2F800}-\x{2FA1F}"
    };
}

/// The pre-tokenizer types, one entry per `LLAMA_VOCAB_PRE_TYPE_*` llama.cpp gives regexes.
const TYPES: &[PreType] = &[
    bl("DEFAULT", &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"]),
    bl("LLAMA3", &[LLAMA3]),
    bl(
        "JAIS2",
        &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)|\s{1,2}(?!\S)|\s{1}",
        ],
    ),
    bl("DBRX", &[LLAMA3]),
    bl("SMAUG", &[LLAMA3]),
    bl(
        "DEEPSEEK_LLM",
        &[
            "[\r\n]",
            r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+",
            r"\s?[!-/:-~！-／：-～‘-‟　-。]+",
            r"\s+\z",
            "[一-龥ࠀ-一가-퟿]+",
            r"\p{N}+",
        ],
    ),
    bl("DEEPSEEK3_LLM", DEEPSEEK3),
    bl("HUNYUAN_DENSE", DEEPSEEK3),
    bl("JOYAI_LLM", DEEPSEEK3),
    bl("HY_V4", DEEPSEEK3),
    bl(
        "SPARK2_5",
        &[
            r"\p{N}{1,3}",
            "[一-龥぀-ゟ゠-ヿ]+",
            r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+"##,
            r"\p{N}",
        ],
    ),
    bl(
        "YOUTU",
        &[
            "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥぀-ゟ゠-ヿ]+",
            r"[^\r\n\p{L}\p{N}]?[\p{L}\p{L}\p{L}\p{L}\p{M}]*[\p{L}\p{L}\p{L}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}\p{L}\p{L}\p{L}\p{M}]+[\p{L}\p{L}\p{L}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
    ),
    bl("DEEPSEEK_CODER", &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"]),
    bl("FALCON", &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
    bl("STARCODER", STARCODER),
    bl("REFACT", STARCODER),
    bl("COMMAND_R", STARCODER),
    bl("SMOLLM", STARCODER),
    bl("CODESHELL", STARCODER),
    bl("EXAONE", STARCODER),
    bl("MINERVA", STARCODER),
    bl("MELLUM2", STARCODER),
    bl("GPT2", &[GPT2]),
    bl("MPT", &[GPT2]),
    bl("OLMO", &[GPT2]),
    bl("JAIS", &[GPT2]),
    bl("TRILLION", &[GPT2]),
    bl("GRANITE_DOCLING", &[GPT2]),
    bl("STABLELM2", &[QWEN2]),
    bl("QWEN2", &[QWEN2]),
    bl("HUNYUAN", &[QWEN2]),
    bl("SOLAR_OPEN", &[QWEN2]),
    bl(
        "QWEN35",
        &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
    ),
    bl("PORO", BLOOM),
    bl("BLOOM", BLOOM),
    bl("GPT3_FINNISH", BLOOM),
    bl("CHATGLM4", &[LLAMA3]),
    bl("VIKING", &[r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"]),
    bl(
        "TEKKEN",
        &[
            r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
    ),
    bl(
        "CHAMELEON",
        &["<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2],
    ),
    bl("GPT4O", GPT4O),
    bl("MINIMAX_M2", GPT4O),
    bl(
        "GRANITE_EMB_MULTI",
        &[
            r"[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))*((?=[\p{L}\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}\p{M}])([^a-z]))+((?=[\p{L}\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
    ),
    bl(
        "TINY_AYA",
        &[
            DIGIT_GROUPS,
            r"[^\r\n\p{L}\p{N}]?[\p{L}\p{L}\p{L}\p{L}\p{M}]*[\p{L}\p{L}\p{L}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{L}\p{L}\p{L}\p{L}\p{M}]+[\p{L}\p{L}\p{L}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
    ),
    bl(
        "KIMI_K2",
        &[concat!(
            "[",
            han!(),
            r"]+",
            r"|[^\r\n\p{L}\p{N}]?[\p{L}&&[^",
            han!(),
            r"]]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?",
            r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )],
    ),
    bl("SUPERBPE", &[r"\p{N}+", r"(?=([0-9]{3})+(?![0-9]))"]),
    bl(
        "BAILINGMOE",
        &[r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"],
    ),
    bl(
        "SEED_CODER",
        &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
    ),
    bl("UFAKZEKA", &[r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]),
    bl("GROK_2", &[QWEN2]),
    bl(
        "AFMOE",
        &[
            DIGIT_GROUPS,
            "[一-鿿㐀-䶿豈-﫿぀-ゟ゠-ヿ･-ﾟ⼀-⿟เ-๿຀-໿ក-៿က-႟ꩠ-ꩿꧠ-꧿가-힯ᄀ-ᇿ]+",
            r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
        ],
    ),
    bl("LAGUNA", &[NEWLINES, QWEN2]),
    bl(
        "EXAONE_MOE",
        &[
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
        ],
    ),
    PreType { kind: "GEMMA4", regexes: &[NEWLINES], byte_encode: false, escape_whitespaces: true },
    PreType { kind: "SARVAM_MOE", regexes: &[NEWLINES], byte_encode: false, escape_whitespaces: true },
    bl(
        "MINICPM5",
        &[
            r"\p{N}{1,3}",
            r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ],
    ),
    PreType { kind: "WHITESPACE", regexes: &[r"\S+"], byte_encode: false, escape_whitespaces: false },
];

const DEEPSEEK3: &[&str] = &[
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];
const STARCODER: &[&str] = &[r"\p{N}", GPT2];
const BLOOM: &[&str] = &[r" ?[^(\s|.,!?…。，、।۔،)]+"];
const GPT4O: &[&str] = &[
    r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
];

/// A byte-level type.
const fn bl(kind: &'static str, regexes: &'static [&'static str]) -> PreType {
    PreType { kind, regexes, byte_encode: true, escape_whitespaces: false }
}

/// `tokenizer.ggml.pre` names llama.cpp accepts, in the order of its chain, each with its
/// type and flags (from the BPE defaults [`F`]: `.im()` ignore_merges, `.nc()` no
/// clean_spaces, `.bos()` add_bos, `.no_bos()` BOS id cleared).
const NAMES: &[(&str, &str, Flags)] = &[
    ("default", "DEFAULT", F),
    ("minicpm5", "MINICPM5", F.im()),
    ("llama3", "LLAMA3", F.im().bos()),
    ("llama-v3", "LLAMA3", F.im().bos()),
    ("llama-bpe", "LLAMA3", F.im().bos()),
    ("falcon3", "LLAMA3", F.im().bos()),
    ("falcon-h1", "LLAMA3", F.im().bos()),
    ("pixtral", "LLAMA3", F.im().bos()),
    ("midm-2.0", "LLAMA3", F.im().bos()),
    ("lfm2", "LLAMA3", F.im().bos()),
    ("jina-v5-nano", "LLAMA3", F.im().bos()),
    ("deepseek-llm", "DEEPSEEK_LLM", F.nc()),
    ("deepseek-coder", "DEEPSEEK_CODER", F.nc()),
    ("deepseek-v3", "DEEPSEEK3_LLM", F.nc()),
    ("spark2_5", "SPARK2_5", F.nc()),
    ("youtu", "YOUTU", F.nc().im()),
    ("falcon", "FALCON", F),
    ("mpt", "MPT", F),
    ("starcoder", "STARCODER", F),
    ("gpt-2", "GPT2", F),
    ("phi-2", "GPT2", F),
    ("jina-es", "GPT2", F),
    ("jina-de", "GPT2", F),
    ("gigachat", "GPT2", F),
    ("jina-v2-es", "GPT2", F),
    ("jina-v2-de", "GPT2", F),
    ("a.x-4.0", "GPT2", F),
    ("mellum", "GPT2", F),
    ("modern-bert", "GPT2", F),
    ("jais-2", "JAIS2", F),
    ("gemma4", "GEMMA4", F),
    ("granite-embed-multi-311m", "GEMMA4", F),
    ("sarvam-moe", "SARVAM_MOE", F.nc()),
    ("jina-v1-en", "GPT2", F),
    ("jina-v2-code", "GPT2", F),
    ("roberta-bpe", "GPT2", F),
    ("whitespace", "WHITESPACE", F),
    ("refact", "REFACT", F),
    ("command-r", "COMMAND_R", F.nc()),
    ("qwen2", "QWEN2", F.nc()),
    ("deepseek-r1-qwen", "QWEN2", F.nc()),
    ("kormo", "QWEN2", F.nc()),
    ("f2llmv2", "QWEN2", F.nc()),
    ("qwen35", "QWEN35", F.nc()),
    ("stablelm2", "STABLELM2", F),
    ("olmo", "OLMO", F),
    ("dbrx", "DBRX", F),
    ("smaug-bpe", "SMAUG", F),
    ("poro-chat", "PORO", F.nc()),
    ("chatglm-bpe", "CHATGLM4", F.no_bos()),
    ("glm4", "CHATGLM4", F.no_bos().im()),
    ("glm5", "CHATGLM4", F.no_bos().im()),
    ("viking", "VIKING", F.nc()),
    ("jais", "JAIS", F),
    ("tekken", "TEKKEN", F.nc().im().bos()),
    ("smollm", "SMOLLM", F.nc()),
    ("codeshell", "CODESHELL", F),
    ("bloom", "BLOOM", F),
    ("gpt3-finnish", "GPT3_FINNISH", F),
    ("exaone", "EXAONE", F),
    ("exaone4", "GPT2", F),
    ("exaone-moe", "EXAONE_MOE", F),
    ("chameleon", "CHAMELEON", F.bos().nc()),
    ("minerva-7b", "MINERVA", F),
    ("megrez", "QWEN2", F),
    ("gpt-4o", "GPT4O", F.nc()),
    ("llama4", "GPT4O", F.nc()),
    ("kanana2", "GPT4O", F.nc()),
    ("talkie", "GPT4O", F.nc()),
    ("granite-embed-multi-97m", "GRANITE_EMB_MULTI", F.nc().im()),
    ("tiny_aya", "TINY_AYA", F.nc()),
    ("cohere2moe", "TINY_AYA", F.nc()),
    ("superbpe", "SUPERBPE", F.nc()),
    ("trillion", "TRILLION", F.nc()),
    ("granite-docling", "GRANITE_DOCLING", F.nc()),
    ("bailingmoe", "BAILINGMOE", F.nc()),
    ("bailingmoe2", "BAILINGMOE", F.nc()),
    ("llada-moe", "BAILINGMOE", F.nc()),
    ("seed-coder", "SEED_CODER", F.nc()),
    ("hunyuan", "HUNYUAN", F.nc()),
    ("hunyuan-dense", "HUNYUAN_DENSE", F.nc()),
    ("hy_v4", "HY_V4", F.nc()),
    ("joyai-llm", "JOYAI_LLM", F.nc()),
    ("kimi-k2", "KIMI_K2", F.nc()),
    ("ufakzeka", "UFAKZEKA", F.nc()),
    ("grok-2", "GROK_2", F.nc()),
    ("afmoe", "AFMOE", F.nc()),
    ("laguna", "LAGUNA", F.nc()),
    ("minimax-m2", "MINIMAX_M2", F.nc()),
    ("solar-open", "SOLAR_OPEN", F.nc()),
    ("mellum2", "MELLUM2", F),
];

/// Short name for the table's flags column.
type Flags = PreFlags;
/// llama.cpp's BPE defaults: merges used, `clean_spaces = true`, no BOS by default.
const F: Flags = PreFlags { ignore_merges: false, clean_spaces: true, add_bos: false, clears_bos: false };
impl PreFlags {
    const fn im(self) -> Self {
        PreFlags { ignore_merges: true, ..self }
    }
    const fn nc(self) -> Self {
        PreFlags { clean_spaces: false, ..self }
    }
    const fn bos(self) -> Self {
        PreFlags { add_bos: true, ..self }
    }
    const fn no_bos(self) -> Self {
        PreFlags { clears_bos: true, ..self }
    }
}

/// Where the list of names comes from, for error messages.
pub(crate) const SOURCE: &str =
    "llama.cpp src/llama-vocab.cpp (llama_vocab::impl::load); Engram's copy: crates/tokenizer/src/pre_tokenizers.rs";

/// The type and flags of a `tokenizer.ggml.pre` name, or `None` if llama.cpp does not know it.
pub fn lookup(name: &str) -> Option<(PreType, PreFlags)> {
    let &(_, kind, flags) = NAMES.iter().find(|(n, ..)| *n == name)?;
    let ty = *TYPES.iter().find(|t| t.kind == kind).expect("every name's type is in TYPES");
    Some((ty, flags))
}

/// Every `tokenizer.ggml.pre` name llama.cpp accepts, in the order of its loader.
pub fn names() -> impl Iterator<Item = &'static str> {
    NAMES.iter().map(|(n, ..)| *n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::SplitDelimiterBehavior;

    #[test]
    fn every_name_has_a_type_and_every_regex_compiles() {
        for name in names() {
            let (ty, _) = lookup(name).unwrap();
            for re in ty.regexes {
                let split = Split::new(SplitPattern::Regex(re.to_string()), SplitDelimiterBehavior::Isolated, false);
                split.unwrap_or_else(|e| panic!("{name}: {re}: {e}"));
            }
        }
        for t in TYPES {
            assert!(NAMES.iter().any(|(_, k, _)| *k == t.kind), "type {} has no name", t.kind);
        }
        assert!(lookup("mystery").is_none());
        assert_eq!(names().count(), NAMES.len());
    }
}
