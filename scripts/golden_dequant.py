#!/usr/bin/env python3
"""Golden dequantization vectors for every ggml block format Engram reads.

For each format, makes a few deterministic pseudo-random blocks (random bytes,
with the f16 scale fields overwritten by finite values of sane magnitude and
MXFP4's E8M0 exponent kept in a sane range), dequantizes them with the `gguf`
Python package (`gguf.quants.dequantize`, a NumPy port of ggml's
`dequantize_row_*`), and writes `crates/kernels/tests/golden/dequant.json`:

    {"gguf_version": ..., "seed": ..., "types": [
        {"name": "q4_1", "ggml_type": 3, "n_blocks": 4, "n_elems": 128,
         "blocks": "<hex of the raw block bytes>",
         "f32_bits": "<hex of the little-endian f32 results>"}, ...]}

The Rust test `crates/kernels/tests/it/golden.rs` decodes the same bytes with
`engram_kernels::dequantize_row` and compares every f32 bitwise.

Usage (from the repository root):

    python3 scripts/golden_dequant.py            # rewrites the golden file
    python3 scripts/golden_dequant.py --check    # exit 1 if the file differs

Needs `numpy` and `gguf`. Not run by CI.
"""

import argparse
import json
import os
import sys

import numpy as np
import gguf
from gguf.constants import GGMLQuantizationType as T
from gguf.quants import dequantize

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "crates", "kernels", "tests", "golden", "dequant.json")
SEED = 20261128

# (engram name, ggml type, blocks, byte offsets of f16 scale fields, offset of an E8M0 byte or None)
FORMATS = [
    ("q4_0", T.Q4_0, 4, [0], None),
    ("q4_1", T.Q4_1, 4, [0, 2], None),
    ("q5_0", T.Q5_0, 4, [0], None),
    ("q5_1", T.Q5_1, 4, [0, 2], None),
    ("q8_0", T.Q8_0, 4, [0], None),
    ("iq4_nl", T.IQ4_NL, 4, [0], None),
    ("mxfp4", T.MXFP4, 4, [], 0),
    ("q2_k", T.Q2_K, 2, [80, 82], None),
    ("q3_k", T.Q3_K, 2, [108], None),
    ("q4_k", T.Q4_K, 2, [0, 2], None),
    ("q5_k", T.Q5_K, 2, [0, 2], None),
    ("q6_k", T.Q6_K, 2, [208], None),
    ("iq4_xs", T.IQ4_XS, 2, [0], None),
    ("iq3_xxs", T.IQ3_XXS, 2, [0], None),
    ("iq3_s", T.IQ3_S, 2, [0], None),
]


def make_blocks(rng, qtype, n_blocks, f16_offsets, e8m0_offset):
    """Random bytes for `n_blocks` blocks with every scale field finite and sane."""
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for b in range(n_blocks):
        for off in f16_offsets:
            # |scale| in [2^-12, 2^1], either sign: finite, normal, no overflow in products.
            mag = 2.0 ** rng.uniform(-12, 1)
            sign = -1.0 if rng.integers(0, 2) else 1.0
            raw[b, off:off + 2] = np.frombuffer(np.float16(sign * mag).tobytes(), dtype=np.uint8)
        if e8m0_offset is not None:
            # 2^(e-128) in [2^-20, 2^2]; the first block also covers the subnormal branch (e < 2).
            raw[b, e8m0_offset] = 1 if b == 0 else rng.integers(108, 131)
    return raw, block_elems


def build():
    rng = np.random.default_rng(SEED)
    types = []
    for name, qtype, n_blocks, f16_offsets, e8m0_offset in FORMATS:
        raw, block_elems = make_blocks(rng, qtype, n_blocks, f16_offsets, e8m0_offset)
        out = dequantize(raw.reshape(-1), qtype).astype(np.float32).reshape(-1)
        assert out.size == n_blocks * block_elems
        assert np.all(np.isfinite(out)), name
        types.append({
            "name": name,
            "ggml_type": int(qtype),
            "n_blocks": n_blocks,
            "n_elems": int(out.size),
            "blocks": raw.tobytes().hex(),
            "f32_bits": out.astype("<f4").tobytes().hex(),
        })
    version = getattr(gguf, "__version__", None)
    if version is None:
        try:
            from importlib.metadata import version as v
            version = v("gguf")
        except Exception:  # noqa: BLE001 - the version is informative only
            version = "unknown"
    return {"gguf_version": version, "seed": SEED, "types": types}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare with the file instead of writing it")
    args = ap.parse_args()
    doc = build()
    text = json.dumps(doc, indent=1) + "\n"
    if args.check:
        with open(args.out) as f:
            same = json.load(f)["types"] == doc["types"]
        print("golden file matches" if same else "golden file DIFFERS")
        sys.exit(0 if same else 1)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}: {len(doc['types'])} formats, gguf {doc['gguf_version']}")


if __name__ == "__main__":
    main()
