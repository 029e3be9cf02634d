"""The official `ollama` client against a real `engram serve`: chat (whole and
streamed), generate, embed, list/show/ps, errors naming the field, and a two-turn
chat whose second turn reuses the first's cache.

`.ci/run` installs `ollama`; elsewhere these tests skip without it (and fail under
CI=true)."""

import os
from datetime import datetime

import pytest
import requests

try:
    import ollama
except ImportError:
    if os.environ.get("CI") == "true":
        pytest.fail("the `ollama` client is not installed (.ci/run installs it: pip install ollama)", pytrace=False)
    pytest.skip("the `ollama` client is not installed: pip install ollama", allow_module_level=True)

from conftest import fixture_model, spawn_server, stop_server

GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture
def client(server):
    return ollama.Client(host=server["base"])


def _created_at(r):
    # RFC 3339 with nanoseconds and Z; Python's parser takes microseconds.
    stamp = r.created_at.replace("Z", "+00:00")
    head, _, tail = stamp.partition(".")
    frac, _, zone = tail.partition("+")
    return datetime.fromisoformat(f"{head}.{frac[:6]}+{zone}")


def _assert_last(r, done_reason="length"):
    assert r.done is True and r.done_reason == done_reason
    assert r.eval_count == GREEDY["num_predict"]
    assert r.prompt_eval_count > 0
    assert r.total_duration >= r.load_duration + r.prompt_eval_duration + r.eval_duration
    assert r.eval_duration > 0
    assert _created_at(r).tzinfo is not None


def _embedder(client, server):
    for m in client.list().models:
        if "embedding" in (client.show(m.model).capabilities or []):
            return m.model
    pytest.fail("the server lists no embedding model")


def test_list_show_ps_version(client, server):
    names = [m.model for m in client.list().models]
    assert names[0] == server["model"]
    # The text encoder (discovered, or the LLM's pooled hidden states) is listed too.
    assert len(names) == 2
    info = client.show(server["model"])
    assert info.capabilities == ["completion"]
    family = info.details.family
    assert info.modelinfo["general.architecture"] == family
    assert info.modelinfo[f"{family}.context_length"] > 0
    assert info.details.format == "gguf" and info.details.quantization_level == "Q8_0"
    running = client.ps().models
    assert [m.model for m in running] == names
    assert all(m.context_length > 0 for m in running)
    version = requests.get(server["base"] + "/api/version", timeout=10).json()["version"]
    assert len(version.split(".")) == 3


def test_chat(client, server):
    r = client.chat(model=server["model"], messages=[{"role": "user", "content": "Hello from the ollama client"}],
                    options=GREEDY, keep_alive="5m")
    assert r.model == server["model"]
    assert r.message.role == "assistant" and isinstance(r.message.content, str) and r.message.content
    _assert_last(r)


def test_streaming_chat_equals_whole(client, server):
    msgs = [{"role": "user", "content": "Stream this through ollama, please"}]
    whole = client.chat(model=server["model"], messages=msgs, options=GREEDY)
    parts = list(client.chat(model=server["model"], messages=msgs, options=GREEDY, stream=True))
    assert len(parts) >= 2
    assert all(p.done is False for p in parts[:-1])
    assert "".join(p.message.content for p in parts) == whole.message.content
    _assert_last(parts[-1])


def test_generate(client, server):
    r = client.generate(model=server["model"], prompt="Why is the sky blue?", system="Be brief.", options=GREEDY)
    assert isinstance(r.response, str) and r.response
    _assert_last(r)
    parts = list(client.generate(model=server["model"], prompt="Why is the sky blue?", system="Be brief.",
                                 options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == r.response
    _assert_last(parts[-1])
    raw = client.generate(model=server["model"], prompt="Once upon a time", raw=True, options=GREEDY)
    _assert_last(raw)


def test_embed(client, server):
    model = _embedder(client, server)
    texts = ["The cat sat on the mat.", "A dog is playing guitar."]
    r = client.embed(model=model, input=texts)
    assert r.model == model and len(r.embeddings) == 2
    assert r.prompt_eval_count > 0
    # The same vectors as /v1/embeddings, by the id both list.
    v1 = requests.post(server["base"] + "/v1/embeddings", timeout=60,
                       json={"model": model, "input": texts, "encoding_format": "float"}).json()
    for got, want in zip(r.embeddings, v1["data"]):
        assert got == pytest.approx(want["embedding"], abs=1e-6)
    legacy = client.embeddings(model=model, prompt=texts[0])
    assert legacy.embedding == pytest.approx(r.embeddings[0], abs=1e-6)


def test_errors_name_the_field(client, server):
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        (dict(model="llama3.2", messages=msgs), 404, "llama3.2"),
        (dict(model=server["model"], messages=msgs, options={"temperature": "hot"}), 400, "options.temperature"),
        (dict(model=server["model"], messages=msgs, format={"type": "nonsense"}), 400, "format"),
        (dict(model=server["model"], messages=msgs,
              tools=[{"type": "function", "function": {"name": "f", "description": "d",
                                                       "parameters": {"type": "object",
                                                                      "properties": {"a": {"type": "nonsense"}}}}}]),
         400, "tools[0].function.parameters"),
    ]
    for kwargs, status, says in cases:
        with pytest.raises(ollama.ResponseError) as e:
            client.chat(**kwargs)
        assert e.value.status_code == status, kwargs
        assert says in e.value.error, (kwargs, e.value.error)


def _reused(base):
    for line in requests.get(base + "/metrics", timeout=10).text.splitlines():
        if line.startswith("engram_prompt_tokens_reused_total "):
            return float(line.split()[1])
    return 0.0


def test_second_chat_turn_is_cached(tmp_path):
    # Its own server, so the cache counters are this test's alone.
    proc, base = spawn_server(fixture_model(tmp_path), tmp_path, "--embedder", "none")
    try:
        client = ollama.Client(host=base)
        system = "You are a terse assistant who answers questions about caches. " * 6
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": "What is a KV cache?"}]
        r1 = client.chat(model="tiny-q8_0", messages=msgs, options=GREEDY)
        before = _reused(base)
        msgs += [{"role": "assistant", "content": r1.message.content}, {"role": "user", "content": "Why reuse it?"}]
        r2 = client.chat(model="tiny-q8_0", messages=msgs, options=GREEDY)
        reused = _reused(base) - before
        # Turn 2 computed only what turn 1 had not: its prompt_eval_count is the new tokens.
        assert reused >= r1.prompt_eval_count
        assert r2.prompt_eval_count < r1.prompt_eval_count
        assert r2.done_reason == "length"
    finally:
        stop_server(proc)
