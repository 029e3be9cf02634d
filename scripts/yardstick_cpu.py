#!/usr/bin/env python3
"""Engram against llama.cpp by CPU time at one thread: prefill and decode tokens per CPU-second.

On a shared machine the wall clock measures the scheduler (llama.cpp's thread pool collapses
under load); one thread's CPU seconds are its compute, little changed by other processes.
This is the method of docs/cpu-kernels.md ("K-quant and IQ4_XS prefill on AVX-512 VNNI"):

- Engram prefill (after one untimed run that pages the file in): the user + system seconds of
  `engram bench speed --threads 1 --prompt-tokens P --decode-tokens 1 --reps 1 --membw-mib 16`
  minus the same at 16 prompt tokens, per P - 16 tokens (loading and the rest cancel out).
- Engram decode: the same with `--prompt-tokens 16 --decode-tokens D+1` minus `--decode-tokens 1`,
  per D tokens.
- llama.cpp (llama-cpp-python, n_threads 1, n_batch P): `time.process_time()` around one
  `llm.eval` of the same P tokens after an untimed warm-up eval; decode: D single-token evals
  after a 16-token prompt, each feeding back the argmax.

With --membw, `engram bench membw --threads 1 --reps 20 --json` runs before the first file and after the
last; the best 1-thread read bandwidth over the bytes one decode token reads (weights + KV at the
mean decode context, as `bench speed --json` reports them) is the decode limit, and the table gives
each decode figure's share of it (a 1-thread decode's CPU time is its wall time while it runs).

Rounds alternate Engram's binaries (--engram, repeatable: e.g. main's and a new build) and
llama.cpp per file; every figure of every round is printed, then the best per column.
Run it with the yardstick venv's python (`scripts/yardstick.sh setup VENV`):

  VENV/bin/python scripts/yardstick_cpu.py --file F16=/work/yard/llama-1b-f16.gguf \\
      --engram old=/work/bin/engram-old --engram new=target/release/engram --rounds 2
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_common import DEFAULT_ENGRAM, llamacpp_prefill_decode, load_llama, machine, run_json_child  # noqa: E402


def child_cpu(cmd):
    """User + system CPU seconds of running cmd to completion (it must exit 0), and its stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(cmd, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), out.stdout


def last_json(stdout):
    """The last line of stdout that is a JSON object, parsed (None if there is none)."""
    for line in reversed(stdout.splitlines()):
        if line.strip().startswith("{"):
            return json.loads(line)
    return None


def engram_cpu(engram, path, n_prompt, n_decode):
    """CPU seconds of one `bench speed` run at one thread, and its JSON report."""
    cpu, stdout = child_cpu([engram, "bench", "speed", "--model", path, "--threads", "1", "--json", "--reps", "1",
                             "--membw-mib", "16", "--prompt-tokens", str(n_prompt), "--decode-tokens", str(n_decode)])
    return cpu, last_json(stdout)


def engram_round(engram, path, n_prompt, n_decode):
    """Engram's prefill and decode tokens per CPU-second (differences of whole runs), and the bytes
    one decode token reads (weights + KV at the mean decode context, from the decode run's report).
    An untimed run first pages the file in: a first run that read it from disk would inflate the
    prefill baseline it is subtracted from, and so the prefill rate."""
    engram_cpu(engram, path, 16, 1)
    base = engram_cpu(engram, path, 16, 1)[0]
    pp = (n_prompt - 16) / max(engram_cpu(engram, path, n_prompt, 1)[0] - base, 1e-9)
    cpu, rep = engram_cpu(engram, path, 16, n_decode + 1)
    tg = n_decode / max(cpu - engram_cpu(engram, path, 16, 1)[0], 1e-9)
    nbytes = (rep["weight_bytes_per_token"] + rep.get("kv_bytes_per_token", 0)) if rep else 0
    return pp, tg, nbytes


def membw_1thread(engram):
    """`bench membw --threads 1`'s read bandwidth (GB/s), best of 20 reads (a shared machine preempts some)."""
    out = subprocess.run([engram, "bench", "membw", "--threads", "1", "--mib", "512", "--reps", "20", "--json"],
                         capture_output=True, text=True, check=True)
    rep = last_json(out.stdout)
    print(f"bench membw --threads 1 --mib 512 --reps 20: {json.dumps(rep)} (load {os.getloadavg()[0]:.2f})", flush=True)
    return rep["read_gb_s"]


