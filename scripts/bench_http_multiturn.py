#!/usr/bin/env python3
"""Multi-turn time to first token over HTTP: `engram serve` next to llama.cpp's
OpenAI-compatible server (llama-cpp-python's `llama_cpp.server`), same GGUF,
same thread count.

Each server is started alone (never both at once, so they do not share the
CPUs), gets one untimed warm-up request ("Hi", max_tokens 1, pages the weights
in), then the same N-turn chat conversation (default 4) with streaming
(`openai` package, temperature 0, max_tokens 16). Every turn resends the whole
conversation plus a new ~100-word user message (deterministic text) and the
time to the first streamed chunk with non-empty content is measured (TTFT).

By default the assistant replies put back into the conversation are a fixed
short sentence, not the generated text: with a random-weight fixture the
generated text is arbitrary bytes that need not re-tokenize to the generated
tokens, which would cut both servers' prefix reuse for reasons unrelated to
caching. `--echo-assistant` resends what each server generated instead.

Prompt tokens come from the streamed `usage` (stream_options.include_usage)
when the server sends it (Engram does; llama_cpp.server 0.3.x does not).

llama.cpp's extra weight buffer types (repack / AMX) are OFF by default
(`use_extra_bufts = False` patched into the model defaults before
`llama_cpp.server` starts, as scripts/bench_llamacpp.py does), because
llama-cpp-python 0.3.x segfaults with them on quantized files on some
machines; `--llamacpp-extra-bufts` keeps them.

Usage (from the repository root):

    pip install 'llama-cpp-python[server]' openai
    python3 scripts/bench_http_multiturn.py --model /tmp/engram-fixtures/llama-1b-q4_0.gguf \\
        --threads 2 --json-out /tmp/http-multiturn.json
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from _bench_common import DEFAULT_ENGRAM, write_json_out

WORDS = (
    "the system reads a request parses the fields checks the cache and then schedules "
    "work across threads while the model computes attention over every previous token "
    "so that long conversations reuse earlier results instead of paying for them again "
    "each time a user sends another message about files tests builds errors and plans"
).split()

FIXED_REPLY = "Understood. I have noted that and will take it into account."

LLAMA_LAUNCHER = r"""
import sys, runpy
if sys.argv[1] == "no-extra-bufts":
    import llama_cpp
    orig = llama_cpp.llama_model_default_params
    def params():
        p = orig()
        p.use_extra_bufts = False
        return p
    llama_cpp.llama_model_default_params = params
    import llama_cpp.llama as llama_mod
    llama_mod.llama_cpp.llama_model_default_params = params
