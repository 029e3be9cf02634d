"""Corpus for pycode-long: the .py sources of the Python that runs this script.

Sources: the standard library (sysconfig's `stdlib`) and the installed packages
(sysconfig's `purelib`/`platlib` and site.getsitepackages()), or --roots.

Documents are *packages*: every top-level directory of a root is one unit, named
by that directory (`email`, `sympy`, ...); the loose top-level modules of a root
form one unit each (`_stdlib_toplevel`, `_site_toplevel`). Inside a unit the files
come in a fixed order: a directory's own files (`__init__.py` first, then by name),
then its subdirectories by name, recursively; so later code tends to use what
earlier code defined. Each file is wrapped as id 0 (`<s>`) ... id 1 (`</s>`), the
way pycode-7m's prep.py wrapped them, and a unit is the concatenation of its files.

Held out: units whose name hashes to 0 mod HOLD_MOD (sha256 of SALT + name). The
rule reads names only, so the same packages are held out on any machine; their
text is never trained on (and training files identical to a held-out file are
dropped). A unit's files that are byte-identical to an earlier file are dropped
(vendored copies).

Files kept: 200 B .. 400 KB, valid UTF-8, no line longer than 1000 characters
(generated tables). Output (in --out): train.bin (uint16 ids, training units in
the order of sha256 of their names, up to --max-train-bytes of text), heldout.bin + heldout.json (unit name -> [start, end) in heldout.bin),
files.tsv (split, unit, path within the unit, sha1, bytes, tokens) and prep.json
(counts, token totals, sha256 of files.tsv = the file-list hash).
"""
import argparse, hashlib, json, os, site, sys, sysconfig, time

import numpy as np

SALT = "pycode-long/36/"  # chosen among pycode-long/0/../39/: holds out no large package (torch, jax, scipy, ...) and
# holds out mpmath, idna and narwhals, which an ordinary machine has, so the CPU re-check finds long held-out text
HOLD_MOD = 16
SKIP_DIRS = {"__pycache__", "site-packages", "dist-packages"}
MIN_BYTES, MAX_BYTES, MAX_LINE = 200, 400_000, 1000
HERE = os.path.dirname(os.path.abspath(__file__))


def is_held_out(name):
    return int(hashlib.sha256((SALT + name).encode()).hexdigest()[:8], 16) % HOLD_MOD == 0


def default_roots():
    """(kind, path) pairs: this interpreter's stdlib and its site-packages folders."""
    paths = sysconfig.get_paths()
    roots = [("stdlib", paths["stdlib"])]
    seen = {os.path.realpath(paths["stdlib"])}
    for p in [paths["purelib"], paths["platlib"]] + list(getattr(site, "getsitepackages", lambda: [])()):
        if os.path.isdir(p) and os.path.realpath(p) not in seen:
            seen.add(os.path.realpath(p))
            roots.append(("site", p))
    return roots


def walk_unit(d):
    """The .py files under d in the unit order (own files, __init__ first, then subdirs)."""
    try:
        entries = sorted(os.scandir(d), key=lambda e: e.name)
    except OSError:
        return []
    files = [e.path for e in entries if e.is_file(follow_symlinks=False) and e.name.endswith(".py")]
    files.sort(key=lambda p: (os.path.basename(p) != "__init__.py", os.path.basename(p)))
    for e in entries:
        if e.is_dir(follow_symlinks=False) and e.name not in SKIP_DIRS and "." not in e.name:
            files.extend(walk_unit(e.path))
    return files


def list_units(roots):
    """{unit name: [(abs path, path shown in files.tsv)]}, in a deterministic order."""
    units = {}
    for kind, root in roots:
        for e in sorted(os.scandir(root), key=lambda e: e.name):
            if e.is_dir(follow_symlinks=False):
                if e.name in SKIP_DIRS or "." in e.name or e.name.startswith("__"):
                    continue  # caches, *.dist-info, *.egg-info
                name, files = e.name, walk_unit(e.path)
            elif e.is_file(follow_symlinks=False) and e.name.endswith(".py"):
                name, files = f"_{kind}_toplevel", [e.path]
            else:
                continue
            units.setdefault(name, []).extend((f, os.path.relpath(f, root)) for f in files)
    return units


def read_ok(path):
    """The file's text, or None when it fails the filters."""
    try:
        n = os.path.getsize(path)
        if n < MIN_BYTES or n > MAX_BYTES:
            return None
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if max(map(len, text.split("\n"))) > MAX_LINE:
        return None
    return text


def load_units(roots, want):
    """Reads the units that `want(name)` selects: [(name, [(shown path, text, sha1)])]."""
    units = list_units(roots)
    out, seen = [], set()
    # held-out units first, so that a training file identical to a held-out one is dropped
    for name in sorted(units, key=lambda n: (not is_held_out(n), n)):
        if not want(name):
            continue
        kept = []
        for path, shown in units[name]:
            text = read_ok(path)
            if text is None:
                continue
            h = hashlib.sha1(text.encode()).hexdigest()
            if h in seen:
                continue
            seen.add(h)
            kept.append((shown, text, h))
        if kept:
            out.append((name, kept))
    return out


