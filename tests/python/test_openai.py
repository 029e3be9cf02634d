"""The official `openai` client (and raw HTTP for `/v1/messages`) against a
real `engram serve`."""

import json
import signal
import subprocess

import openai
import pytest
import requests
from conftest import fixture_model, spawn_server, stop_server


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server["base"] + "/v1", api_key="x", max_retries=0)


def test_models(client, server):
    ids = [m.id for m in client.models.list().data]
    assert server["model"] in ids


def test_chat(client, server):
    r = client.chat.completions.create(
        model=server["model"], messages=[{"role": "user", "content": "Hello from pytest"}],
        max_tokens=10, temperature=0)
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and 0 < r.usage.completion_tokens <= 10


def test_streaming_equals_non_streaming(client, server):
    msgs = [{"role": "user", "content": "Stream this, please"}]
    whole = client.chat.completions.create(model=server["model"], messages=msgs, max_tokens=12, temperature=0)
    stream = client.chat.completions.create(model=server["model"], messages=msgs, max_tokens=12,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    text, finish, usage = "", None, None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        if chunk.usage:
            usage = chunk.usage
    assert text == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_completions(client, server):
    r = client.completions.create(model=server["model"], prompt="Once upon a time", max_tokens=6, temperature=0)
    assert r.object == "text_completion"
    assert r.usage.completion_tokens <= 6
    s = client.completions.create(model=server["model"], prompt="Once upon a time", max_tokens=6,
                                  temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text


def test_second_turn_reports_cached_tokens(client, server):
    msgs = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Two-turn test: what is a KV cache?"}]
    r1 = client.chat.completions.create(model=server["model"], messages=msgs, max_tokens=16, temperature=0)
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content},
             {"role": "user", "content": "Why keep it between turns?"}]
    r2 = client.chat.completions.create(model=server["model"], messages=msgs, max_tokens=16, temperature=0)
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached >= r1.usage.prompt_tokens, (cached, r1.usage.prompt_tokens)


@pytest.mark.parametrize("kwargs", [
    dict(messages=[]),
    dict(messages=[{"role": "user", "content": "x"}], temperature=-1),
    dict(messages=[{"role": "user", "content": "x"}], top_p=0),
    dict(messages=[{"role": "user", "content": "x"}], max_tokens=10_000_000),
    dict(messages=[{"role": "user", "content": "word " * 5000}]),
    dict(messages=[{"role": "user", "content": "x"}], n=3),
    dict(messages=[{"role": "user", "content": "x"}], extra_body={"session_id": "../../etc"}),
])
def test_bad_requests(client, server, kwargs):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server["model"], **kwargs)
    assert e.value.status_code == 400
    assert e.value.body and e.value.body.get("message")


@pytest.mark.parametrize("field,kwargs", [
    ("functions", dict(extra_body={"functions": [{"name": "f", "parameters": {"type": "object"}}]})),
    ("logit_bias", dict(logit_bias={"5": 10})),
])
def test_unsupported_fields_are_refused_by_name(client, server, field, kwargs):
    # Refused by name rather than silently ignored.
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server["model"], messages=[{"role": "user", "content": "x"}],
                                       max_tokens=2, **kwargs)
    assert e.value.body["param"] == field
    assert f"`{field}`" in e.value.body["message"]


