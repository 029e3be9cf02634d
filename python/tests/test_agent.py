"""Agents keep their conversation and KV cache across calls and across processes: a new Python
process on the same data directory resumes the agent warm (cached tokens > 0), and its answer
equals a cold engine's on the same conversation."""

import json
import os
import subprocess
import sys

import engram
from conftest import SYSTEM, THREADS, text_of

TURN = """
import json, sys, engram
e = engram.Engine(model=sys.argv[1], data_dir=sys.argv[2], threads=int(sys.argv[4]))
a = e.agent("planner", system=sys.argv[5])
answer = a.chat(sys.argv[3], temperature=0, max_tokens=24)
print(json.dumps({"answer": answer, "cached": a.cached_tokens, "prompt": a.prompt_tokens, "history": a.history}))
"""


def turn_in_new_process(model_path, data_dir, message):
    out = subprocess.run(
        [sys.executable, "-c", TURN, model_path, str(data_dir), message, str(THREADS), SYSTEM["content"]],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_an_agent_resumes_warm_in_a_new_process(model_path, tmp_path):
    data = tmp_path / "data"
    first = turn_in_new_process(model_path, data, "What is the capital of France?")
    assert "Paris" in first["answer"], first
    assert os.path.exists(data / "kv" / "agents.json")
    second = turn_in_new_process(model_path, data, "And what is the capital of Germany?")
    # The whole first turn (its prompt at least) came from the cache written by the first process.
    assert second["cached"] >= first["prompt"] > 0, (first, second)
    assert second["history"][:2] == first["history"]
    # A cold engine on the same conversation gives the same answer.
    with engram.Engine(model=model_path, data_dir=tmp_path / "cold", threads=THREADS) as cold:
        r = cold.chat([SYSTEM] + second["history"][:3], temperature=0, max_tokens=24)
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert text_of(r) == second["answer"]


def test_agents_are_kept_listed_and_deleted(model_path, tmp_path):
    with engram.Engine(model=model_path, data_dir=tmp_path, threads=THREADS) as e:
        a = e.agent("helper", system=SYSTEM["content"])
        assert a.cached_tokens == 0 and a.history == []
        a.chat("Hi", temperature=0, max_tokens=4)
        a.chat("Thanks", temperature=0, max_tokens=4)
        assert a.cached_tokens > 0
        assert e.agents() == ["helper"]
        # The same id with another system prompt is refused; with none it is the same agent.
        try:
            e.agent("helper", system="Something else.")
            raise AssertionError("another system prompt was accepted")
        except ValueError as err:
            assert "exists with another system prompt" in str(err)
        assert len(e.agent("helper").history) == 4
        a.delete()
        assert e.agents() == []
        assert not (tmp_path / "agents" / "helper.history").exists()
        try:
            a.chat("Still there?")
            raise AssertionError("a deleted agent answered")
        except engram.EngramError as err:
            assert "no agent" in str(err)
