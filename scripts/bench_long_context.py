#!/usr/bin/env python3
"""A long conversation over HTTP, served with DynaKV over KV offloaded to disk against exact
attention at the same history: decode tok/s, peak RSS, and the turn after a restart.

One N-token prefill serves both paths: the per-request threshold (`long_context_after`) moves
the same conversation from exact KV to DynaKV by copying its rows, so the two decode rates are
measured on the same history in the same server, minutes apart:

  server A  --kv-budget-mib E (the whole KV fits), --long-context-after far above N (exact by
            default), --long-context-ram-mib R, --disk-budget-mib D
    turn 1  N tokens of text (this repository's Rust source, repeated), 1 token out: the
            prefill (timed)
    turn 2  turn 1 + its answer + a question, T tokens out, exact attention: decode tok/s at N
    turn 3  turn 2 + its answer + a question with `long_context_after` A < N: the exact rows
            are copied into DynaKV (the older KV to a file), T tokens out: decode tok/s at N
  server B  the same data directory, --kv-budget-mib S far below the full KV at N
    turn 4  turn 3 + its answer + a question (`long_context_after` A): resumed from the saved
            state, cached tokens ~ the history (no re-prefill), T tokens out: decode tok/s;
            B's peak RSS is the model, the KV budget and the sparse state's RAM

`--sparse-only` skips the exact prefill (its cost grows with N squared; at 32K it takes most of
an hour on 2 cores): server A runs with the small KV budget S, and turn 1 already carries
`long_context_after` A, so the prompt streams into DynaKV chunk by chunk (the bounded prefill);
turn 2 decodes sparse at N, then the restart and turn 3 as turn 4 above. Exact decode at N is
then measured by `engram bench sparse --speed-model` (a KV of N rows filled without a prefill).

Decode tok/s is the engine's own count: the tokens after the first over the seconds between
them, from `/metrics` (`engram_inter_token_seconds_count` and `_sum`, before and after the
turn), so a model whose tokens print nothing (the random-weight fixture) is timed too; the
chunk arrivals' rate is reported beside it where the text has chunks. Peak RSS is the server's
VmHWM (/proc/PID/status), read after the turn. Beside it, a thread samples the server's
/proc/PID/status and smaps_rollup every 0.25 s: each row's `mem` is the turn's maxima of VmRSS
and its split (RssAnon: heap, stacks and the model's weights, which are copied out of the file;
RssFile: file pages mapped; RssShmem), `mem_save` the same while the turn's save is written
(`mem_idle`: the server before turn 1); `--mem-trace FILE` writes every sample as CSV.

Usage (from the repository root; the fixture from `engram fixture llama-1b --out DIR
--formats q4_0`):

    python3 scripts/bench_long_context.py --model /tmp/fix/llama-1b-q4_0.gguf --tokens 32768 \\
        --threads 2 --json-out /tmp/long-context.json
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from _bench_common import DEFAULT_ENGRAM, REPO, machine, write_json_out

CHARS_PER_TOKEN = 2.1  # Rust source under the llama-1b fixture's tokenizer (measured: 24,000 chars, 11,183 tokens)


def source_text(chars):
    """`chars` characters of this repository's Rust source, repeated as needed."""
    parts = []
    for root, _, files in sorted(os.walk(os.path.join(REPO, "crates"))):
        for f in sorted(files):
            if f.endswith(".rs"):
                with open(os.path.join(root, f), encoding="utf-8", errors="replace") as h:
                    parts.append(h.read())
    text = "\n".join(parts)
    while len(text) < chars:
        text += text
    return text[:chars]


def free_port():
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def vm_hwm_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return None


def load_avg():
    return os.getloadavg()


MEM_FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem")


