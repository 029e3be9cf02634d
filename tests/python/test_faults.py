"""Faults: a real `engram serve` killed, starved of disk, denied writes, and
handed cache files cut short under it.

Every test compares temperature-0 answers with a reference server that runs on a fresh
data dir of its own: whatever the faults did to the caches, an answer must equal the one
a server that never saw them gives (nothing corrupt is used), and whatever the server
reported as stored (an agent it answered 201 for) must still be there after a restart.

- SIGKILL at random moments while 8 clients chat and create agents (sessions are being
  saved after every turn), five times over one data dir;
- a full disk: the data dir on a small tmpfs (when this process may mount one), else a
  per-process file-size limit (RLIMIT_FSIZE, writes fail with EFBIG) — saves fail, answers
  do not, an agent that cannot be stored is an error and not a 201;
- a read-only data dir (the server run as `nobody` when the tests run as root);
- cache files truncated and swapped while the server holds their sessions restored;
- with `--context dual`, users' stream files and threads' ring files truncated and swapped
  under the running server.
"""

import os
import random
import resource
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

from conftest import BIN, fixture_model, spawn_server, stop_server

CONVERSATIONS = [f"Conversation {i} about {w}." for i, w in enumerate(
    ["caches", "blocks", "tenants", "agents", "rings", "budgets", "turns", "threads"])]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return fixture_model(tmp_path_factory.mktemp("faults-model"))


def chat(base, messages, timeout=60):
    r = requests.post(base + "/v1/chat/completions", timeout=timeout,
                      json={"model": "tiny-q8_0", "messages": messages, "max_tokens": 10, "temperature": 0})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def conversation(base, opening, turns=3):
    """A multi-turn chat; returns [(messages, answer)] turn by turn."""
    msgs = [{"role": "system", "content": "Answer briefly."}]
    out = []
    for t in range(turns):
        msgs.append({"role": "user", "content": f"{opening} Turn {t}."})
        answer = chat(base, list(msgs))
        out.append((list(msgs), answer))
        msgs.append({"role": "assistant", "content": answer})
    return out


class Reference:
    """Answers of a server on a data dir of its own (no cache files of the faulty one)."""

    def __init__(self, model, tmp):
        self.proc, self.base = spawn_server(model, tmp / "reference-data")
        self.memo = {}

    def answer(self, messages):
        key = repr(messages)
        if key not in self.memo:
            self.memo[key] = chat(self.base, messages)
        return self.memo[key]

    def close(self):
        stop_server(self.proc)


@pytest.fixture(scope="module")
def reference(model, tmp_path_factory):
    ref = Reference(model, tmp_path_factory.mktemp("faults-ref"))
    yield ref
    ref.close()


def assert_answers_equal_reference(base, reference, conversations):
    for opening in conversations:
        for msgs, answer in conversation(base, opening):
            assert answer == reference.answer(msgs), f"{msgs[-1]['content']!r}: cached path differs from a fresh server"


def test_sigkill_during_load_and_saves_loses_nothing_reported_stored(model, reference, tmp_path):
    data = tmp_path / "data"
    stored_agents = set()
    lock = threading.Lock()
    rng = random.Random(19)
    for round_ in range(5):
        proc, base = spawn_server(model, data)
        stop = threading.Event()

        def client(i):
            r = random.Random(round_ * 100 + i)
            while not stop.is_set():
                try:
                    if r.random() < 0.25:
                        resp = requests.post(base + "/v1/agents", json={"system": f"Agent {i} is terse."}, timeout=30)
                        if resp.status_code == 201:
                            with lock:
                                stored_agents.add(resp.json()["id"])
                    else:
                        conversation(base, r.choice(CONVERSATIONS), turns=r.randint(1, 3))
                except (requests.ConnectionError, requests.Timeout, requests.HTTPError):
                    return

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        time.sleep(rng.uniform(0.5, 2.5))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        stop.set()
        for t in threads:
            t.join(timeout=60)
    proc, base = spawn_server(model, data)
    try:
        listed = {a["id"] for a in requests.get(base + "/v1/agents", timeout=30).json()["data"]}
        assert stored_agents, "no agent was created during the load"
        assert stored_agents <= listed, f"agents answered 201 then lost: {sorted(stored_agents - listed)}"
        assert_answers_equal_reference(base, reference, CONVERSATIONS)
        # The live server's own saves of the turns just run may be mid-write (`.tmp-<its pid>-`);
        # every other temporary file is a killed process's and must have been cleaned at open.
        leftovers = [p for p in data.rglob("*") if p.is_file() and ".tmp" in p.name and f".tmp-{proc.pid}-" not in p.name]
        assert not leftovers, f"temporary files of killed saves were left behind: {leftovers}"
    finally:
        stop_server(proc)


