#!/usr/bin/env python3
"""Token-for-token goldens from llama.cpp for every `tokenizer.ggml.pre` name it knows.

For each name, a vocabulary-only GGUF is written that carries a real vocabulary with
`tokenizer.ggml.pre` set to that name (and no `add_bos_token`/`add_eos_token`, so the
name's own defaults show); llama.cpp (llama-cpp-python, `Llama(path, vocab_only=True)`)
tokenizes the corpus with it. Vocabularies:
  * most names: llama.cpp's `models/ggml-vocab-gpt-2.gguf` (`whitespace` too: llama.cpp
    aborts on it with the Gemma 4 vocabulary);
  * Gemma 4 and Sarvam (SentencePiece-style BPE on raw UTF-8):
    `models/ggml-vocab-gemma-4.gguf` with `tokenizer.ggml.model` set to `gpt2`, so the
    name decides;
  * `smollm2`: the real SmolLM2-135M-Instruct file as it is installed (pre `smollm`).
The Rust test (crates/tokenizer/tests/it/llama_cpp_pre.rs) rebuilds each vocabulary the
same way and compares.

Also flag variants (VARIANTS: llama.cpp's `ggml-vocab-llama-spm.gguf` and
`ggml-vocab-gpt-2.gguf` with add_space_prefix / add_bos_token / add_eos_token set) and
`ggml-vocab-gemma-4.gguf` as it is (model `gemma4`, as real Gemma 4 files say), which
scripts/golden_tokenizers_hf.py also hands to transformers.

Writes crates/tokenizer/tests/data/pre_corpus.json (the corpus) and
crates/tokenizer/tests/data/pre_goldens.json: for each vocabulary, groups of names whose
outputs are the same, each with the ids of every corpus line (special tokens parsed, no
BOS/EOS; null where llama.cpp aborts, e.g. `whitespace` on a run of spaces) and the ids of "Hello world" with the model's BOS/EOS rule.

Run from the repository root with a Python that has `gguf` (the writer; else llama.cpp's
gguf-py is used) and point --llama-python at one with llama-cpp-python:
  python3 scripts/golden_tokenizers.py --llama-python /path/to/venv/bin/python \
      --llama-cpp /path/to/llama.cpp --smollm2 /path/to/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import argparse
import json
import os
import re
import sys
import tempfile

CORPUS = [
    "Hello world",
    " Hello world",
    "Hello World HELLO wOrLd",
    "The KV cache keeps keys and values, per layer, per head.",
    "I'm sure you'll see it's what they've done; we'd LOVE it, wouldn'T we? 'Re 'S",
    "Grüße aus München: Äpfel, Öl und Übermaß — straße!",
    "我们今天去公园散步，天气很好。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 문장입니다.",
    "مرحبا بالعالم، هذا نص عربي.",
    "Привет, мир! Ёжик.",
    "हिन्दी पाठ का उदाहरण",
    "def parse(argv=None):\n    \"\"\"Parse args.\"\"\"\n    return {'a': [1, 2], \"b\": argv or []}\n",
    "fn main() {\n\tprintln!(\"{}\", 1 + 2); // done\n}\n",
    "   leading spaces and trailing   ",
    "a  b   c    d\t\te\t \tf",
    "\n",
    "\n\n\n",
    " \n \n\n  \n",
    "line one\r\nline two\n\nline four\r\r\n",
    "\t",
    "   ",
    "1 12 123 1234 12345 123456 1234567 3.14159 1,000,000",
    "x=10000000000; y2k; ٣٤٥ ²³ ½",
    "emoji 🚀🔥✅ and flags 🇫🇷 and family 👨‍👩‍👧 ok",
    "rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𓀀 and combining e\u0301 a\u0308 n\u0303",
    "$100 + 5% <= 7^2 | x~y `code` @user #tag & done...",
    "!!! ??? ... --- *** ___ ((())) [[]] {{}}",
    "MixedCASEWords camelCase snake_case kebab-case HTTPServer iPhone",
    "\u00a0non-breaking\u3000ideographic\u2003em space",
    "zero\u200bwidth\u200djoiner",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after<|endoftext|>",
    "<s>bos like</s>",
    "IMGIMGABZ <sentinel:12> chameleon-style",
    "",
]
PROBE = "Hello world"
# Flag variants of whole vocabularies: (vocab file, label, keys set on it).
VARIANTS = [
    ("llama-spm", "as-is", {}),
    ("llama-spm", "no-space-prefix", {"tokenizer.ggml.add_space_prefix": False}),
    ("llama-spm", "eos-not-bos", {"tokenizer.ggml.add_bos_token": False, "tokenizer.ggml.add_eos_token": True}),
    ("gpt-2", "bos-and-eos", {"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True}),
    ("gemma-4", "as-is", {}),
]


def load_gguf(llama_cpp):
    try:
        import gguf  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(llama_cpp, "gguf-py"))
    import gguf
    return gguf


def pre_names(llama_cpp):
    """The names llama.cpp's loader accepts, in its order (from src/llama-vocab.cpp)."""
    src = open(os.path.join(llama_cpp, "src", "llama-vocab.cpp"), encoding="utf-8").read()
    chain = src[src.index('} else if (tokenizer_pre == "minicpm5")') - 200 : src.index("unknown pre-tokenizer type")]
    names = []
    for n in re.findall(r'tokenizer_pre == "([^"]+)"', chain):
        if n not in names:
            names.append(n)
    return names


