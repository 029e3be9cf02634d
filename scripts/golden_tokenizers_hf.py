#!/usr/bin/env python3
"""Token-for-token goldens from Hugging Face `transformers` for the vocabularies of the llama.cpp goldens.

The second reference next to llama.cpp (scripts/golden_tokenizers.py): for every GGUF vocabulary
that script hands llama.cpp, the same GGUF is written here and loaded with
`AutoTokenizer.from_pretrained(dir, gguf_file=...)`; its tokenization of the same corpus
(`CORPUS` of golden_tokenizers.py, i.e. crates/tokenizer/tests/data/pre_corpus.json) with
`add_special_tokens=False` (special tokens in the text are still matched whole) and of the probe
"Hello world" with `add_special_tokens=True` is written to
crates/tokenizer/tests/data/hf_goldens.json, in the layout of pre_goldens.json (groups of names with
equal outputs). The Rust test crates/tokenizer/tests/it/hf_gguf_parity.rs compares Engram with it and
with llama.cpp.

What is written for transformers (all without tensors; transformers reads the tokenizer from the
`tokenizer.ggml.*` keys and a config from the `<arch>.*` keys, so the architecture's hyperparameters
the vocabulary files already carry stay in):
  * gpt-2, one file per `tokenizer.ggml.pre` name: llama.cpp's `models/ggml-vocab-gpt-2.gguf`
    metadata with `tokenizer.ggml.pre` set and `add_bos_token`/`add_eos_token` removed -- the very
    file golden_tokenizers.py writes. transformers builds every one. It has its own split only for
    the names in its `GGUF_PRE_TOKENIZER_SPLITS` (llama3 family, qwen2 family, qwen35, tekken,
    gpt-4o family, dbrx, smaug-bpe); for any other name it uses GPT-2's byte-level split, so names
    whose llama.cpp split is not GPT-2's come out differently there (the test lists those lines).
  * smollm2: the installed SmolLM2-135M-Instruct.Q4_1.gguf's metadata as it is (architecture
    `llama`, model `gpt2`, pre `smollm`); transformers has no split for `smollm` either.
  * variants (VARIANTS of golden_tokenizers.py): llama.cpp's `ggml-vocab-llama-spm.gguf` (model
    `llama`, SentencePiece) as-is / with `add_space_prefix` false / with EOS and no BOS, and
    `ggml-vocab-gpt-2.gguf` with BOS and EOS; and `ggml-vocab-gemma-4.gguf` as-is (model `gemma4`),
    where `gemma4.attention.head_count_kv`, a per-layer array in the file, is written as its
    maximum (one UINT32): transformers' config reader refuses the array (it expects an int), and
    the tokenizer does not read it. llama.cpp gets the file's metadata unchanged
    (golden_tokenizers.py's `gemma-4 as-is` variant); that count is no input to either tokenizer.

Refused by transformers, so not in hf_goldens.json (listed there under "refused" with the error):
  * gemma-4 with model `gpt2` (pre `gemma4`, `granite-embed-multi-311m`, `sarvam-moe`: a
    SentencePiece-style vocabulary on raw UTF-8 handed to the byte-level loader, as
    golden_tokenizers.py does so that the pre name decides): transformers respells the tokens into
    GPT-2's byte alphabet but not the merges, and `tokenizers` refuses the BPE (a merge's token
    "out of vocabulary"). Real files of these models say model `gemma4`, covered above.

Run from the repository root with a Python that has transformers 5 (with `tokenizers`) and `gguf`:
  python scripts/golden_tokenizers_hf.py --llama-cpp /path/to/llama.cpp \
      --smollm2 /path/to/SmolLM2-135M-Instruct.Q4_1.gguf
It takes a while (transformers reads each 50k-token vocabulary anew, ~100 of them).
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import golden_tokenizers as gt  # noqa: E402  (the corpus, the pre names and the GGUF writer)

# Vocabularies golden_tokenizers.py tokenizes on raw UTF-8 (model set to `gpt2`).
RAW_UTF8 = {"gemma4", "granite-embed-multi-311m", "sarvam-moe"}
DROP_FLAGS = {"tokenizer.ggml.add_bos_token", "tokenizer.ggml.add_eos_token"}
# transformers' GGUF config reader wants an int here; the file has one count per layer.
SCALAR_KV_HEADS = "gemma4.attention.head_count_kv"


def write_gguf(gguf, src, dst, overrides, drop):
    """`dst`: the metadata of `src` (no tensors), `overrides` set, `drop` removed; an array of
    per-layer KV head counts becomes its maximum (see SCALAR_KV_HEADS)."""
    rows = gt.read_meta(gguf, src)
    arch = next(v for k, v, _, _ in rows if k == "general.architecture")
    w = gguf.GGUFWriter(dst, arch)
    for k, v, vtype, sub in rows:
        if k == "general.architecture" or k in drop or k in overrides:
            continue
        if k == SCALAR_KV_HEADS and vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(k, max(v), gguf.GGUFValueType.UINT32)
            continue
        w.add_key_value(k, v, vtype, sub_type=sub)
    for k, v in overrides.items():
        vt = gguf.GGUFValueType.BOOL if isinstance(v, bool) else gguf.GGUFValueType.STRING
        w.add_key_value(k, v, vt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tokenize(path):
    """transformers' ids for the corpus lines and the probe, or the error it refuses the file with."""
    from transformers import AutoTokenizer

    try:
        tk = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    except Exception as e:  # noqa: BLE001  (any refusal is recorded, with its message)
        # one line: a token in the message may be made of newlines
        return f"{type(e).__name__}: {str(e)}".encode("unicode_escape").decode("ascii")
    lines = [tk(t, add_special_tokens=False)["input_ids"] for t in gt.CORPUS]
    return lines, tk(gt.PROBE, add_special_tokens=True)["input_ids"]