def llamacpp_child(path, n_prompt, n_decode):
    """llama.cpp's prefill and decode tokens per CPU-second, one thread (run in a child process)."""
    llm = load_llama(path, n_prompt + n_decode + 32, n_prompt, 1, True)
    n_vocab = llm.n_vocab()
    tokens = [(i * 2_654_435_761 + 12345) % n_vocab for i in range(n_prompt)]
    llm.reset()
    llm.eval(tokens)  # warm-up: pages the weights in, repacks its buffers
    pp, tg = llamacpp_prefill_decode(llm, tokens, n_decode, time.process_time, decode_context=16)
    return {"prefill_tok_cpu_s": pp, "decode_tok_cpu_s": tg}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--file", action="append", default=[], metavar="LABEL=PATH", help="a GGUF file (repeatable)")
    ap.add_argument("--engram", action="append", default=[], metavar="[LABEL=]PATH",
                    help=f"an engram binary (repeatable; default {DEFAULT_ENGRAM})")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--no-llamacpp", action="store_true", help="time only the engram binaries")
    ap.add_argument("--membw", action="store_true",
                    help="measure the 1-thread read bandwidth (first and last) and give decode's share of the limit")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        print(json.dumps(llamacpp_child(args.child, args.prompt_tokens, args.decode_tokens)))
        return
    if not args.file:
        ap.error("--file LABEL=PATH is required")
    engrams = []
    for e in args.engram or [f"engram={DEFAULT_ENGRAM}"]:
        label, _, path = e.rpartition("=")
        engrams.append((label or os.path.basename(path), path))
    files = [(label, path) for label, _, path in (f.partition("=") for f in args.file)]
    best = {}
    loads = []
    nbytes = {}
    print(f"Machine: {machine()}; 1 thread; pp{args.prompt_tokens} (minus pp16) / tg{args.decode_tokens}; "
          "tokens per CPU-second, user + system", flush=True)
    bw = [membw_1thread(engrams[0][1])] if args.membw else []
    for label, path in files:
        for k in range(args.rounds):
            for name, engram in engrams:
                loads.append(os.getloadavg()[0])
                pp, tg, nbytes[label] = engram_round(engram, path, args.prompt_tokens, args.decode_tokens)
                print(f"[{label} round {k + 1}] {name}: prefill {pp:.2f} / decode {tg:.2f} tok per CPU-s "
                      f"(load {loads[-1]:.2f}; {nbytes[label] / 1e6:.1f} MB per decode token)", flush=True)
                b = best.setdefault((label, name), [0.0, 0.0])
                b[0], b[1] = max(b[0], pp), max(b[1], tg)
            if args.no_llamacpp:
                continue
            loads.append(os.getloadavg()[0])
            out, r = run_json_child(__file__, ["--child", path, "--prompt-tokens", str(args.prompt_tokens),
                                               "--decode-tokens", str(args.decode_tokens)])
            if r is None:
                print(f"llama.cpp failed on {path} (exit {out.returncode}):\n{out.stderr[-1500:]}", file=sys.stderr)
                continue
            print(f"[{label} round {k + 1}] llama.cpp: prefill {r['prefill_tok_cpu_s']:.2f} / decode "
                  f"{r['decode_tok_cpu_s']:.2f} tok per CPU-s (load {loads[-1]:.2f})", flush=True)
            b = best.setdefault((label, "llama.cpp"), [0.0, 0.0])
            b[0], b[1] = max(b[0], r["prefill_tok_cpu_s"]), max(b[1], r["decode_tok_cpu_s"])
    if args.membw:
        bw.append(membw_1thread(engrams[0][1]))
    print(f"\nbest of {args.rounds}, load average {min(loads):.2f}-{max(loads):.2f}"
          + (f"; 1-thread read bandwidth {min(bw):.1f}-{max(bw):.1f} GB/s, the best is the limit" if bw else "") + "\n")
    print("| file | runtime | prefill (tok per CPU-s) | decode (tok per CPU-s) | vs llama.cpp |"
          + (" MB per decode token | decode limit (tok/s) | decode of limit |" if bw else ""))
    print("|---|---|---:|---:|---|" + ("---:|---:|---:|" if bw else ""))
    for (label, name), (pp, tg) in best.items():
        ref = best.get((label, "llama.cpp"))
        ratio = f"{pp / ref[0]:.2f}x / {tg / ref[1]:.2f}x" if ref and ref[0] and ref[1] and name != "llama.cpp" else ""
        row = f"| {label} | {name} | {pp:.2f} | {tg:.2f} | {ratio} |"
        if bw and nbytes.get(label):
            limit = max(bw) * 1e9 / nbytes[label]
            row += f" {nbytes[label] / 1e6:.1f} | {limit:.1f} | {100 * tg / limit:.0f}% |"
        print(row)


if __name__ == "__main__":
    main()
