"""A fleet of `engram serve` replicas sharing one remote KV tier on a real Redis.

- An agent created on replica A and continued on replica B: B knows the agent, reports the
  cached tokens of A's turn, and answers exactly as a single server does (greedy); the same
  after both replicas restart with empty data directories (only Redis remembers).
- Redis killed mid-run: the replicas keep answering, exactly, from their local tiers or by
  recomputing, and count the errors in /metrics (engram_remote_*); restarted empty, it is
  used again.
- `--context dual`: a user's facts added on A are attended on B, also after both restart
  empty; an agent deleted on A is gone on B.

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
        # B lists the agents A created (the tier's index), and finds them by id.
        deadline = time.time() + 10
        while {a["id"] for a in requests.get(ub + "/v1/agents", timeout=30).json()["data"]} != {"helper"}:
            assert time.time() < deadline, "replica B never listed A's agent"
            time.sleep(0.1)
        assert requests.get(ub + "/v1/agents/helper", timeout=30).status_code == 200
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


def ask_dual(base, user, thread, messages):
    """One dual-stream chat turn, greedy; the answer."""
    r = requests.post(base + "/v1/chat/completions", timeout=60,
                      json={"model": "tiny-q8_0", "messages": messages, "max_tokens": 10, "temperature": 0,
                            "user": user, "thread_id": thread})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_a_users_facts_follow_them_and_a_deleted_agent_is_gone_everywhere(tmp_path, redis):
    """`--context dual`: a fact added on replica A is listed and attended on B (B answers as a
    user whose system messages spell it out), also after both restart with empty data
    directories. An agent deleted on A is a 404 on B, which held it."""
    model = fixture_model(tmp_path)
    remote = ["--kv-remote", redis.url, "--kv-remote-timeout-ms", "500", "--context", "dual"]
    fact = "The user's name is Ann and she keeps bees."
    question = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What do you know about me?"}]
    spelled = [question[0], {"role": "system", "content": "Fact about the user: " + fact}, question[1]]
    a, ua = spawn_server(model, tmp_path / "a", *remote)
    b, ub = spawn_server(model, tmp_path / "b", *remote)
    try:
        assert requests.post(ua + "/v1/users/ann/facts", json={"text": fact}, timeout=30).status_code == 201
        assert requests.post(ua + "/v1/agents", json={"id": "helper"}, timeout=30).status_code == 201
        time.sleep(0.5)  # A's write-behind
        listed = requests.get(ub + "/v1/users/ann/facts", timeout=30).json()["data"]
        assert [f["text"] for f in listed] == [fact]
        expected = ask_dual(ub, "ref", "t", spelled)
        assert ask_dual(ub, "ann", "t", question) == expected, "B attends the fact A added"
        assert requests.get(ub + "/v1/agents/helper", timeout=30).status_code == 200
        assert requests.delete(ua + "/v1/agents/helper", timeout=30).status_code == 200
        time.sleep(0.5)
        assert requests.get(ub + "/v1/agents/helper", timeout=30).status_code == 404, "gone on B too"
    finally:
        stop_server(a)
        stop_server(b)
    shutil.rmtree(tmp_path / "a")
    shutil.rmtree(tmp_path / "b")
    b, ub = spawn_server(model, tmp_path / "b2", *remote)
    try:
        assert ask_dual(ub, "ann", "t", question) == expected, "the facts outlive both replicas"
    finally:
        stop_server(b)


class Partition:
    """Redis in a network namespace of its own, reached over a veth pair; `cut()` takes the
    link down (packets vanish: no reset, reads hang until the replica's timeout), `heal()`
    brings it back. Needs root with CAP_NET_ADMIN (`ip netns`); `None` where that fails."""

    def __init__(self):
        tag = f"{os.getpid() % 10000}"
        self.ns, self.host_if, self.ns_if = f"engram-fleet-{tag}", f"engh{tag}", f"engr{tag}"
        octet = 16 + os.getpid() % 200
        self.redis_ip, self.host_ip = f"10.213.{octet}.1", f"10.213.{octet}.2"
        self.port = free_port()
        self.proc = None

    def run(self, *cmd):
        subprocess.run(cmd, check=True, capture_output=True)

    def up(self):
        if shutil.which("ip") is None or shutil.which("redis-server") is None:
            return False
        try:
            self.run("ip", "netns", "add", self.ns)
        except (subprocess.CalledProcessError, OSError):
            return False
        self.run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        self.run("ip", "link", "set", self.ns_if, "netns", self.ns)
        self.run("ip", "addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
        self.run("ip", "link", "set", self.host_if, "up")
        self.run("ip", "netns", "exec", self.ns, "ip", "addr", "add", f"{self.redis_ip}/24", "dev", self.ns_if)
        self.run("ip", "netns", "exec", self.ns, "ip", "link", "set", self.ns_if, "up")
        self.run("ip", "netns", "exec", self.ns, "ip", "link", "set", "lo", "up")
        self.proc = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, "redis-server", "--port", str(self.port), "--bind", self.redis_ip,
             "--protected-mode", "no", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 10
        while time.time() < deadline:
            try:
                if redis_py.Redis(host=self.redis_ip, port=self.port, socket_timeout=1).ping():
                    return True
            except redis_py.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server in the namespace did not start")

    @property
    def url(self):
        return f"redis://{self.redis_ip}:{self.port}/"

    def cut(self):
        self.run("ip", "link", "set", self.host_if, "down")

    def heal(self):
        self.run("ip", "link", "set", self.host_if, "up")

    def down(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)


def test_a_replica_cut_off_from_redis_keeps_answering_exactly(tmp_path):
    """Redis behind its own network namespace; mid-run the link to it goes down (no resets:
    reads hang until the timeout). Replicas answer exactly, each request within a bound, errors
    counted; once the link is back they use the tier again. Where namespaces cannot be made
    (no CAP_NET_ADMIN), Redis on loopback stops answering every client instead (CLIENT PAUSE),
    which looks the same to a replica."""
    part = Partition()
    netns = part.up()
    redis = None
    if not netns:
        redis = Redis()
        url = redis.url
        cut = lambda: redis.client().execute_command("CLIENT", "PAUSE", "20000", "ALL")
        heal = lambda: redis.client().execute_command("CLIENT", "UNPAUSE")
    else:
        url, cut, heal = part.url, part.cut, part.heal
    model = fixture_model(tmp_path)
    expected = reference_answers(model, tmp_path)
    remote = ["--kv-remote", url, "--kv-remote-timeout-ms", "300"]
    a = b = None
    try:
        a, ua = spawn_server(model, tmp_path / "a", *remote)
        b, ub = spawn_server(model, tmp_path / "b", *remote)
        assert requests.post(ua + "/v1/agents", json={"id": "helper", "system": SYSTEM}, timeout=30).status_code == 201
        history = [{"role": "user", "content": TURNS[0]}]
        text, _ = generate(ua, "helper", history)
        assert text == expected[0]
        history += [{"role": "assistant", "content": text}, {"role": "user", "content": TURNS[1]}]
        time.sleep(0.5)
        text, cached = generate(ub, "helper", history)
        assert text == expected[1] and cached > 0, "warm on B through the tier"
        history.append({"role": "assistant", "content": text})

        cut()
        # A holds only turn 1 locally: it looks in the tier (which does not answer), times out,
        # and recomputes the rest, exactly.
        history.append({"role": "user", "content": TURNS[2]})
        start = time.time()
        text, _ = generate(ua, "helper", history)
        took = time.time() - start
        assert text == expected[2], "exact while Redis is unreachable"
        assert took < 20, f"a turn took {took:.1f} s with Redis unreachable (timeout 0.3 s per trip)"
        # Its write-behind of the turn fails (or is dropped during the backoff), counted.
        deadline = time.time() + 10
        while metric(ua, "engram_remote_write_errors_total") + metric(ua, "engram_remote_writes_dropped_total") < 1:
            assert time.time() < deadline, "the failed write-behind was not counted"
            time.sleep(0.2)
        # A lookup (an agent A does not know) is a miss within the timeout, counted.
        start = time.time()
        assert requests.get(ua + "/v1/agents/nobody", timeout=30).status_code == 404
        assert time.time() - start < 3, "a lookup against an unreachable store outlived its timeout"
        assert metric(ua, "engram_remote_read_errors_total") >= 1
        assert metric(ua, "engram_remote_connected") == 0
        history.append({"role": "assistant", "content": text})

        heal()
        time.sleep(5.5)  # the longest backoff
        history.append({"role": "user", "content": TURNS[3]})
        text, _ = generate(ub, "helper", history)
        assert text == expected[3]
        time.sleep(0.5)
        # The tier answers again: a lookup from A for an agent it never saw is found there.
        assert requests.post(ub + "/v1/agents", json={"id": "second", "system": SYSTEM}, timeout=30).status_code == 201
        deadline = time.time() + 15
        while requests.get(ua + "/v1/agents/second", timeout=30).status_code != 200:
            assert time.time() < deadline, "A never reached the tier again after the link came back"
            time.sleep(0.5)
        assert metric(ua, "engram_remote_connected") == 1
    finally:
        for p in (a, b):
            if p is not None:
                stop_server(p)
        if netns:
            part.down()
        if redis is not None:
            redis.kill()