sys.argv = ["llama_cpp.server"] + sys.argv[2:]
runpy.run_module("llama_cpp.server", run_name="__main__", alter_sys=True)
"""


def user_message(turn, n_words=100):
    # Deterministic, different per turn.
    out = []
    x = 1234567 + 7919 * turn
    for _ in range(n_words):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out.append(WORDS[(x >> 8) % len(WORDS)])
    return f"Turn {turn + 1}: " + " ".join(out) + "."


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_ready(base, proc, timeout):
    t = time.time()
    while time.time() - t < timeout:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(base + "/models", timeout=2) as r:
                if r.status == 200:
                    return True
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.5)
    return False


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def converse(base, model, turns, max_tokens, echo_assistant, label, one_token=False):
    from openai import OpenAI

    client = OpenAI(base_url=base, api_key="unused", timeout=600)
    # Warm-up, not timed: pages the weights in.
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=1, temperature=0)

    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    rows = []
    for turn in range(turns):
        messages.append({"role": "user", "content": user_message(turn)})
        kwargs = dict(model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True)
        t0 = time.perf_counter()
        try:
            stream = client.chat.completions.create(stream_options={"include_usage": True}, **kwargs)
        except Exception:  # noqa: BLE001 - a server without stream_options
            t0 = time.perf_counter()
            stream = client.chat.completions.create(**kwargs)
        ttft = first_chunk = None
        text = []
        usage = None
        for chunk in stream:
            now = time.perf_counter()
            if first_chunk is None:
                first_chunk = now - t0
            if getattr(chunk, "usage", None):
                usage = chunk.usage
            for c in chunk.choices or []:
                content = getattr(c.delta, "content", None)
                if content:
                    if ttft is None:
                        ttft = now - t0
                    text.append(content)
        total = time.perf_counter() - t0
        if one_token:
            # The whole request is the prefill plus one token: its time is the TTFT,
            # whatever that token renders as.
            ttft = total
        reply = "".join(text)
        prompt_tokens = getattr(usage, "prompt_tokens", None) if usage else None
        cached = None
        if usage is not None and getattr(usage, "prompt_tokens_details", None) is not None:
            cached = getattr(usage.prompt_tokens_details, "cached_tokens", None)
        rows.append({
            "turn": turn + 1,
            "prompt_tokens": prompt_tokens,
            "cached_tokens": cached,
            "ttft_ms": round(ttft * 1e3, 1) if ttft is not None else None,
            "first_chunk_ms": round(first_chunk * 1e3, 1) if first_chunk is not None else None,
            "total_ms": round(total * 1e3, 1),
            "reply_chars": len(reply),
        })
        print(f"[{label}] turn {turn + 1}: ttft {rows[-1]['ttft_ms']} ms, prompt tokens {prompt_tokens}, cached {cached}",
              file=sys.stderr, flush=True)
        messages.append({"role": "assistant", "content": reply if echo_assistant else FIXED_REPLY})
    return rows


def run_engram(args, log_dir):
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="engram-http-mt-")
    log = open(os.path.join(log_dir, "engram.log"), "w")
    cmd = [args.engram, "serve", "--model", args.model, "--port", str(port), "--data-dir", data_dir, "--threads", str(args.threads)]
    print(" ".join(cmd), file=sys.stderr)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        if not wait_ready(base, proc, args.start_timeout):
            raise RuntimeError(f"engram serve did not come up (exit {proc.poll()}); see {log.name}")
        return converse(base, "default", args.turns, args.max_tokens, args.echo_assistant, "engram", args.one_token), " ".join(cmd)
    finally:
        stop(proc)
        log.close()
        shutil.rmtree(data_dir, ignore_errors=True)


def run_llamacpp(args, log_dir):
    port = free_port()
    log = open(os.path.join(log_dir, "llamacpp.log"), "w")
    mode = "extra-bufts" if args.llamacpp_extra_bufts else "no-extra-bufts"
    server_args = ["--model", args.model, "--n_ctx", str(args.n_ctx), "--n_threads", str(args.threads),
                   "--n_threads_batch", str(args.threads), "--n_batch", "512", "--host", "127.0.0.1", "--port", str(port)]
    cmd = [sys.executable, "-c", LLAMA_LAUNCHER, mode] + server_args
    shown = f"python3 -m llama_cpp.server {' '.join(server_args)}" + ("" if args.llamacpp_extra_bufts else "  (use_extra_bufts=False patched in)")
    print(shown, file=sys.stderr)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        if not wait_ready(base, proc, args.start_timeout):
            raise RuntimeError(f"llama_cpp.server did not come up (exit {proc.poll()}); see {log.name}")
        rows = converse(base, "default", args.turns, args.max_tokens, args.echo_assistant, "llama.cpp", args.one_token)
        if proc.poll() is not None:
            raise RuntimeError(f"llama_cpp.server exited ({proc.returncode}); see {log.name}")
        return rows, shown
    finally:
        stop(proc)
        log.close()


def fmt(v, spec=".0f"):
    return "n/a" if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="/tmp/engram-fixtures/llama-1b-q4_0.gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--n-ctx", type=int, default=4096, help="llama.cpp server context (default: %(default)s)")
    ap.add_argument("--engram", default=DEFAULT_ENGRAM)
    ap.add_argument("--skip-engram", action="store_true")
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--llamacpp-extra-bufts", action="store_true", help="keep llama.cpp's repack/AMX weight buffers (may segfault)")
    ap.add_argument("--echo-assistant", action="store_true", help="resend the generated replies instead of a fixed one")
    ap.add_argument("--one-token", action="store_true",
                    help="ask for one token per turn and report the whole request's time as TTFT (robust when a "
                         "random-weight model's first tokens render as empty text)")
    ap.add_argument("--start-timeout", type=float, default=120)
    ap.add_argument("--log-dir", help="server logs (default: a temporary directory, printed)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if args.one_token:
        args.max_tokens = 1

    log_dir = args.log_dir or tempfile.mkdtemp(prefix="http-mt-logs-")
    os.makedirs(log_dir, exist_ok=True)
    load_start = os.getloadavg()
    result = {"model": args.model, "threads": args.threads, "turns": args.turns, "max_tokens": args.max_tokens,
              "echo_assistant": args.echo_assistant, "loadavg_start": load_start, "log_dir": log_dir}
    notes = []
    e_rows = l_rows = None
    if not args.skip_engram:
        if not os.path.exists(args.engram):
            notes.append(f"engram skipped: {args.engram} not found")
        else:
            try:
                e_rows, result["engram_cmd"] = run_engram(args, log_dir)
            except Exception as ex:  # noqa: BLE001 - report, keep going
                notes.append(f"engram failed: {ex}")
    if not args.skip_llamacpp:
        try:
            import llama_cpp
            import uvicorn  # noqa: F401 - the [server] extra

            result["llama_cpp_python_version"] = getattr(llama_cpp, "__version__", "?")
            l_rows, result["llamacpp_cmd"] = run_llamacpp(args, log_dir)
        except ImportError as ex:
            notes.append(f"llama.cpp skipped: {ex} (pip install 'llama-cpp-python[server]')")
        except Exception as ex:  # noqa: BLE001
            notes.append(f"llama.cpp failed: {ex}")
    result["loadavg_end"] = os.getloadavg()
    result["engram"] = e_rows
    result["llamacpp"] = l_rows
    result["notes"] = notes

    print(f"Model {args.model}; threads {args.threads}; {args.turns} turns, max_tokens {args.max_tokens}, temperature 0, streaming; "
          f"load average {load_start[0]:.2f} at start, {result['loadavg_end'][0]:.2f} at end\n")
    print("| turn | prompt tokens (engram usage) | engram cached tokens | engram TTFT ms | llama.cpp TTFT ms | llama.cpp first chunk ms |")
    print("|---:|---:|---:|---:|---:|---:|")
    for i in range(args.turns):
        e = e_rows[i] if e_rows and i < len(e_rows) else {}
        lr = l_rows[i] if l_rows and i < len(l_rows) else {}
        pt = e.get("prompt_tokens") or lr.get("prompt_tokens")
        print(f"| {i + 1} | {fmt(pt, 'd')} | {fmt(e.get('cached_tokens'), 'd')} | {fmt(e.get('ttft_ms'))} | {fmt(lr.get('ttft_ms'))} "
              f"| {fmt(lr.get('first_chunk_ms'))} |")
    print("\nTTFT = the whole one-token request (--one-token)." if args.one_token else "\nTTFT = first streamed chunk with non-empty content. Engram sends its role chunk at once (before prefill)\n"
          "and then one content chunk per token. llama_cpp.server sends its role chunk together with the first\n"
          "generated text chunk, i.e. after prefill + the first token, so its 'first chunk' is the time to the\n"
          "first token even when that token renders as empty text (special/unused tokens of a random-weight\n"
          "model): compare Engram TTFT with llama.cpp first chunk.")
    for n in notes:
        print(f"\nnote: {n}")
    print(f"\nserver logs: {log_dir}")
    if args.json_out:
        write_json_out(args.json_out, result)


if __name__ == "__main__":
    main()
