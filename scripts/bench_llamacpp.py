#!/usr/bin/env python3
"""Engram against llama.cpp on the same GGUF files, same thread count.

For each of Q4_0, Q8_0, F16 (and Q4_K_M when present) of the `llama-1b`
fixture, runs `engram bench speed --json` and then llama.cpp (through
llama-cpp-python) on the same file, and prints a Markdown table of prefill
(pp512) and decode (tg128) tokens/s.

llama.cpp is measured the way llama-bench measures pp512 / tg128 (and the way
`engram bench speed` does):
  * context n_ctx=1024, n_batch=512, n_ubatch=512, n_threads = n_threads_batch = --threads;
  * one untimed warm-up eval of the 512-token prompt;
  * prefill: KV cleared, then one timed `eval` of the 512 tokens;
  * decode: KV cleared, one untimed token, then 128 timed single-token evals,
    each feeding the previous argmax (as engram's bench does);
  * best of --reps repetitions (default 2).
The prompt is the same deterministic pseudo-random token sequence engram uses.

Usage (from the repository root):

    pip install llama-cpp-python        # builds llama.cpp from source (~10 min)
    cargo build --release -p engram-cli
    python3 scripts/bench_llamacpp.py --fixture-dir /tmp/engram-fixtures --threads 2 \\
        --json-out /tmp/bench.json

Missing fixture files are generated with
`engram fixture llama-1b --out DIR --formats f16,q8_0,q4_0,q4_k_m` (~9 GB, a few minutes).
"""

import argparse
import json
import os
import subprocess
import sys
import time

from _bench_common import DEFAULT_ENGRAM, import_llama_cpp_or_exit, llamacpp_prefill_decode, load_llama, machine, run_json_child, write_json_out

SHAPE = "llama-1b"
FORMATS = ["q4_0", "q8_0", "f16", "q4_k_m"]  # q4_k_m is optional
REQUIRED = ["q4_0", "q8_0", "f16"]
N_PROMPT = 512
N_GEN = 128


def ensure_fixture(engram, fixture_dir):
    paths = {f: os.path.join(fixture_dir, f"{SHAPE}-{f}.gguf") for f in FORMATS}
    if not all(os.path.exists(paths[f]) for f in REQUIRED):
        print(f"generating the {SHAPE} fixture in {fixture_dir} (several GB, a few minutes)...", file=sys.stderr)
        subprocess.run([engram, "fixture", SHAPE, "--out", fixture_dir, "--formats", ",".join(FORMATS)], check=True)
    return [(f, paths[f]) for f in FORMATS if os.path.exists(paths[f])]