def tokenizer(path=None):
    from tokenizers import Tokenizer
    return Tokenizer.from_file(path or os.path.join(HERE, "..", "tokenizer.json"))


def encode_units(tok, units, chunk_bytes=16_000_000, deadline=None):
    """[(name, ids uint16 array, [(shown, sha1, bytes, tokens)])]; units past the deadline are skipped."""
    out, batch, batch_bytes = [], [], 0

    def flush():
        nonlocal batch, batch_bytes
        texts = [t for _, files in batch for _, t, _ in files]
        enc = tok.encode_batch(texts, add_special_tokens=False) if texts else []
        k = 0
        for name, files in batch:
            parts, rows = [], []
            for shown, text, h in files:
                ids = enc[k].ids; k += 1
                parts.append(np.array([0] + ids + [1], dtype=np.uint16))
                rows.append((shown, h, len(text.encode()), len(ids) + 2))
            out.append((name, np.concatenate(parts), rows))
        batch, batch_bytes = [], 0

    for name, files in units:
        if deadline is not None and time.time() > deadline:
            print(f"prep: deadline reached, unit {name} and later ones left out", flush=True)
            break
        batch.append((name, files))
        batch_bytes += sum(len(t) for _, t, _ in files)
        if batch_bytes >= chunk_bytes:
            flush()
    flush()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--roots", nargs="*", help="folders to read instead of this Python's stdlib and site-packages")
    ap.add_argument("--max-train-bytes", type=float, default=320e6, help="stop adding training units past this much text")
    ap.add_argument("--max-files", type=int, default=0, help="keep only the first N files of each unit (tests)")
    ap.add_argument("--only", nargs="*", help="keep only these units (tests)")
    ap.add_argument("--time-limit", type=float, default=0, help="seconds; training units past it are left out")
    a = ap.parse_args()
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    roots = [("site", r) for r in a.roots] if a.roots else default_roots()
    want = (lambda n: n in a.only) if a.only else (lambda n: True)
    units = load_units(roots, want)
    if a.max_files:
        units = [(n, f[: a.max_files]) for n, f in units]
    held = [(n, f) for n, f in units if is_held_out(n)]
    train, total = [], 0
    # training units in a fixed pseudo-random order (sha256 of the name); past --max-train-bytes a
    # unit that does not fit is left out, so the cap drops a deterministic mix of packages
    for n, f in sorted(((n, f) for n, f in units if not is_held_out(n)), key=lambda u: hashlib.sha256(u[0].encode()).hexdigest()):
        b = sum(len(t) for _, t, _ in f)
        if total + b > a.max_train_bytes and train:
            continue
        train.append((n, f)); total += b
    t_read = time.time() - t0
    tok = tokenizer()
    deadline = t0 + a.time_limit if a.time_limit else None
    held_enc = encode_units(tok, held)
    train_enc = encode_units(tok, train, deadline=deadline)
    rows, meta = [], {}
    for split, enc in (("heldout", held_enc), ("train", train_enc)):
        arrs, offsets, pos = [], {}, 0
        for name, ids, files in enc:
            arrs.append(ids); offsets[name] = [pos, pos + len(ids)]; pos += len(ids)
            rows += [f"{split}\t{name}\t{s}\t{h}\t{b}\t{t}" for s, h, b, t in files]
        arr = np.concatenate(arrs) if arrs else np.zeros(0, np.uint16)
        arr.tofile(os.path.join(a.out, f"{split}.bin"))
        meta[split] = {"units": len(enc), "files": sum(len(f) for _, _, f in enc),
                       "bytes": sum(b for _, _, f in enc for _, _, b, _ in f), "tokens": int(len(arr))}
        if split == "heldout":
            json.dump(offsets, open(os.path.join(a.out, "heldout.json"), "w"), indent=0)
            meta[split]["names"] = {n: e - s for n, (s, e) in offsets.items()}
    listing = "\n".join(rows) + "\n"
    open(os.path.join(a.out, "files.tsv"), "w").write(listing)
    meta.update({
        "python": sys.version.split()[0], "roots": [r for _, r in roots],
        "file_list_sha256": hashlib.sha256(listing.encode()).hexdigest(),
        "hold_out_rule": f"sha256('{SALT}' + unit name)[:8] as hex int % {HOLD_MOD} == 0",
        "max_train_bytes": a.max_train_bytes, "read_s": round(t_read, 1), "total_s": round(time.time() - t0, 1),
        "train_units_left_out_by_deadline": len(train) - len(train_enc),
    })
    json.dump(meta, open(os.path.join(a.out, "prep.json"), "w"), indent=1)
    print("prep:", json.dumps({k: v for k, v in meta.items() if k != "heldout"}), flush=True)
    print("prep: heldout", json.dumps(meta["heldout"]), flush=True)


if __name__ == "__main__":
    main()
