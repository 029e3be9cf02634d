"""Held-out text for `engram bench fidelity`: pycode-long's held-out packages as text files.

Writes one file per held-out unit found on this machine (prep.py's rule: the name decides,
so these packages were never trained on), in prep.py's unit order, each source file wrapped
as `<s>` ... `</s>` exactly as training saw files (the tokenizer reads `<s>`/`</s>` in text
as ids 0/1). Units with fewer than --min-tokens tokens are skipped (estimated at 3.2 bytes
per token, the corpus average; the bench checks the real count).

    python3 models/pycode-long/recipe/heldout_text.py --out /tmp/heldout
    engram bench fidelity --model models/pycode-long --text /tmp/heldout/*.txt

On this repository's machine (Python 3.11.7) it writes idna, markdown_it and mpmath
(the first three long held-out units in name order).
"""
import argparse, os, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import prep  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-tokens", type=int, default=16384, help="skip units shorter than this (estimated)")
    ap.add_argument("--max-units", type=int, default=3)
    ap.add_argument("--roots", nargs="*", help="folders to read instead of this Python's stdlib and site-packages")
    a = ap.parse_args()
    roots = [("site", r) for r in a.roots] if a.roots else prep.default_roots()
    os.makedirs(a.out, exist_ok=True)
    written = 0
    for name, files in prep.load_units(roots, prep.is_held_out):
        text = "".join(f"<s>{t}</s>" for _, t, _ in files)
        if len(text.encode()) / 3.2 < a.min_tokens:
            continue
        path = os.path.join(a.out, f"{name}.txt")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"{path}: {len(files)} files, {len(text.encode())} bytes")
        written += 1
        if written == a.max_units:
            break
    if not written:
        sys.exit("no held-out unit long enough here: pip install mpmath (one of pycode-long's held-out packages)")


if __name__ == "__main__":
    main()