def dump_lines(f, lines):
    f.write(",\n".join(json.dumps(l) for l in lines))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp", required=True, help="llama.cpp source tree (vendor/llama.cpp of the sdist)")
    ap.add_argument("--smollm2", required=True, help="SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default="crates/tokenizer/tests/data")
    a = ap.parse_args()
    import tokenizers
    import transformers

    gguf = gt.load_gguf(a.llama_cpp)
    models = os.path.join(a.llama_cpp, "models")
    vocab_file = lambda v: os.path.join(models, f"ggml-vocab-{v}.gguf")  # noqa: E731
    out = {"gpt-2": {}, "gemma-4": {}, "smollm2": {}}
    refused, variants = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in gt.pre_names(a.llama_cpp):
            vocab = "gemma-4" if name in RAW_UTF8 else "gpt-2"
            over = {"tokenizer.ggml.pre": name}
            if vocab == "gemma-4":
                over["tokenizer.ggml.model"] = "gpt2"
            dst = os.path.join(tmp, f"{name}.gguf")
            write_gguf(gguf, vocab_file(vocab), dst, over, DROP_FLAGS)
            res = tokenize(dst)
            os.remove(dst)
            if isinstance(res, str):
                print(f"{vocab} {name}: refused: {res}", file=sys.stderr)
                refused.append({"vocab": vocab, "name": name, "error": res})
            else:
                out[vocab][name] = res
        dst = os.path.join(tmp, "smollm2.gguf")
        write_gguf(gguf, a.smollm2, dst, {}, set())
        res = tokenize(dst)
        if isinstance(res, str):
            sys.exit(f"smollm2: refused: {res}")
        out["smollm2"]["smollm"] = res
        for vocab, label, over in gt.VARIANTS:
            dst = os.path.join(tmp, f"{vocab}-{label}.gguf")
            write_gguf(gguf, vocab_file(vocab), dst, over, set())
            res = tokenize(dst)
            if isinstance(res, str):
                sys.exit(f"{vocab} {label}: refused: {res}")
            variants.append({"vocab": vocab, "label": label, "overrides": over, "probe": res[1], "lines": res[0]})
    generator = f"scripts/golden_tokenizers_hf.py (transformers {transformers.__version__}, tokenizers {tokenizers.__version__})"
    with open(os.path.join(a.out, "hf_goldens.json"), "w", encoding="utf-8") as f:
        # the layout of pre_goldens.json: one group per block, one corpus line per line
        f.write(f'{{\n"generator": {json.dumps(generator)},\n"probe": {json.dumps(gt.PROBE)},\n"vocabs": {{\n')
        vs = [(v, gt.grouped(r)) for v, r in out.items() if r]
        for vi, (v, groups) in enumerate(vs):
            f.write(f"{json.dumps(v)}: [\n")
            for gi, g in enumerate(groups):
                f.write(f'{{"names": {json.dumps(g["names"])}, "probe": {json.dumps(g["probe"])}, "lines": [\n')
                dump_lines(f, g["lines"])
                f.write("\n]}" + ("," if gi + 1 < len(groups) else "") + "\n")
            f.write("]" + ("," if vi + 1 < len(vs) else "") + "\n")
        f.write("},\n\"variants\": [\n")
        for i, v in enumerate(variants):
            head = {k: v[k] for k in ("vocab", "label", "overrides", "probe")}
            f.write(json.dumps(head)[:-1] + ', "lines": [\n')
            dump_lines(f, v["lines"])
            f.write("\n]}" + ("," if i + 1 < len(variants) else "") + "\n")
        f.write("],\n\"refused\": [\n")
        f.write(",\n".join(json.dumps(r, ensure_ascii=False) for r in refused))
        f.write("\n]\n}\n")
    n_names = sum(len(r) for r in out.values())
    n_groups = sum(len(g) for _, g in vs)
    print(f"{n_names} names ({n_groups} distinct outputs), {len(variants)} variants, {len(refused)} refused", file=sys.stderr)


if __name__ == "__main__":
    main()