def mem_status(pid):
    """The server's memory counters (MiB) from /proc/PID/status: peak and current RSS, and the
    current RSS split into anonymous memory (heap, stacks), file-backed pages (the model's
    mapping) and shared memory; `Private_Dirty` from smaps_rollup beside them."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k = line.split(":", 1)[0]
                if k in MEM_FIELDS:
                    out[k] = int(line.split()[1]) / 1024
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Private_Dirty:"):
                    out["PrivateDirty"] = int(line.split()[1]) / 1024
    except OSError:
        pass
    return out


class MemTrace:
    """Samples the server's `mem_status` every `period` seconds on a thread, labelled with the
    phase the benchmark is in, into a CSV file; `peaks()` gives each phase's maxima."""

    def __init__(self, path, period=0.25):
        import threading

        self.file = open(path, "w") if path else None
        if self.file:
            self.file.write("t,phase," + ",".join(MEM_FIELDS + ("PrivateDirty",)) + "\n")
        self.period, self.pid, self.phase, self.max = period, None, "start", {}
        self.t0 = time.time()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def watch(self, pid, phase):
        with self.lock:
            self.pid, self.phase = pid, phase

    def loop(self):
        while not self.stopped.wait(self.period):
            with self.lock:
                pid, phase = self.pid, self.phase
            if pid is None:
                continue
            m = mem_status(pid)
            if not m:
                continue
            with self.lock:
                peak = self.max.setdefault(phase, {})
                for k, v in m.items():
                    peak[k] = max(peak.get(k, 0.0), v)
            if self.file:
                cols = [f"{m.get(k, 0):.1f}" for k in MEM_FIELDS + ("PrivateDirty",)]
                self.file.write(f"{time.time() - self.t0:.2f},{phase}," + ",".join(cols) + "\n")
                self.file.flush()

    def peaks(self, phase):
        with self.lock:
            return {k: round(v, 1) for k, v in self.max.get(phase, {}).items()}

    def stop(self):
        self.stopped.set()
        self.thread.join()
        if self.file:
            self.file.close()


class Server:
    def __init__(self, args, data_dir, extra, label):
        self.port = free_port()
        self.cmd = [args.engram, "serve", "--model", args.model, "--port", str(self.port), "--data-dir", data_dir,
                    "--threads", str(args.threads), "--no-rag"] + extra
        self.log = open(os.path.join(args.log_dir, f"{label}.log"), "a")
        print(" ".join(self.cmd), file=sys.stderr, flush=True)
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        t = time.time()
        while time.time() - t < args.start_timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"engram serve exited {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(self.base + "/v1/models", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.5)
        raise RuntimeError(f"engram serve did not come up; see {self.log.name}")

    def complete(self, prompt, max_tokens, timeout, long_context_after=None):
        """Streams one completion: (text, usage, token arrival times, seconds to the first token)."""
        req = {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
               "stream": True, "stream_options": {"include_usage": True}}
        if long_context_after is not None:
            req["long_context_after"] = long_context_after
        body = json.dumps(req).encode()
        req = urllib.request.Request(self.base + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
        t0 = time.perf_counter()
        text, usage, times = "", None, []
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                ev = json.loads(data)
                if ev.get("usage"):
                    usage = ev["usage"]
                for c in ev.get("choices", []):
                    if c.get("text") is not None:
                        times.append(time.perf_counter())
                        text += c["text"]
        return text, usage, times, (times[0] - t0) if times else None

    def metric(self, name):
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " ") or line.startswith(name + "{"):
                    return float(line.rsplit(" ", 1)[1])
        return None

    def settle(self, saves, timeout=600):
        """Waits until `/metrics` shows `saves` saves asked for and none pending: the engine
        refreshes its gauges after the turn's end and once the writer is done, so the sparse
        session's gauges read after this are the kept session's, not the running sequence's."""
        t = time.time()
        while time.time() - t < timeout:
            if (self.metric("engram_long_context_saves_total") or 0) >= saves and not self.metric("engram_long_context_saves_pending"):
                return
            time.sleep(0.2)

    def inter_token(self):
        """The engine's inter-token histogram: (count, seconds)."""
        with urllib.request.urlopen(self.base + "/metrics", timeout=10) as r:
            text = r.read().decode()
        n = s = 0.0
        for line in text.splitlines():
            if line.startswith("engram_inter_token_seconds_count "):
                n = float(line.rsplit(" ", 1)[1])
            elif line.startswith("engram_inter_token_seconds_sum "):
                s = float(line.rsplit(" ", 1)[1])
        return n, s

    def timed(self, prompt, max_tokens, timeout, long_context_after=None):
        """`complete`, plus the engine's decode tok/s over the turn and the turn's wall seconds."""
        n0, s0 = self.inter_token()
        t = time.perf_counter()
        out = self.complete(prompt, max_tokens, timeout, long_context_after)
        wall = time.perf_counter() - t
        n1, s1 = self.inter_token()
        tps = (n1 - n0) / (s1 - s0) if n1 > n0 and s1 > s0 else None
        return out + (tps, wall)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def decode_row(label, text, usage, times, ttft, engine_tps, wall, hwm, load):
    n = len(times)
    chunk_tps = (n - 1) / (times[-1] - times[0]) if n > 1 and times[-1] > times[0] else None
    return {"turn": label, "prompt_tokens": usage and usage.get("prompt_tokens"),
            "cached_tokens": usage and usage.get("prompt_tokens_details", {}).get("cached_tokens"),
            "completion_tokens": usage and usage.get("completion_tokens"), "chunks": n,
            "decode_tok_s": engine_tps, "chunk_tok_s": chunk_tps, "first_token_s": ttft, "turn_s": wall,
            "peak_rss_mib": hwm, "load_avg_1m": load[0], "answer": text}


