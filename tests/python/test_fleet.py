"""A fleet of `engram serve` replicas sharing one remote KV tier on a real Redis.

- An agent created on replica A and continued on replica B: B knows the agent, reports the
  cached tokens of A's turn, and answers exactly as a single server does (greedy); the same
  after both replicas restart with empty data directories (only Redis remembers).
- Redis killed mid-run: the replicas keep answering, exactly, from their local tiers or by
  recomputing, and count the errors in /metrics (engram_remote_*); restarted empty, it is
  used again.

Each test starts its own redis-server on a free loopback port (skipped without one, except
under CI=true: CI installs it from Debian's packages).
"""

import os
import shutil
import socket
import subprocess
import time

import pytest
import redis as redis_py
import requests

from conftest import fixture_model, spawn_server, stop_server

SYSTEM = "You are a terse helper that answers in one line."
TURNS = ["Hello, who are you?", "Tell me about caches.", "And about Redis?", "Thanks, bye."]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    def __init__(self):
        if shutil.which("redis-server") is None:
            if os.environ.get("CI") == "true":
                pytest.fail("redis-server is not installed (CI installs it: .ci/run)")
            pytest.skip("redis-server is not installed")
        self.port = free_port()
        self.proc = None
        self.start()

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}/"

    def start(self):
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if self.client().ping():
                    return
            except redis_py.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def client(self):
        return redis_py.Redis(host="127.0.0.1", port=self.port)

    def kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture()
def redis():
    r = Redis()
    yield r
    r.kill()


def generate(base, agent, history):
    """One agent turn: the whole conversation so far, greedy; returns (text, cached tokens)."""
    r = requests.post(f"{base}/v1/agents/{agent}/generate",
                      json={"messages": history, "max_tokens": 12, "temperature": 0}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    return body["text"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


def metric(base, name):
    text = requests.get(base + "/metrics", timeout=30).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def reference_answers(model, tmp):
    """What one server without a remote tier answers, turn by turn."""
    proc, base = spawn_server(model, tmp / "single")
    try:
        assert requests.post(base + "/v1/agents", json={"id": "helper", "system": SYSTEM}, timeout=30).status_code == 201
        history, answers = [], []
        for t in TURNS:
            history.append({"role": "user", "content": t})
            text, _ = generate(base, "helper", history)
            answers.append(text)
            history.append({"role": "assistant", "content": text})
        return answers
    finally:
        stop_server(proc)


def test_an_agent_follows_its_conversation_to_another_replica(tmp_path, redis):
    model = fixture_model(tmp_path)
    expected = reference_answers(model, tmp_path)
    remote = ["--kv-remote", redis.url, "--kv-remote-timeout-ms", "500"]
    a, ua = spawn_server(model, tmp_path / "a", *remote)
    b, ub = spawn_server(model, tmp_path / "b", *remote)
    try:
        assert requests.post(ua + "/v1/agents", json={"id": "helper", "system": SYSTEM}, timeout=30).status_code == 201
        history = [{"role": "user", "content": TURNS[0]}]
        text, cached = generate(ua, "helper", history)
        assert text == expected[0]
        history.append({"role": "assistant", "content": text})
        # Turn 2 on B: the agent and its cache come from Redis (written behind A's turn).
        history.append({"role": "user", "content": TURNS[1]})
        deadline = time.time() + 10
        while requests.get(ub + "/v1/agents/helper", timeout=30).status_code != 200:
            assert time.time() < deadline, "replica B never found the agent"
            time.sleep(0.1)
        time.sleep(0.5)  # A's write-behind of the session
        text, cached = generate(ub, "helper", history)
        assert text == expected[1], "B answers as a single server does"
        assert cached > 0, "B restored A's turn from the remote tier"
        assert metric(ub, "engram_remote_hits_total") >= 1
        assert metric(ub, "engram_remote_tokens_restored_total") >= cached
        history.append({"role": "assistant", "content": text})
    finally:
        stop_server(a)
        stop_server(b)

    # Both replicas restart with empty data directories: only Redis remembers.
    shutil.rmtree(tmp_path / "a")
    shutil.rmtree(tmp_path / "b")
    a, ua = spawn_server(model, tmp_path / "a2", *remote)
    b, ub = spawn_server(model, tmp_path / "b2", *remote)
    try:
        time.sleep(0.5)
        history.append({"role": "user", "content": TURNS[2]})
        text, cached = generate(ub, "helper", history)
        assert text == expected[2]
        assert cached > 0, "warm after a restart with empty disks"
        history.append({"role": "assistant", "content": text})

        # A learns the agent (from Redis) before Redis dies; then it still answers, exactly
        # (nothing of the conversation is local to it: recomputed), and counts the errors.
        assert requests.get(ua + "/v1/agents/helper", timeout=30).status_code == 200
        redis.kill()
        history.append({"role": "user", "content": TURNS[3]})
        text, _ = generate(ua, "helper", history)
        assert text == expected[3]
        assert metric(ua, "engram_remote_read_errors_total") >= 1
        assert metric(ua, "engram_remote_connected") == 0
        assert requests.get(ua + "/health", timeout=30).status_code == 200
    finally:
        stop_server(a)
        stop_server(b)


def test_a_damaged_value_is_a_miss_not_a_wrong_answer(tmp_path, redis):
    """Every run value in Redis bit-flipped: the other replica recomputes, answers exactly, and
    counts the bad values."""
    model = fixture_model(tmp_path)
    expected = reference_answers(model, tmp_path)
    remote = ["--kv-remote", redis.url]
    a, ua = spawn_server(model, tmp_path / "a", *remote)
    b, ub = spawn_server(model, tmp_path / "b", *remote)
    try:
        assert requests.post(ua + "/v1/agents", json={"id": "helper", "system": SYSTEM}, timeout=30).status_code == 201
        history = [{"role": "user", "content": TURNS[0]}]
        text, _ = generate(ua, "helper", history)
        history += [{"role": "assistant", "content": text}, {"role": "user", "content": TURNS[1]}]
        time.sleep(0.5)
        flipped = 0
        store = redis.client()
        for k in store.keys("*:run:*"):
            n = store.strlen(k)
            store.setrange(k, n - 100, bytes([store.getrange(k, n - 100, n - 100)[0] ^ 0xFF]))
            flipped += 1
        assert flipped > 0
        text, cached = generate(ub, "helper", history)
        assert text == expected[1], "recomputed, exactly"
        assert cached == 0
        assert metric(ub, "engram_remote_bad_values_total") >= 1
    finally:
        stop_server(a)
        stop_server(b)
