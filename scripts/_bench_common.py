"""Helpers shared by the bench_*.py scripts in this folder (not a script itself).

llama_cpp and numpy are imported inside the functions that need them, so that
importing this module (and running a script with --help) needs neither.
"""

import json
import os
import platform
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_ENGRAM = os.path.join(REPO, "target", "release", "engram")


def machine():
    """The CPU model name from lscpu, else what the platform module reports."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                return line.split(":", 1)[1].strip()
    except (OSError, subprocess.CalledProcessError):
        pass
    return platform.processor() or platform.machine()


def write_json_out(path, result):
    """Writes result to path as indented JSON ending in a newline, and says so on stderr."""
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
        f.write("\n")
    print(f"wrote {path}", file=sys.stderr)


def import_llama_cpp_or_exit():
    """Returns the llama_cpp module, or exits with an install hint if it is missing."""
    try:
        import llama_cpp
    except ImportError:
        sys.exit("llama-cpp-python is not installed: pip install llama-cpp-python")
    return llama_cpp


def run_json_child(script, args):
    """Runs `python3 SCRIPT ARGS` with output captured; returns (the CompletedProcess, its last stdout line as JSON on exit 0, else None)."""
    cmd = [sys.executable, os.path.abspath(script)] + args
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return out, None
    return out, json.loads(out.stdout.strip().splitlines()[-1])


def disable_extra_bufts():
    """Makes every later Llama() in this process load without repacked / AMX weight buffers (llama-bench's --no-repack)."""
    import llama_cpp
    import llama_cpp.llama as llama_mod

    # Llama() does not expose `use_extra_bufts`, so patch the defaults it starts from.
    orig = llama_cpp.llama_model_default_params

    def params():
        p = orig()
        p.use_extra_bufts = False
        return p

    llama_mod.llama_cpp.llama_model_default_params = params


def load_llama(path, n_ctx, n_batch, threads, extra_bufts):
    """A CPU-only llama_cpp.Llama on path: n_ubatch = n_batch, n_threads = n_threads_batch = threads, mmap, quiet."""
    from llama_cpp import Llama

    if not extra_bufts:
        disable_extra_bufts()
    return Llama(
        model_path=path,
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=threads,
        n_threads_batch=threads,
        n_gpu_layers=0,
        use_mmap=True,
        logits_all=False,
        verbose=False,
    )


def argmax_last(llm, n_vocab=None):
    """The argmax of the context's last-token logits (n_vocab: llm.n_vocab() unless given)."""
    import numpy as np

    if n_vocab is None:
        n_vocab = llm.n_vocab()
    # llama-cpp-python 0.3.x no longer copies logits into `llm.scores` unless
    # logits_all=True, so read the context's last-token logits directly.
    return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(n_vocab,))))


def llamacpp_prefill_decode(llm, tokens, n_gen, clock, decode_context=1):
    """One timed prefill of `tokens` from an empty cache, then `n_gen` timed greedy one-token
    decode steps after the first `decode_context` tokens, by `clock` (`time.perf_counter`: the
    wall clock; `time.process_time`: this process's CPU time). Returns (prefill, decode) tokens
    per second of that clock."""
    n_vocab = llm.n_vocab()
    llm.reset()  # the next eval clears the whole KV cache (llama_memory_clear in llama-bench)
    t = clock()
    llm.eval(tokens)
    pp = len(tokens) / (clock() - t)
    llm.reset()
    llm.eval(tokens[:decode_context])
    nxt = argmax_last(llm, n_vocab)
    t = clock()
    for _ in range(n_gen):
        llm.eval([nxt])
        nxt = argmax_last(llm, n_vocab)
    return pp, n_gen / (clock() - t)
