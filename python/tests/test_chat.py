"""Chat and text completions on the real model: answers, OpenAI shapes, streams from several
threads at once (each equal to its non-streamed greedy answer), sessions' prefix reuse, tokens."""

import json
import threading

import pytest

from conftest import SYSTEM, ask, text_of


def test_the_capital_of_france(engine):
    r = engine.chat(ask("What is the capital of France?"), temperature=0, max_tokens=24)
    assert "Paris" in text_of(r), r
    assert r["object"] == "chat.completion"
    assert r["id"].startswith("chatcmpl-")
    assert r["model"] == "SmolLM2-135M-Instruct.Q4_1"
    assert r["choices"][0]["message"]["role"] == "assistant"
    assert r["choices"][0]["finish_reason"] in ("stop", "length")
    u = r["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and u["completion_tokens"] > 0


def test_a_repeated_prompt_reuses_its_cache(engine):
    msgs = ask("Name a colour of the sky.")
    first = engine.chat(msgs, temperature=0, max_tokens=12)
    again = engine.chat(msgs, temperature=0, max_tokens=12)
    assert text_of(again) == text_of(first)
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, again["usage"]


def stream_text(chunks):
    parts, finish, roles = [], None, []
    for c in chunks:
        assert c["object"] == "chat.completion.chunk"
        d = c["choices"][0]["delta"]
        roles.append(d.get("role"))
        parts.append(d.get("content") or "")
        finish = c["choices"][0]["finish_reason"] or finish
    assert roles[0] == "assistant", roles
    return "".join(parts), finish


QUESTIONS = [
    "What is the capital of Italy?",
    "Name three fruits.",
    "What is 2 plus 2?",
    "Write one sentence about the sea.",
]


def test_four_threads_stream_at_once_each_equal_to_its_whole_answer(engine):
    whole = [text_of(engine.chat(ask(q), temperature=0, max_tokens=32)) for q in QUESTIONS]
    results = [None] * len(QUESTIONS)
    errors = []
    start = threading.Barrier(len(QUESTIONS))

    def run(i):
        try:
            start.wait()
            results[i] = stream_text(engine.chat(ask(QUESTIONS[i]), temperature=0, max_tokens=32, stream=True))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(QUESTIONS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    for i, (text, finish) in enumerate(results):
        assert text == whole[i], (QUESTIONS[i], text, whole[i])
        assert finish in ("stop", "length")


def test_complete_and_its_stream(engine):
    r = engine.complete("The capital of France is", temperature=0, max_tokens=8)
    assert r["object"] == "text_completion" and r["choices"][0]["text"]
    parts = [c["choices"][0]["text"] for c in engine.complete("The capital of France is", temperature=0, max_tokens=8, stream=True)]
    assert "".join(parts) == r["choices"][0]["text"]


def test_a_closed_stream_ends(engine):
    s = engine.chat(ask("Count from one to fifty."), temperature=0, max_tokens=200, stream=True)
    next(s)
    s.close()
    assert list(s) == []


def test_stop_strings_and_max_tokens(engine):
    r = engine.chat(ask("Count from one to ten, separated by commas."), temperature=0, max_tokens=40, stop=[","])
    assert "," not in text_of(r)
    r = engine.chat(ask("Tell me a long story."), temperature=0, max_tokens=3)
    assert r["usage"]["completion_tokens"] == 3 and r["choices"][0]["finish_reason"] == "length"


def test_json_response_format(engine):
    r = engine.chat(ask("Give a JSON object with a key name."), temperature=0, max_tokens=40,
                    response_format={"type": "json_object"})
    if r["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text_of(r)), dict)


def test_a_session_prefills_only_the_new_turn(engine):
    s = engine.session(system=SYSTEM["content"])
    a = s.chat("What is the capital of France?", temperature=0, max_tokens=16)
    assert "Paris" in a
    s.chat("And of Germany?", temperature=0, max_tokens=16)
    assert s.cached_tokens > 20, s.cached_tokens
    assert [m["role"] for m in s.history] == ["user", "assistant", "user", "assistant"]


def test_tokenize_detokenize_round_trip(engine):
    for text in ["Hello, world!", "Ünïcödé — text 日本語 🙂", "  two  spaces\nand a newline"]:
        ids = engine.tokenize(text)
        assert ids and all(isinstance(t, int) for t in ids)
        assert engine.detokenize(ids) == text


def test_apply_chat_template_is_the_prompt_chat_sends(engine):
    msgs = ask("Hi")
    prompt = engine.apply_chat_template(msgs)
    assert "Hi" in prompt and "You are a helpful assistant." in prompt
    r = engine.chat(msgs, temperature=0, max_tokens=1)
    assert r["usage"]["prompt_tokens"] == len(engine.tokenize(prompt))