def try_tmpfs(path, size):
    """Mounts a tmpfs of `size` at `path`; False where this process may not mount."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    return r.returncode == 0


def spawn_limited(model, data, file_size_limit):
    """`spawn_server` with every file the process writes capped at `file_size_limit` bytes."""
    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the cap fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_size_limit, file_size_limit))
    return spawn_server(model, data, preexec_fn=limit)


def test_a_full_disk_fails_saves_not_answers(model, reference, tmp_path):
    data = tmp_path / "full"
    mounted = try_tmpfs(data, "4m")
    try:
        if mounted:
            proc, base = spawn_server(model, data)
            # Leave a few KiB: the server's first files fit, the sessions' do not.
            free = shutil.disk_usage(data).free
            with open(data / "filler", "wb") as f:
                f.write(b"\0" * max(0, free - 16 * 1024))
        else:
            proc, base = spawn_limited(model, data, 4096)
        try:
            assert_answers_equal_reference(base, reference, CONVERSATIONS[:3])
            r = requests.post(base + "/v1/agents", json={"system": "x" * 20000}, timeout=30)
            assert r.status_code != 201 and r.status_code < 600, r.text
            if r.status_code >= 400:
                assert "error" in r.json(), r.text
            assert requests.get(base + "/health", timeout=10).status_code == 200
        finally:
            stop_server(proc)
        if mounted:
            (data / "filler").unlink()
        proc, base = spawn_server(model, data)
        try:
            assert_answers_equal_reference(base, reference, CONVERSATIONS[:3])
        finally:
            stop_server(proc)
    finally:
        if mounted:
            subprocess.run(["umount", str(data)], check=False)


def test_a_read_only_data_dir_serves_without_caching(model, reference, tmp_path):
    data = tmp_path / "ro"
    proc, base = spawn_server(model, data)  # lay the dir out as a writable server would
    conversation(base, CONVERSATIONS[0])
    stop_server(proc)
    for p in [data, *data.rglob("*")]:
        os.chmod(p, 0o555 if p.is_dir() else 0o444)
    os.chmod(tmp_path, 0o755)
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root without setpriv: cannot drop the right to write")
        os.chmod(model, 0o644)
        for p in [model.parent, *model.parents]:
            if p == Path("/"):
                break
            os.chmod(p, os.stat(p).st_mode | 0o005)
        proc, base = spawn_server(model, data, wrapper=("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"))
    else:
        proc, base = spawn_server(model, data)
    try:
        assert_answers_equal_reference(base, reference, CONVERSATIONS[:3])
        r = requests.post(base + "/v1/agents", json={"system": "Terse."}, timeout=30)
        assert r.status_code >= 500 and "error" in r.json(), f"an agent that cannot be stored: {r.status_code} {r.text}"
        assert requests.get(base + "/health", timeout=10).status_code == 200
    finally:
        stop_server(proc)
        for p in [data, *data.rglob("*")]:
            os.chmod(p, 0o755 if p.is_dir() else 0o644)


def cache_files(data):
    return sorted(p for p in data.rglob("*.safetensors") if p.is_file())


def follow_up(turns, reference, extra):
    """The conversation `turns` continued by the user messages `extra`, answered by the reference."""
    msgs, answer = turns[-1]
    msgs = msgs + [{"role": "assistant", "content": answer}]
    for i, say in enumerate(extra):
        msgs = msgs + [{"role": "user", "content": say}]
        if i + 1 < len(extra):
            msgs = msgs + [{"role": "assistant", "content": reference.answer(msgs)}]
    return msgs


def test_cache_files_truncated_or_swapped_under_a_running_server(model, reference, tmp_path):
    data = tmp_path / "cut"
    proc, base = spawn_server(model, data)
    first = {o: conversation(base, o) for o in CONVERSATIONS[:4]}
    stop_server(proc)
    files = cache_files(data)
    assert len(files) >= 4, f"expected persisted sessions, found {files}"
    # Hold every file open: the server replaces a path when it saves a session again, but
    # these stay the very files (inodes) it restored and mapped.
    held = [open(f, "r+b") for f in files]
    proc, base = spawn_server(model, data)
    try:
        for turns in first.values():
            msgs = follow_up(turns, reference, ["And then?"])
            assert chat(base, msgs) == reference.answer(msgs)
        # Cut every restored file to half under the server, and swap two paths.
        for f in held:
            size = os.fstat(f.fileno()).st_size
            os.ftruncate(f.fileno(), size // 2)
        now = cache_files(data)
        if len(now) >= 2:
            tmp = now[0].with_name("swap-under-test")
            os.rename(now[0], tmp)
            os.rename(now[1], now[0])
            os.rename(tmp, now[1])
        for turns in first.values():
            msgs = follow_up(turns, reference, ["And then?", "Once more."])
            assert chat(base, msgs) == reference.answer(msgs)
        assert proc.poll() is None, "the server died"
    finally:
        stop_server(proc)
        for f in held:
            f.close()
    # Restarted on the damaged dir: the bad files are dropped, never used.
    proc, base = spawn_server(model, data)
    try:
        assert_answers_equal_reference(base, reference, CONVERSATIONS[:4])
    finally:
        stop_server(proc)


def test_a_second_process_on_the_same_data_dir_is_refused(model, tmp_path):
    """One writing process per data directory: while a server runs, a second `serve`, the
    `cache` and `rag` commands on its directory stop at once with a clear error and change
    nothing; once the server is gone they run."""
    data = tmp_path / "shared"
    proc, base = spawn_server(model, data)
    try:
        conversation(base, CONVERSATIONS[0])

        def files():
            # The live server's own in-flight writes (`.tmp-<its pid>-`) come and go between the
            # listing and the stat: they are not what a refused process could have changed.
            out = []
            for p in data.rglob("*"):
                if f".tmp-{proc.pid}-" in p.name:
                    continue
                try:
                    if p.is_file():
                        out.append((p.relative_to(data), p.stat().st_size))
                except FileNotFoundError:
                    continue
            return sorted(out)

        # The server saves the session in the background: wait until the directory is still.
        before, deadline = files(), time.time() + 30
        while time.time() < deadline:
            time.sleep(1.0)
            now = files()
            if now == before:
                break
            before = now
        d = ["--data-dir", str(data)]
        for args in (["serve", "--model", str(model), "--port", "0", *d], ["cache", "ls", *d], ["rag", *d, "ls"]):
            r = subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=60)
            assert r.returncode != 0, f"{args[0]} ran beside the server: {r.stdout} {r.stderr}"
            assert "in use by another engram process" in r.stderr and "--data-dir" in r.stderr, r.stderr
        assert files() == before, "a refused process changed the data directory"
        assert requests.get(base + "/health", timeout=10).status_code == 200
    finally:
        stop_server(proc)
    r = subprocess.run([str(BIN), "cache", "ls", "--data-dir", str(data)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def dual_chat(base, messages, user, thread):
    r = requests.post(base + "/v1/chat/completions", timeout=60,
                      json={"model": "tiny-q8_0", "messages": messages, "max_tokens": 10, "temperature": 0,
                            "user": user, "thread_id": thread})
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


class DualScript:
    """One conversation per (user, thread) against one `--context dual` server, the history
    kept here as a client keeps it."""

    def __init__(self, base):
        self.base, self.history = base, {}

    def say(self, user, thread, text):
        msgs = self.history.setdefault((user, thread), [{"role": "system", "content": "Answer briefly."}])
        msgs.append({"role": "user", "content": text})
        answer = dual_chat(self.base, list(msgs), user, thread)
        msgs.append({"role": "assistant", "content": answer})
        return answer


def test_dual_stream_files_truncated_or_swapped_under_a_running_server(model, tmp_path):
    """`--context dual`: users' persistent stream files and their threads' ring files cut to
    nothing (and two stream files swapped) under the running server. The server keeps
    answering, each answer equal to a server that never saw the damage; restarted on the
    damaged directory, a new thread answers as on a fresh server."""
    data = tmp_path / "dual"
    ref_proc, ref_base = spawn_server(model, tmp_path / "dual-ref", "--context", "dual")
    proc, base = spawn_server(model, data, "--context", "dual")
    try:
        ref, got = DualScript(ref_base), DualScript(base)

        def both(user, thread, text):
            want = ref.say(user, thread, text)
            assert got.say(user, thread, text) == want, f"{user}/{thread}: {text!r}"

        for user in ("ann", "bob"):
            both(user, "t1", f"{user} asks about rings.")
            both(user, "t1", "And then?")
        dual_dir = data / "kv" / "dual"
        # The stream files are written in the background: wait for both users' and the rings'.
        deadline = time.time() + 30
        while time.time() < deadline:
            streams = sorted(dual_dir.glob("stream-*.safetensors"))
            if len(streams) >= 2:
                break
            time.sleep(0.2)
        assert len(streams) >= 2, f"expected both users' stream files in {dual_dir}: {list(dual_dir.iterdir())}"
        files = sorted(p for p in dual_dir.rglob("*.safetensors") if p.is_file())
        assert len(files) > len(streams), f"expected ring turn files beside the streams: {files}"
        for f in files:
            with open(f, "r+b") as h:
                os.ftruncate(h.fileno(), 0)
        tmp = streams[0].with_name("swap-under-test")
        os.rename(streams[0], tmp)
        os.rename(streams[1], streams[0])
        os.rename(tmp, streams[1])
        # A new thread of each user attends the stream; the old threads go on with their rings.
        for user in ("ann", "bob"):
            both(user, "t2", "A new thread.")
            both(user, "t1", "Once more.")
        assert proc.poll() is None, "the server died"
    finally:
        stop_server(proc)
    proc, base = spawn_server(model, data, "--context", "dual")
    try:
        got = DualScript(base)
        for user in ("ann", "bob"):
            both(user, "t3", "After the restart.")
    finally:
        stop_server(proc)
        stop_server(ref_proc)
