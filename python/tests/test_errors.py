"""Bad arguments raise ValueError / TypeError with messages that say what to fix; engine and
model failures raise engram.EngramError with the CLI's messages; Ctrl-C interrupts a generation
and leaves the engine usable."""

import _thread
import os
import threading
import time

import pytest

import engram
from conftest import THREADS, ask


@pytest.mark.parametrize(
    "kwargs, exc, message",
    [
        (dict(max_tokens=0), ValueError, "max_tokens must be at least 1, got 0"),
        (dict(max_tokens="10"), TypeError, "max_tokens must be an int, got str"),
        (dict(max_tokens=10**7), ValueError, "leaves room for at most"),
        (dict(temperature=3), ValueError, "temperature must be in [0, 2], got 3"),
        (dict(temperature=-1), ValueError, "temperature"),
        (dict(temperature="hot"), TypeError, "temperature must be a number, got str"),
        (dict(top_p=0), ValueError, "top_p"),
        (dict(top_k=-5), ValueError, "top_k must be >= 0"),
        (dict(stop=5), TypeError, "stop must be a str or a list of str, got int"),
        (dict(stop=["x"] * 17), ValueError, "at most 16 stop sequences"),
        (dict(seed=-1), ValueError, "seed must be >= 0"),
        (dict(frequency_penalty=9), ValueError, "frequency_penalty must be in [-2, 2]"),
        (dict(response_format={"type": "xml"}), ValueError, 'response_format.type must be "text", "json_object" or "json_schema"'),
        (dict(response_format="json"), ValueError, "response_format must be an object"),
        (dict(bogus=1), TypeError, "chat() got an unexpected keyword argument 'bogus'"),
        (dict(session_id="../x"), ValueError, "invalid session_id"),
    ],
)
def test_bad_options(engine, kwargs, exc, message):
    with pytest.raises(exc) as e:
        engine.chat(ask("Hi"), **kwargs)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "messages, exc, message",
    [
        ("hello", TypeError, "messages must be a list of dicts"),
        ({"role": "user", "content": "hi"}, TypeError, "messages must be a list of dicts"),
        ([], ValueError, "messages must not be empty"),
        ([{"role": "user"}], ValueError, 'messages[0] has no "content"'),
        ([{"content": "hi"}], ValueError, 'messages[0] has no "role"'),
        ([{"role": "wizard", "content": "hi"}], ValueError, 'messages[0]["role"] must be'),
        (["hi"], TypeError, "messages[0] must be a dict"),
        ([{"role": "user", "content": 5}], TypeError, 'messages[0]["content"] must be a str'),
    ],
)
def test_bad_messages(engine, messages, exc, message):
    with pytest.raises(exc) as e:
        engine.chat(messages)
    assert message in str(e.value)


def test_bad_tokens_and_prompts(engine):
    with pytest.raises(ValueError, match="token id -1 is outside the vocabulary"):
        engine.detokenize([-1])
    with pytest.raises(ValueError, match="outside the vocabulary of"):
        engine.complete([engine.vocab_size])
    with pytest.raises(TypeError, match="prompt must be a str or a list of token ids, got float"):
        engine.complete(1.5)
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.complete([])
    with pytest.raises(TypeError, match="texts must be a str or a list of str"):
        engine.embed(5)
    with pytest.raises(ValueError, match="invalid id"):
        engine.agent("../escape")


def test_bad_engine_arguments(model_path, tmp_path):
    with pytest.raises(engram.EngramError, match="no such file or folder"):
        engram.Engine(model=str(tmp_path / "missing.gguf"), data_dir=tmp_path)
    with pytest.raises(ValueError, match="kv_format"):
        engram.Engine(model=model_path, data_dir=tmp_path, kv_format="q3")
    with pytest.raises(ValueError, match="threads must be at least 1, got 0"):
        engram.Engine(model=model_path, data_dir=tmp_path, threads=0)
    with pytest.raises(TypeError):
        engram.Engine(model=model_path, data_dir=tmp_path, threads="two")
    not_a_model = tmp_path / "junk.gguf"
    not_a_model.write_bytes(b"not a gguf file")
    with pytest.raises(engram.EngramError, match=r"loading .*junk\.gguf"):
        engram.Engine(model=str(not_a_model), data_dir=tmp_path)


def test_a_data_dir_is_one_engines_at_a_time_and_closed_engines_refuse(model_path, tmp_path):
    first = engram.Engine(model=model_path, data_dir=tmp_path, threads=THREADS)
    with pytest.raises(engram.EngramError, match="is in use by another engram process"):
        engram.Engine(model=model_path, data_dir=tmp_path, threads=THREADS)
    first.close()
    with pytest.raises(engram.EngramError, match="this Engine is closed"):
        first.chat(ask("Hi"))
    # Closing let the directory go.
    with engram.Engine(model=model_path, data_dir=tmp_path, threads=THREADS) as again:
        assert again.chat(ask("Hi"), temperature=0, max_tokens=2)["usage"]["completion_tokens"] >= 1


def interrupt_after(seconds):
    def fire():
        time.sleep(seconds)
        _thread.interrupt_main()  # as Ctrl-C: SIGINT's handler runs in the main thread

    threading.Thread(target=fire, daemon=True).start()


@pytest.mark.parametrize("stream", [False, True])
def test_ctrl_c_interrupts_a_generation(engine, stream):
    interrupt_after(1.0)
    t = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        r = engine.chat(ask("Write a very long story."), temperature=0, max_tokens=4000, ignore_eos=True, stream=stream)
        if stream:
            for _ in r:
                pass
    assert time.monotonic() - t < 30, "interrupted well before 4000 tokens"
    # The engine goes on.
    assert engine.chat(ask("Hi"), temperature=0, max_tokens=2)["usage"]["completion_tokens"] >= 1