def keep_conversation(args, text):
    """With `--keep-state DIR`: the conversation so far (every prompt and answer, as the next
    turn's prompt starts) beside the server's data folder, so `--resume-state DIR` can ask the
    next turn of the same conversation."""
    if args.keep_state:
        with open(os.path.join(args.keep_state, "conversation.json"), "w") as f:
            json.dump({"tokens": args.tokens, "after": args.after, "text": text}, f)


def run(args):
    if args.resume_state:
        return resume(args)
    if args.keep_state:
        data_dir = os.path.join(args.keep_state, "data")
        os.makedirs(data_dir, exist_ok=False)
    else:
        data_dir = tempfile.mkdtemp(prefix="engram-long-")
    common = ["--long-context-ram-mib", str(args.ram_mib), "--disk-budget-mib", str(args.disk_mib)]
    server_a = ["--kv-budget-mib", str(args.sparse_kv_mib if args.sparse_only else args.exact_kv_mib),
                "--long-context-after", str(10 * args.tokens + 1_000_000)] + common
    server_b = ["--kv-budget-mib", str(args.sparse_kv_mib), "--long-context-after", str(10 * args.tokens + 1_000_000)] + common
    rows, commands = [], []
    prompt = source_text(int(args.tokens * CHARS_PER_TOKEN))
    trace = MemTrace(args.mem_trace)
    try:
        s = Server(args, data_dir, server_a, "a")
        commands.append(" ".join(s.cmd))
        trace.watch(s.proc.pid, "a idle")
        time.sleep(1)
        idle = trace.peaks("a idle")
        trace.watch(s.proc.pid, "turn 1")
        t = time.perf_counter()
        a, u, _, _ = s.complete(prompt, 1, args.timeout, args.after if args.sparse_only else None)
        label = "1 prefill (bounded, DynaKV)" if args.sparse_only else "1 prefill (exact)"
        rows.append({"turn": label, "prompt_tokens": u and u.get("prompt_tokens"), "seconds": time.perf_counter() - t,
                     "peak_rss_mib": vm_hwm_mib(s.proc.pid), "load_avg_1m": load_avg()[0],
                     "switches": s.metric("engram_long_context_switches_total"), "mem_idle": idle})
        trace.watch(s.proc.pid, "turn 1 save")
        if args.sparse_only:
            s.settle(1)
        rows[-1]["mem"] = trace.peaks("turn 1")
        rows[-1]["mem_save"] = trace.peaks("turn 1 save")
        print(f"turn 1: {rows[-1]}", file=sys.stderr, flush=True)
        keep_conversation(args, prompt + a)
        turns = [(2, "2 exact", None), (3, "3 DynaKV (switched)", args.after)]
        if args.sparse_only:
            turns = [(2, "2 DynaKV", args.after)]
        for turn, label, after in turns:
            prompt = prompt + a + f"\n// Question {turn}: what does the code above do?\n"
            trace.watch(s.proc.pid, f"turn {turn}")
            a, u, times, ttft, tps, wall = s.timed(prompt, args.decode, args.timeout, after)
            rows.append(decode_row(label, a, u, times, ttft, tps, wall, vm_hwm_mib(s.proc.pid), load_avg()))
            trace.watch(s.proc.pid, f"turn {turn} save")
            if after is not None:
                s.settle(turn if args.sparse_only else 1)
            rows[-1]["mem"] = trace.peaks(f"turn {turn}")
            rows[-1]["mem_save"] = trace.peaks(f"turn {turn} save")
            rows[-1]["switches"] = s.metric("engram_long_context_switches_total")
            rows[-1]["offload_bytes"] = s.metric("engram_long_context_offload_bytes")
            rows[-1]["long_context_ram_bytes"] = s.metric("engram_long_context_ram_bytes")
            print(f"turn {turn}: {rows[-1]}", file=sys.stderr, flush=True)
            keep_conversation(args, prompt + a)
        rows[-1]["saved_bytes"] = s.metric("engram_long_context_saved_bytes")
        t = time.perf_counter()
        s.stop()
        rows[-1]["stop_s"] = time.perf_counter() - t  # the writer finishes the turn's save first
        if not args.no_restart:
            s = Server(args, data_dir, server_b, "b")
            commands.append(" ".join(s.cmd))
            prompt = prompt + a + "\n// Question 4: and what does it return?\n"
            trace.watch(s.proc.pid, "restarted turn")
            a, u, times, ttft, tps, wall = s.timed(prompt, args.decode, args.timeout, args.after)
            rows.append(decode_row("DynaKV after a restart", a, u, times, ttft, tps, wall, vm_hwm_mib(s.proc.pid), load_avg()))
            trace.watch(s.proc.pid, "restarted turn save")
            s.settle(1)
            rows[-1]["mem"] = trace.peaks("restarted turn")
            rows[-1]["mem_save"] = trace.peaks("restarted turn save")
            rows[-1]["disk_resumes"] = s.metric("engram_long_context_disk_resumes_total")
            rows[-1]["switches"] = s.metric("engram_long_context_switches_total")
            rows[-1]["long_context_ram_bytes"] = s.metric("engram_long_context_ram_bytes")
            print(f"turn 4: {rows[-1]}", file=sys.stderr, flush=True)
            keep_conversation(args, prompt + a)
            s.stop()
    finally:
        trace.stop()
        if not args.keep_state:
            shutil.rmtree(data_dir, ignore_errors=True)
    return commands, rows


