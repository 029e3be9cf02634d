#!/usr/bin/env python3
"""Faithfulness on real files: top-1 next-token agreement with transformers, Engram beside llama.cpp.

For each GGUF file, the same token ids (the held-out text tokenized by llama.cpp's own tokenizer
for that file, first --positions tokens) go through three implementations:
  * transformers: `AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`, which dequantizes
    the file's weights to float32 (the reference: the same weights, computed in full precision);
    a Mixtral file (`llama` with expert tensors, which that loader reads as dense) goes to
    `MixtralForCausalLM` on the `gguf` package's dequantization instead (scripts/gguf_mixtral_hf.py);
  * llama.cpp through llama-cpp-python (`logits_all`), on the file itself;
  * Engram: `target/release/examples/next_token_argmax` (crates/kv/examples), on the file itself,
    exact f32 KV.
It prints, per file, the share of positions whose argmax equals transformers' argmax for Engram
and for llama.cpp, and the difference in points (the goal: Engram >= llama.cpp - 0.5).

Three interpreters, because torch and llama-cpp-python live in their own venvs here:
  python3 scripts/faithfulness.py --text FILE --gguf A.gguf [--gguf B.gguf ...] \
      --torch-python VENV_T/bin/python --llama-python VENV_L/bin/python [--positions 2048]
(build the example first: `cargo build --release -p engram-kv --example next_token_argmax`;
VENV_L from `llamacpp-yardstick setup`, VENV_T with `pip install torch transformers gguf`).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "target", "release", "examples", "next_token_argmax")


def child_tokenize(gguf, text_path, n):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=gguf, vocab_only=True, verbose=False)
    ids = llm.tokenize(open(text_path, encoding="utf-8").read().encode("utf-8"), add_bos=True, special=False)
    return ids[:n]


def child_llama(gguf, ids_path):
    import numpy as np
    import llama_cpp
    ids = json.load(open(ids_path))
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=len(ids) + 16, n_batch=512, n_threads=os.cpu_count(),
                          logits_all=True, verbose=False)
    llm.eval(ids)
    scores = np.asarray(llm.scores[: len(ids)])
    return [int(i) for i in scores.argmax(axis=1)]


def child_hf(gguf, ids_path):
    import torch
    from transformers import AutoModelForCausalLM
    import gguf_mixtral_hf
    ids = json.load(open(ids_path))
    if gguf_mixtral_hf.is_mixtral(gguf):
        model = gguf_mixtral_hf.load(gguf)
    else:
        model = AutoModelForCausalLM.from_pretrained(os.path.dirname(os.path.abspath(gguf)), gguf_file=os.path.basename(gguf),
                                                     torch_dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0]
    return [int(i) for i in logits.argmax(dim=-1)]


def run_child(python, *args):
    out = subprocess.run([python, os.path.abspath(__file__), "--child", *args], check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def agreement(a, b):
    return 100.0 * sum(x == y for x, y in zip(a, b)) / len(a)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    ap.add_argument("--gguf", action="append", default=[])
    ap.add_argument("--text")
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--torch-python", default=sys.executable)
    ap.add_argument("--llama-python", default=sys.executable)
    ap.add_argument("--engram-example", default=EXAMPLE)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    if a.child:
        kind, *rest = a.child
        fn = {"tokenize": lambda g, t, n: child_tokenize(g, t, int(n)), "llama": child_llama, "hf": child_hf}[kind]
        print(json.dumps(fn(*rest)))
        return
    if not a.gguf or not a.text:
        ap.error("--gguf and --text are required")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for gguf in a.gguf:
            ids = run_child(a.llama_python, "tokenize", gguf, a.text, str(a.positions))
            ids_path = os.path.join(tmp, "ids.json")
            json.dump(ids, open(ids_path, "w"))
            hf = run_child(a.torch_python, "hf", gguf, ids_path)
            lcpp = run_child(a.llama_python, "llama", gguf, ids_path)
            out = subprocess.run([a.engram_example, gguf, ids_path], check=True, capture_output=True, text=True)
            engram = json.loads(out.stdout.strip().splitlines()[-1])["argmax"]
            row = {"file": os.path.basename(gguf), "positions": len(ids),
                   "engram_vs_hf": round(agreement(engram, hf), 2), "llamacpp_vs_hf": round(agreement(lcpp, hf), 2),
                   "engram_vs_llamacpp": round(agreement(engram, lcpp), 2)}
            row["engram_minus_llamacpp"] = round(row["engram_vs_hf"] - row["llamacpp_vs_hf"], 2)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    print("| file | positions | Engram = transformers | llama.cpp = transformers | Engram - llama.cpp (points) | Engram = llama.cpp |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['file']} | {r['positions']} | {r['engram_vs_hf']:.2f}% | {r['llamacpp_vs_hf']:.2f}% | "
              f"{r['engram_minus_llamacpp']:+.2f} | {r['engram_vs_llamacpp']:.2f}% |")
    if a.json_out:
        json.dump(rows, open(a.json_out, "w"), indent=1)


if __name__ == "__main__":
    main()
