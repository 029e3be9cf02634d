#!/usr/bin/env python3
"""Reference outputs of the `tiny` fixture computed by Hugging Face transformers.

Writes `crates/model/tests/golden/tiny.json`, which the Rust test
`crates/model/tests/it/golden.rs` compares Engram against: tokenizer ids,
last-position logits, per-position argmax, a 32-token greedy continuation and
the rendered chat template.

Usage (from the repository root):

    cargo build --release -p engram-cli
    python3 scripts/golden_logits.py                 # generates the fixture itself
    python3 scripts/golden_logits.py --model /tmp/x/tiny-hf

Needs `torch` and `transformers` (CPU is enough). Not run by CI.
"""

import argparse
import copy
import hashlib
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "crates", "model", "tests", "golden", "tiny.json")
DEFAULT_ENGRAM = os.path.join(REPO, "target", "release", "engram")

PROMPT = "The persistent stream holds immutable system prompts \u2014 and a caf\u00e9's \u65e5\u672c\u8a9e menu."
CHAT_MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi there"},
]
NEW_TOKENS = 32
EDGE = 16  # f32 values recorded from each end of the safetensors data


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fnv1a64(path):
    """FNV-1a 64 of the file bytes (the Rust test recomputes it without a crate)."""
    h = 0xCBF29CE484222325
    with open(path, "rb") as f:
        data = f.read()
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def safetensors_edges(path):
    """Offset of the data buffer and the first/last EDGE f32 values (as u32 bits)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        start = 8 + n
        f.seek(0, os.SEEK_END)
        end = f.tell()
        dtypes = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
        assert dtypes == {"F32"}, f"expected an all-F32 safetensors file, got {dtypes}"
        f.seek(start)
        first = f.read(4 * EDGE)
        f.seek(end - 4 * EDGE)
        last = f.read(4 * EDGE)
    bits = lambda b: list(struct.unpack("<%dI" % EDGE, b))
    vals = lambda b: [float(x) for x in struct.unpack("<%df" % EDGE, b)]
    return {
        "data_offset": start,
        "first_bits": bits(first),
        "last_bits": bits(last),
        "first_values": vals(first),  # for humans; the test compares the bits
        "last_values": vals(last),
    }


def sig7(x):
    return float("%.7g" % x)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="fixture HF folder (default: generate `tiny` with --engram into a temp dir)")
    ap.add_argument("--engram", default=DEFAULT_ENGRAM, help="engram binary (default: target/release/engram)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="golden JSON to write (default: %(default)s)")
    args = ap.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = None
    model_dir = args.model
    if model_dir is None:
        if not os.path.exists(args.engram):
            sys.exit(f"{args.engram} not found: run `cargo build --release -p engram-cli` or pass --model/--engram")
        tmp = tempfile.TemporaryDirectory(prefix="engram-golden-")
        subprocess.run([args.engram, "fixture", "tiny", "--out", tmp.name], check=True)
        model_dir = os.path.join(tmp.name, "tiny-hf")

    torch.manual_seed(0)
    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))

    tok = AutoTokenizer.from_pretrained(model_dir)
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    except TypeError:  # transformers < 4.56 spells it torch_dtype
        model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
    model.eval()
    cfg = model.config

    ids = tok(PROMPT, add_special_tokens=True)["input_ids"]
    assert tok.bos_token_id is not None and ids[0] == tok.bos_token_id, f"BOS missing from {ids[:4]}"
    assert tok.decode(ids, skip_special_tokens=True) == PROMPT, "tokenizer does not round-trip the prompt"

    x = torch.tensor([ids], dtype=torch.long)
    with torch.no_grad():
        logits = model(x).logits[0].float()  # [T, vocab]
    assert logits.shape == (len(ids), cfg.vocab_size), logits.shape
    assert torch.isfinite(logits).all()
    last = logits[-1].tolist()
    argmax = logits.argmax(dim=-1).tolist()
    top2 = logits.topk(2, dim=-1).values
    min_gap = float((top2[:, 0] - top2[:, 1]).min())

    # Greedy continuation with EOS disabled, so it always has NEW_TOKENS tokens.
    gen_cfg = copy.deepcopy(model.generation_config)
    gen_cfg.do_sample = False
    gen_cfg.eos_token_id = None
    gen_cfg.pad_token_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    gen_cfg.max_new_tokens = NEW_TOKENS
    gen_cfg.min_new_tokens = None
    for k in ("temperature", "top_p", "top_k"):
        if hasattr(gen_cfg, k):
            setattr(gen_cfg, k, None)
    with torch.no_grad():
        out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gen_cfg)
    greedy = out[0, len(ids):].tolist()
    assert len(greedy) == NEW_TOKENS, f"generate gave {len(greedy)} tokens, wanted {NEW_TOKENS}"

    # Cross-check generate's cached path against plain full recomputation.
    seq = list(ids)
    gaps = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            lg = model(torch.tensor([seq])).logits[0, -1]
            t2 = lg.topk(2).values
            gaps.append(float(t2[0] - t2[1]))
            seq.append(int(lg.argmax()))
    assert seq[len(ids):] == greedy, f"generate {greedy} != recomputed greedy {seq[len(ids):]}"

    chat = tok.apply_chat_template(CHAT_MESSAGES, tokenize=False, add_generation_prompt=True)

    st = os.path.join(model_dir, "model.safetensors")
    tj = os.path.join(model_dir, "tokenizer.json")
    golden = {
        "format": 1,
        "regenerate": "cargo build --release -p engram-cli && python3 scripts/golden_logits.py",
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "fixture": {
            "shape": "tiny",
            "model.safetensors": {"size": os.path.getsize(st), "sha256": sha256(st), "fnv1a64": fnv1a64(st), **safetensors_edges(st)},
            "tokenizer.json": {"size": os.path.getsize(tj), "sha256": sha256(tj), "fnv1a64": fnv1a64(tj)},
        },
        "prompt": PROMPT,
        "prompt_ids": ids,
        "vocab_size": cfg.vocab_size,
        "last_logits": [sig7(v) for v in last],
        "argmax_per_position": argmax,
        "min_top2_gap_prompt": min_gap,
        "greedy_new_tokens": NEW_TOKENS,
        "greedy_ids": greedy,
        "min_top2_gap_greedy": min(gaps),
        "chat_messages": CHAT_MESSAGES,
        "chat_rendered": chat,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    size = os.path.getsize(args.out)
    print(f"wrote {args.out} ({size} bytes)")
    print(f"  transformers {transformers.__version__}, torch {torch.__version__}")
    print(f"  prompt ids ({len(ids)}): {ids}")
    print(f"  greedy: {greedy}")
    print(f"  smallest top-2 logit gap: prompt {min_gap:.3e}, greedy {min(gaps):.3e}")
    print(f"  chat: {chat!r}")
    assert size < 200_000, "golden file too large"
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