def resume(args):
    """`--resume-state DIR`: a copy of a kept conversation's data folder (the kept one stays as
    it is, so it can be resumed again by another binary): server A (the small KV budget) resumes
    it from disk and answers a turn, its save; then server B on the same copy, another turn and
    its save. Each row is a restarted turn, measured as the full run's."""
    with open(os.path.join(args.resume_state, "conversation.json")) as f:
        text = json.load(f)["text"]
    data_dir = tempfile.mkdtemp(prefix="engram-long-resume-", dir=args.resume_copy_dir)
    os.rmdir(data_dir)
    shutil.copytree(os.path.join(args.resume_state, "data"), data_dir)
    server = ["--kv-budget-mib", str(args.sparse_kv_mib), "--long-context-after", str(10 * args.tokens + 1_000_000),
              "--long-context-ram-mib", str(args.ram_mib), "--disk-budget-mib", str(args.disk_mib)]
    rows, commands, prompt = [], [], text
    trace = MemTrace(args.mem_trace)
    try:
        for label in ("a", "b"):
            s = Server(args, data_dir, server, label)
            commands.append(" ".join(s.cmd))
            trace.watch(s.proc.pid, f"{label} idle")
            time.sleep(1)
            idle = trace.peaks(f"{label} idle")
            prompt = prompt + f"\n// Question ({label}): what does the code above do?\n"
            trace.watch(s.proc.pid, f"{label} restarted turn")
            a, u, times, ttft, tps, wall = s.timed(prompt, args.decode, args.timeout, args.after)
            rows.append(decode_row(f"DynaKV after a restart ({label})", a, u, times, ttft, tps, wall,
                                   vm_hwm_mib(s.proc.pid), load_avg()))
            trace.watch(s.proc.pid, f"{label} restarted turn save")
            s.settle(1)
            rows[-1]["mem_idle"] = idle
            rows[-1]["mem"] = trace.peaks(f"{label} restarted turn")
            rows[-1]["mem_save"] = trace.peaks(f"{label} restarted turn save")
            rows[-1]["peak_rss_after_save_mib"] = vm_hwm_mib(s.proc.pid)
            rows[-1]["disk_resumes"] = s.metric("engram_long_context_disk_resumes_total")
            rows[-1]["long_context_ram_bytes"] = s.metric("engram_long_context_ram_bytes")
            print(f"restarted turn ({label}): {rows[-1]}", file=sys.stderr, flush=True)
            prompt = prompt + a
            s.stop()
    finally:
        trace.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
    return commands, rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engram", default=DEFAULT_ENGRAM)
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, default=32768, help="history length (approximate, from characters)")
    p.add_argument("--decode", type=int, default=16, help="tokens decoded at the history's length")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--after", type=int, default=4096, help="the requests' long_context_after")
    p.add_argument("--ram-mib", type=int, default=32, help="--long-context-ram-mib")
    p.add_argument("--sparse-kv-mib", type=int, default=256, help="--kv-budget-mib after the restart")
    p.add_argument("--exact-kv-mib", type=int, default=4096, help="--kv-budget-mib before it (the whole KV fits)")
    p.add_argument("--disk-mib", type=int, default=8192, help="--disk-budget-mib")
    p.add_argument("--no-restart", action="store_true")
    p.add_argument("--sparse-only", action="store_true", help="no exact prefill or exact decode: DynaKV from turn 1")
    p.add_argument("--timeout", type=float, default=7200)
    p.add_argument("--start-timeout", type=float, default=300)
    p.add_argument("--log-dir", default=tempfile.gettempdir())
    p.add_argument("--json-out")
    p.add_argument("--keep-state", help="an absent folder: the server's data folder is kept in DIR/data and the "
                   "conversation in DIR/conversation.json, for --resume-state")
    p.add_argument("--resume-state", help="a folder --keep-state wrote: no prefill; two restarted turns (each "
                   "with its save) on a copy of it")
    p.add_argument("--resume-copy-dir", help="where --resume-state's copy goes (default: the temporary folder)")
    p.add_argument("--mem-trace", help="CSV file: the server's RSS split (RssAnon, RssFile, ...) sampled every 0.25 s")
    args = p.parse_args()
    commands, rows = run(args)
    result = {"cpu": machine(), "threads": args.threads, "tokens": args.tokens, "decode": args.decode, "commands": commands, "rows": rows}
    if not args.sparse_only and not args.resume_state:
        exact, sparse = rows[1]["decode_tok_s"], rows[2]["decode_tok_s"]
        result["dynakv_over_exact"] = sparse / exact if sparse and exact else None
    print(json.dumps(result, indent=2))
    if args.json_out:
        write_json_out(args.json_out, result)


if __name__ == "__main__":
    main()