_META = {}


def read_meta(gguf, src):
    """The metadata of `src` as (key, value, type, element type) rows, read once."""
    if src not in _META:
        r = gguf.GGUFReader(src)
        rows = []
        for f in r.fields.values():
            if f.name.startswith("GGUF."):
                continue
            vtype = f.types[0]
            sub = f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
            rows.append((f.name, f.contents(), vtype, sub))
        _META[src] = rows
    return _META[src]


def copy_vocab(gguf, src, dst, overrides, drop):
    """Write `dst`: the metadata of `src` (no tensors), `overrides` set, `drop` removed."""
    rows = read_meta(gguf, src)
    arch = next(v for k, v, _, _ in rows if k == "general.architecture")
    w = gguf.GGUFWriter(dst, arch)
    for k, v, vtype, sub in rows:
        if k == "general.architecture" or k in drop or k in overrides:
            continue
        w.add_key_value(k, v, vtype, sub_type=sub)
    for k, v in overrides.items():
        vt = gguf.GGUFValueType.BOOL if isinstance(v, bool) else gguf.GGUFValueType.STRING
        w.add_key_value(k, v, vt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


TOKENIZE = """
import json, sys, llama_cpp
corpus, probe = json.loads(sys.stdin.read())
m = llama_cpp.Llama(sys.argv[1], vocab_only=True, verbose=False)
lines = [m.tokenize(t.encode("utf-8"), add_bos=False, special=True) for t in corpus]
print(json.dumps({"version": llama_cpp.__version__, "lines": lines, "probe": m.tokenize(probe.encode("utf-8"), add_bos=True, special=True)}))
"""


def run_llama(python, path, corpus):
    import subprocess

    r = subprocess.run([python, "-c", TOKENIZE, path], input=json.dumps([corpus, PROBE]), capture_output=True, text=True)
    if r.returncode != 0:
        failed = [l for l in r.stderr.splitlines() if "failed" in l or "error" in l.lower()]
        return "llama.cpp aborts: " + (failed[-1].split("llama.cpp/")[-1] if failed else f"exit {r.returncode}")
    return json.loads(r.stdout)


def tokenize_all(python, paths):
    """llama.cpp's ids for the corpus and the probe, per GGUF path, each run by `python`
    (an interpreter with llama-cpp-python) in a process of its own, since llama.cpp aborts
    on some inputs: then each line runs alone and a line llama.cpp aborts on is `None`
    (its reason printed). Also returns llama-cpp-python's version."""
    res, version = {}, None
    for p in paths:
        out = run_llama(python, p, CORPUS)
        if isinstance(out, str):
            lines = []
            for t in CORPUS:
                one = run_llama(python, p, [t])
                if isinstance(one, str):
                    print(f"{os.path.basename(p)}: {t!r}: {one}", file=sys.stderr)
                lines.append(None if isinstance(one, str) else one["lines"][0])
                out = one if not isinstance(one, str) else out
            probe = out["probe"] if isinstance(out, dict) else None
            res[p] = (lines, probe)
            continue
        res[p], version = (out["lines"], out["probe"]), out["version"]
    return res, version


def grouped(results):
    """{name: (lines, probe)} -> [{names, lines, probe}] with equal outputs grouped."""
    groups = []
    for name, (lines, probe) in results.items():
        for g in groups:
            if g["lines"] == lines and g["probe"] == probe:
                g["names"].append(name)
                break
        else:
            groups.append({"names": [name], "probe": probe, "lines": lines})
    return groups


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (vendor/llama.cpp of the sdist)")
    ap.add_argument("--smollm2", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="crates/tokenizer/tests/data")
    ap.add_argument("--llama-python", default=sys.executable, help="a Python with llama-cpp-python (default: this one)")
    a = ap.parse_args()
    gguf = load_gguf(a.llama_cpp)
    models = os.path.join(a.llama_cpp, "models")
    raw_utf8 = {"gemma4", "granite-embed-multi-311m", "sarvam-moe"}
    drop = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"}
    out = {"gpt-2": {}, "gemma-4": {}}
    with tempfile.TemporaryDirectory() as tmp:
        jobs = []
        for name in pre_names(a.llama_cpp):
            vocab = "gemma-4" if name in raw_utf8 else "gpt-2"
            dst = os.path.join(tmp, f"{name}.gguf")
            over = {"tokenizer.ggml.pre": name}
            if vocab == "gemma-4":
                over["tokenizer.ggml.model"] = "gpt2"
            copy_vocab(gguf, os.path.join(models, f"ggml-vocab-{vocab}.gguf"), dst, over, drop)
            jobs.append((vocab, name, dst))
        variant_jobs = []
        for vocab, label, over in VARIANTS:
            dst = os.path.join(tmp, f"{vocab}-{label}.gguf")
            copy_vocab(gguf, os.path.join(models, f"ggml-vocab-{vocab}.gguf"), dst, over, set())
            variant_jobs.append((vocab, label, over, dst))
        res, version = tokenize_all(a.llama_python, [j[2] for j in jobs] + [j[3] for j in variant_jobs] + [a.smollm2])
        for vocab, name, dst in jobs:
            out[vocab][name] = res[dst]
    smol = res[a.smollm2]
    variants = [
        {"vocab": vocab, "label": label, "overrides": over, "probe": res[dst][1], "lines": res[dst][0]}
        for vocab, label, over, dst in variant_jobs
    ]
    goldens = {
        "generator": f"scripts/golden_tokenizers.py (llama-cpp-python {version})",
        "probe": PROBE,
        "vocabs": {
            "gpt-2": grouped(out["gpt-2"]),
            "gemma-4": grouped(out["gemma-4"]),
            "smollm2": [{"names": ["smollm"], "probe": smol[1], "lines": smol[0]}],
        },
    }
    with open(os.path.join(a.out, "pre_corpus.json"), "w", encoding="utf-8") as f:
        json.dump(CORPUS, f, ensure_ascii=False, indent=0)
        f.write("\n")
    with open(os.path.join(a.out, "pre_goldens.json"), "w", encoding="utf-8") as f:
        # one group per line block, one corpus line per line: compact and diffable
        f.write("{\n")
        f.write(f'"generator": {json.dumps(goldens["generator"])},\n"probe": {json.dumps(PROBE)},\n"vocabs": {{\n')
        vs = list(goldens["vocabs"].items())
        for vi, (v, groups) in enumerate(vs):
            f.write(f"{json.dumps(v)}: [\n")
            for gi, g in enumerate(groups):
                f.write(f'{{"names": {json.dumps(g["names"])}, "probe": {json.dumps(g["probe"])}, "lines": [\n')
                f.write(",\n".join(json.dumps(l) for l in g["lines"]))
                f.write("\n]}" + ("," if gi + 1 < len(groups) else "") + "\n")
            f.write("]" + ("," if vi + 1 < len(vs) else "") + "\n")
        f.write("},\n\"variants\": [\n")
        for i, v in enumerate(variants):
            head = {k: v[k] for k in ("vocab", "label", "overrides", "probe")}
            f.write(json.dumps(head)[:-1] + ', "lines": [\n' + ",\n".join(json.dumps(l) for l in v["lines"]) + "\n]}")
            f.write(("," if i + 1 < len(variants) else "") + "\n")
        f.write("]\n}\n")
    n_groups = sum(len(g) for g in goldens["vocabs"].values())
    print(f"{sum(len(x) for x in out.values()) + 1} names, {n_groups} distinct outputs", file=sys.stderr)


if __name__ == "__main__":
    main()