def bench_engram(engram, path, threads, reps):
    cmd = [engram, "bench", "speed", "--model", path, "--threads", str(threads), "--json", "--reps", str(reps)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    for line in reversed(out.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON in the output of {' '.join(cmd)}:\n{out.stdout[-2000:]}")


def prompt_tokens(n_vocab, n):
    # The same formula as `engram bench speed` (crates/bench/src/speed.rs); the
    # modulus is the vocabulary size as llama.cpp reports it. Which ids does not
    # matter for speed.
    return [(i * 2_654_435_761 + 12345) % n_vocab for i in range(n)]


def bench_llamacpp(path, threads, reps, extra_bufts=True):
    llm = load_llama(path, 2 * N_PROMPT, N_PROMPT, threads, extra_bufts)
    n_vocab = llm.n_vocab()
    tokens = prompt_tokens(n_vocab, N_PROMPT)

    # Warm-up: pages the weights in and lets llama.cpp allocate its buffers.
    llm.reset()
    llm.eval(tokens)

    best_pp = best_tg = 0.0
    for _ in range(reps):
        pp, tg = llamacpp_prefill_decode(llm, tokens, N_GEN, time.perf_counter)
        best_pp, best_tg = max(best_pp, pp), max(best_tg, tg)
    del llm
    return {"prefill_tok_s": round(best_pp, 2), "decode_tok_s": round(best_tg, 2)}


def bench_llamacpp_isolated(path, threads, reps):
    """Runs bench_llamacpp in a child process (a llama.cpp crash must not end the
    whole run; it also returns the memory). If llama.cpp crashes with its extra
    weight buffer types (repack / AMX), retries without them and says so."""
    for extra in (True, False):
        child_args = ["--child", path, "--threads", str(threads), "--reps", str(reps)]
        if not extra:
            child_args.append("--no-extra-bufts")
        out, r = run_json_child(__file__, child_args)
        if out.returncode == 0:
            r["llamacpp_extra_bufts"] = extra
            return r
        print(f"llama.cpp failed on {path} (exit {out.returncode}, extra buffer types {'on' if extra else 'off'}):\n{out.stderr[-1500:]}", file=sys.stderr)
    return None


def llamacpp_version():
    import llama_cpp

    v = getattr(llama_cpp, "__version__", "?")
    info = ""
    try:
        info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    except Exception:  # noqa: BLE001 - informational only
        pass
    return v, info


def ratio(a, b):
    return round(a / b, 3) if b else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture-dir", default="/tmp/engram-fixtures", help="where the llama-1b fixture lives (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=2, help="timed repetitions, best kept (default: %(default)s)")
    ap.add_argument("--engram", default=DEFAULT_ENGRAM, help="engram binary (default: target/release/engram)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="subset of q4_0,q8_0,f16,q4_k_m (default: all present)")
    ap.add_argument("--json-out", help="also write the results as JSON to this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--no-extra-bufts", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        print(json.dumps(bench_llamacpp(args.child, args.threads, args.reps, extra_bufts=not args.no_extra_bufts)))
        return

    if not os.path.exists(args.engram):
        sys.exit(f"{args.engram} not found: run `cargo build --release -p engram-cli` or pass --engram")
    import_llama_cpp_or_exit()

    wanted = [f for f in args.formats.split(",") if f]
    files = [(f, p) for f, p in ensure_fixture(args.engram, args.fixture_dir) if f in wanted]
    version, sysinfo = llamacpp_version()
    rows = []
    for fmt, path in files:
        print(f"[{fmt}] engram ...", file=sys.stderr, flush=True)
        e = bench_engram(args.engram, path, args.threads, args.reps)
        print(f"[{fmt}] engram {e['prefill_tok_s']} / {e['decode_tok_s']} tok/s; llama.cpp ...", file=sys.stderr, flush=True)
        l = bench_llamacpp_isolated(path, args.threads, args.reps)
        if l is None:
            l = {"prefill_tok_s": 0.0, "decode_tok_s": 0.0, "llamacpp_extra_bufts": None}
        print(f"[{fmt}] llama.cpp {l['prefill_tok_s']} / {l['decode_tok_s']} tok/s", file=sys.stderr, flush=True)
        rows.append({
            "format": fmt.upper(),
            "file": path,
            "engram_prefill_tok_s": e["prefill_tok_s"],
            "llamacpp_prefill_tok_s": l["prefill_tok_s"],
            "prefill_ratio": ratio(e["prefill_tok_s"], l["prefill_tok_s"]),
            "engram_decode_tok_s": e["decode_tok_s"],
            "llamacpp_decode_tok_s": l["decode_tok_s"],
            "decode_ratio": ratio(e["decode_tok_s"], l["decode_tok_s"]),
            "engram_threads": e.get("threads"),
            "llamacpp_extra_bufts": l["llamacpp_extra_bufts"],
        })

    result = {
        "machine": machine(),
        "threads": args.threads,
        "reps": args.reps,
        "prompt_tokens": N_PROMPT,
        "decode_tokens": N_GEN,
        "llama_cpp_python_version": version,
        "llama_cpp_system_info": sysinfo,
        "fixture": SHAPE,
        "rows": rows,
    }
    print(f"Machine: {result['machine']}; threads: {args.threads}; llama-cpp-python {version}; best of {args.reps}")
    if sysinfo:
        print(f"llama.cpp system info: {sysinfo}")
    print()
    print(f"| format | engram prefill pp{N_PROMPT} (tok/s) | llama.cpp prefill (tok/s) | ratio | engram decode tg{N_GEN} (tok/s) | llama.cpp decode (tok/s) | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['format']} | {r['engram_prefill_tok_s']:.1f} | {r['llamacpp_prefill_tok_s']:.1f} | {r['prefill_ratio'] or 0:.2f} "
            f"| {r['engram_decode_tok_s']:.2f} | {r['llamacpp_decode_tok_s']:.2f} | {r['decode_ratio'] or 0:.2f} |"
        )
    print("\nratio = engram / llama.cpp (above 1: engram faster)")
    for r in rows:
        if r["llamacpp_extra_bufts"] is False:
            print(f"{r['format']}: llama.cpp crashed with its repack/AMX weight buffers; measured without them (--no-repack)")
        elif r["llamacpp_extra_bufts"] is None:
            print(f"{r['format']}: llama.cpp failed; see stderr")
    if args.json_out:
        write_json_out(args.json_out, result)


if __name__ == "__main__":
    main()
