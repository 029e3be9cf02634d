#!/usr/bin/env python3
"""llama.cpp on the GGUF files `engram convert` writes for the per-architecture fixtures.

For each shape with a golden file from `scripts/golden_arch.py` (`tiny-qwen3`,
`tiny-phi3`, `tiny-gemma3`, `tiny-gemma2`, `tiny-qwen3-moe`, `tiny-mixtral`, `tiny-gpt-oss`),
generates the fixture's Hugging Face
folder with `engram fixture`, converts it with `engram convert --format f32` (the MoE shape:
the F32 GGUF `engram fixture` writes itself), runs the file in llama.cpp
(llama-cpp-python) on the golden prompt ids, and prints llama.cpp's distance to
transformers: the relative error of the last-position logits (max |diff| / max
|golden|), the positions whose argmax agrees, and whether the greedy continuation
is equal. It shows that llama.cpp reads the files as Engram does (tensor names,
fused Phi-3 tensors, NEOX RoPE, partial rotary, LongRoPE factors, q/k norms,
Gemma's `1 + w` norms, sliding windows and layer patterns, Gemma 2's softcapping, GPT-OSS's
sinks, biases, YaRN and routing). For `tiny-gpt-oss` it also runs the fixture's own file with
MXFP4 experts (`mxfp4_moe`), whose distance is MXFP4's rounding.

NOTE: the folder is copied to `model-hf` before converting, because llama.cpp
gives any file whose `general.name` contains "phi3" the token attributes of
Phi-3's SentencePiece vocabulary and fails when `<unk>` is missing (the
fixture's vocabulary has none).

Usage (from the repository root; a Python with llama-cpp-python and numpy):

    cargo build --release -p engram-cli
    /work/venv-llama/bin/python scripts/llama_cpp_arch_check.py [--engram target/release/engram]

Not run by CI.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN_DIR = os.path.join(REPO, "crates", "model", "tests", "golden")
SHAPES = ["tiny-qwen3", "tiny-phi3", "tiny-gemma3", "tiny-gemma2", "tiny-qwen3-moe", "tiny-mixtral", "tiny-gpt-oss"]
# Shapes `engram convert` does not take: their GGUF is the one `engram fixture` writes itself
# (`tiny-qwen3-moe`: `qwen3moe`, each projection's experts one 3-D tensor, as llama.cpp's
# converter writes them).
FIXTURE_GGUF = {"tiny-qwen3-moe", "tiny-mixtral"}
# More of the fixture's own GGUF formats run for a shape, beside the F32 file.
EXTRA_FORMATS = {"tiny-gpt-oss": ["mxfp4_moe"]}


def run(gguf, g, label):
    import numpy as np
    from llama_cpp import Llama

    ids = g["prompt_ids"]
    llm = Llama(model_path=gguf, n_ctx=1024, logits_all=True, verbose=False, n_threads=2, n_batch=512)
    llm.eval(ids)
    want = np.array(g["last_logits"], dtype=np.float32)
    last = np.array(llm.scores[len(ids) - 1], dtype=np.float32)
    err = float(np.abs(last - want).max() / np.abs(want).max())
    argmax = np.array(llm.scores[: len(ids)]).argmax(-1).tolist()
    agree = sum(a == b for a, b in zip(argmax, g["argmax_per_position"]))
    seq, out = list(ids), []
    for _ in range(len(g["greedy_ids"])):
        t = int(np.argmax(llm.scores[len(seq) - 1]))
        out.append(t)
        seq.append(t)
        llm.eval([t])
    greedy = "equal" if out == g["greedy_ids"] else f"differs after {next(i for i, (a, b) in enumerate(zip(out, g['greedy_ids'])) if a != b)} tokens"
    print(f"{label}: llama.cpp vs transformers: last-position logits {err:.2e}, argmax {agree}/{len(ids)}, greedy {len(out)} tokens {greedy}")
    del llm


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engram", default=os.path.join(REPO, "target", "release", "engram"))
    ap.add_argument("--shape", choices=SHAPES, action="append", help="shape(s) to check (default: all)")
    args = ap.parse_args()
    if not os.path.exists(args.engram):
        sys.exit(f"{args.engram} not found: run `cargo build --release -p engram-cli` or pass --engram")
    with tempfile.TemporaryDirectory(prefix="engram-llama-arch-") as tmp:
        for shape in args.shape or SHAPES:
            g = json.load(open(os.path.join(GOLDEN_DIR, f"{shape}.json"), encoding="utf-8"))
            gguf = os.path.join(tmp, f"{shape}-f32.gguf")
            if shape in FIXTURE_GGUF:
                subprocess.run([args.engram, "fixture", shape, "--out", tmp, "--formats", "f32"], check=True, capture_output=True)
            else:
                subprocess.run([args.engram, "fixture", shape, "--out", tmp, "--formats", "f16"], check=True, capture_output=True)
                hf = os.path.join(tmp, "model-hf")
                shutil.rmtree(hf, ignore_errors=True)
                shutil.copytree(os.path.join(tmp, f"{shape}-hf"), hf)
                subprocess.run([args.engram, "convert", "--model", hf, "--out", gguf, "--format", "f32"], check=True, capture_output=True)

            run(gguf, g, shape)
            for fmt in EXTRA_FORMATS.get(shape, []):
                subprocess.run([args.engram, "fixture", shape, "--out", tmp, "--formats", fmt], check=True, capture_output=True)
                run(os.path.join(tmp, f"{shape}-{fmt}.gguf"), g, f"{shape} {fmt}")


if __name__ == "__main__":
    main()