def test_chat_logprobs(client, server):
    msgs = [{"role": "user", "content": "Log-probabilities, please"}]
    r = client.chat.completions.create(model=server["model"], messages=msgs, max_tokens=8, temperature=0,
                                       logprobs=True, top_logprobs=3)
    entries = r.choices[0].logprobs.content
    assert len(entries) == r.usage.completion_tokens
    for e in entries:
        assert e.logprob <= 0 and len(e.top_logprobs) == 3
        lps = [t.logprob for t in e.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        # Greedy picks the most likely token: it is the first alternative, same figure.
        assert (e.token, e.logprob) == (e.top_logprobs[0].token, e.top_logprobs[0].logprob)
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
    if r.choices[0].finish_reason == "length":
        assert b"".join(bytes(e.bytes) for e in entries).decode("utf-8", "replace") == r.choices[0].message.content
    # Streamed, the chunks carry the same entries in order.
    stream = client.chat.completions.create(model=server["model"], messages=msgs, max_tokens=8, temperature=0,
                                            logprobs=True, top_logprobs=3, stream=True)
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, round(e.logprob, 5)) for e in streamed] == [(e.token, round(e.logprob, 5)) for e in entries]
    # Without the field, no logprobs.
    plain = client.chat.completions.create(model=server["model"], messages=msgs, max_tokens=2, temperature=0)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs(client, server):
    r = client.completions.create(model=server["model"], prompt="Once upon a time", max_tokens=6, temperature=0,
                                  logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens
    assert all(len(t) <= 2 for t in lp.top_logprobs) and all(x <= 0 for x in lp.token_logprobs)
    assert lp.text_offset == sorted(lp.text_offset)


@pytest.mark.parametrize("kwargs,param", [
    (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
    (dict(top_logprobs=2), "top_logprobs"),
    (dict(extra_body={"logprobs": 3}), "logprobs"),
])
def test_bad_logprobs_are_400s(client, server, kwargs, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=server["model"], messages=[{"role": "user", "content": "x"}],
                                       max_tokens=2, **kwargs)
    assert e.value.body["param"] == param


def test_a_body_over_the_limit_is_a_json_413(client, server):
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=server["model"], max_tokens=2,
                                       messages=[{"role": "user", "content": "a" * (3 << 20)}])
    assert e.value.status_code == 413
    assert e.value.body["code"] == "request_too_large"


def test_unknown_model(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}])
    assert "tiny-q8_0" in str(e.value)


def test_malformed_json(server):
    r = requests.post(server["base"] + "/v1/chat/completions", data="{not json",
                      headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert set(r.json()["error"]) >= {"message", "type", "param", "code"}


def test_anthropic_messages(server):
    body = {"model": server["model"], "max_tokens": 8, "temperature": 0, "system": "Be brief.",
            "messages": [{"role": "user", "content": "Anthropic-style hello"}]}
    r = requests.post(server["base"] + "/v1/messages", json=body)
    assert r.status_code == 200, r.text
    m = r.json()
    assert m["type"] == "message" and m["role"] == "assistant"
    assert m["content"][0]["type"] == "text"
    assert m["stop_reason"] in ("end_turn", "max_tokens", "stop_sequence")
    text = m["content"][0]["text"]

    r = requests.post(server["base"] + "/v1/messages", json={**body, "stream": True}, stream=True)
    r.encoding = "utf-8"  # SSE is always UTF-8; requests would guess Latin-1
    events, streamed, event = [], "", None
    for line in r.iter_lines(decode_unicode=True):
        if line.startswith("event: "):
            event = line[7:]
            events.append(event)
        elif line.startswith("data: "):
            d = json.loads(line[6:])
            assert d["type"] == event
            if event == "content_block_delta":
                streamed += d["delta"]["text"]
    assert events[0] == "message_start" and events[1] == "content_block_start"
    assert events[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert streamed == text


def test_metrics(server):
    text = requests.get(server["base"] + "/metrics").text
    for name in ("engram_requests_total", "engram_cache_hits_total", "engram_time_to_first_token_seconds_bucket",
                 "engram_inter_token_seconds_bucket", "engram_kv_bytes_used"):
        assert name in text


def test_sigterm_exits_cleanly(tmp_path):
    # A server of its own: the session's server stays up for the tests that run after this one.
    proc, addr = spawn_server(fixture_model(tmp_path), tmp_path)
    try:
        assert requests.get(addr + "/health", timeout=10).status_code == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        stop_server(proc)
