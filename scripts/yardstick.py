#!/usr/bin/env python3
"""Engram against llama.cpp on the same GGUF files, alternating, best of N: the table in docs/benchmarks.md.

Files (from --fixture-dir, or each --file LABEL=PATH given, e.g. a mixture-of-experts GGUF): the llama-1b fixture as Engram writes it
(llama-1b-{q4_0,q8_0,q4_k_m,f16}.gguf) and as llama.cpp's own quantizer writes it from
the F16 file (llama-1b-{q4_0,q8_0,q4_k_m,q4_1,q5_k_m,q6_k,q3_k_m,iq4_xs,q5_0,q5_1,q2_k,iq4_nl,bf16,iq3_xxs,iq3_s,iq3_m}-lcpp.gguf;
`scripts/yardstick.sh run` makes them; all but the first three are formats Engram's fixture writer does not write;
MXFP4 is left out: llama.cpp's quantizer writes it only for mixture-of-experts tensors, so a dense file would be Q8_0).
For each file and round: `engram bench speed --json --reps 1` (prefill, decode and the
memory-bandwidth limit it measures: bandwidth / bytes one decode token reads), then
llama.cpp through llama-cpp-python in a child process (same prompt length, same token
count, same threads; one untimed warm-up prefill; decode feeds back the argmax as Engram's
bench does). Rounds alternate the two; each figure is the best of --rounds.

Run it through `scripts/yardstick.sh run VENV FIXDIR` (it builds nothing; `setup` does).
Output: a Markdown table, format x {prefill, decode} x {Engram, llama.cpp, limit}, and
--json-out. Timings are as noisy as the machine; the load average is printed beside them.
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bench_common import DEFAULT_ENGRAM, llamacpp_prefill_decode, load_llama, machine, run_json_child, write_json_out  # noqa: E402

FILES = [
    ("Q4_0", "llama-1b-q4_0.gguf", "engram"),
    ("Q4_0", "llama-1b-q4_0-lcpp.gguf", "llama.cpp"),
    ("Q8_0", "llama-1b-q8_0.gguf", "engram"),
    ("Q8_0", "llama-1b-q8_0-lcpp.gguf", "llama.cpp"),
    ("Q4_K_M", "llama-1b-q4_k_m.gguf", "engram"),
    ("Q4_K_M", "llama-1b-q4_k_m-lcpp.gguf", "llama.cpp"),
    ("F16", "llama-1b-f16.gguf", "engram"),
    ("Q4_1", "llama-1b-q4_1-lcpp.gguf", "llama.cpp"),
    ("Q5_K_M", "llama-1b-q5_k_m-lcpp.gguf", "llama.cpp"),
    ("Q6_K", "llama-1b-q6_k-lcpp.gguf", "llama.cpp"),
    ("Q3_K_M", "llama-1b-q3_k_m-lcpp.gguf", "llama.cpp"),
    ("IQ4_XS", "llama-1b-iq4_xs-lcpp.gguf", "llama.cpp"),
    ("Q5_0", "llama-1b-q5_0-lcpp.gguf", "llama.cpp"),
    ("Q5_1", "llama-1b-q5_1-lcpp.gguf", "llama.cpp"),
    ("Q2_K", "llama-1b-q2_k-lcpp.gguf", "llama.cpp"),
    ("IQ4_NL", "llama-1b-iq4_nl-lcpp.gguf", "llama.cpp"),
    ("BF16", "llama-1b-bf16-lcpp.gguf", "llama.cpp"),
    ("IQ3_XXS", "llama-1b-iq3_xxs-lcpp.gguf", "llama.cpp"),
    ("IQ3_S", "llama-1b-iq3_s-lcpp.gguf", "llama.cpp"),
    ("IQ3_M", "llama-1b-iq3_m-lcpp.gguf", "llama.cpp"),
]


def engram_round(engram, path, threads, n_prompt, n_gen):
    cmd = [engram, "bench", "speed", "--model", path, "--threads", str(threads), "--json", "--reps", "1",
           "--prompt-tokens", str(n_prompt), "--decode-tokens", str(n_gen)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-2000:]}")
    for line in reversed(out.stdout.splitlines()):
        if line.strip().startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no JSON from {' '.join(cmd)}")


def llamacpp_child(path, threads, n_prompt, n_gen):
    """One timed prefill and one timed decode (run in a child so a crash ends one round only)."""
    llm = load_llama(path, n_prompt + n_gen + 8, n_prompt, threads, True)
    n_vocab = llm.n_vocab()
    tokens = [(i * 2_654_435_761 + 12345) % n_vocab for i in range(n_prompt)]
    llm.reset()
    llm.eval(tokens)  # warm-up: pages the weights in, repacks its buffers
    pp, tg = llamacpp_prefill_decode(llm, tokens, n_gen, time.perf_counter)
    return {"prefill_tok_s": pp, "decode_tok_s": tg}


def llamacpp_round(path, threads, n_prompt, n_gen):
    args = ["--child", path, "--threads", str(threads), "--prompt-tokens", str(n_prompt), "--decode-tokens", str(n_gen)]
    out, r = run_json_child(__file__, args)
    if out.returncode != 0:
        print(f"llama.cpp failed on {path} (exit {out.returncode}):\n{out.stderr[-1500:]}", file=sys.stderr)
        return None
    return r


def load():
    return os.getloadavg()[0]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture-dir", help="the fixture folder (required, except in the --child run)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds, best kept (default: %(default)s)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--engram", default=DEFAULT_ENGRAM)
    ap.add_argument("--only", default="", help="comma-separated formats to run (default: all)")
    ap.add_argument("--file", action="append", default=[], metavar="LABEL=PATH",
                    help="run this GGUF file (both runtimes on it) instead of the fixture's files; repeatable")
    ap.add_argument("--json-out")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child:
        print(json.dumps(llamacpp_child(args.child, args.threads, args.prompt_tokens, args.decode_tokens)))
        return
    if not args.fixture_dir and not args.file:
        ap.error("--fixture-dir (or --file) is required")
    if not os.path.exists(args.engram):
        sys.exit(f"{args.engram} not found: cargo build --release -p engram-cli, or pass --engram")
    import llama_cpp

    only = {f.strip().upper() for f in args.only.split(",") if f.strip()}
    rows, loads = [], []
    files = [(label.upper(), path, "given") for label, _, path in (f.partition("=") for f in args.file)] if args.file else FILES
    for fmt, name, writer in files:
        path = os.path.join(args.fixture_dir or "", name)
        if (only and fmt not in only) or not os.path.exists(path):
            continue
        best = {"e_pp": 0.0, "e_tg": 0.0, "limit": 0.0, "l_pp": 0.0, "l_tg": 0.0}
        for k in range(args.rounds):
            loads.append(load())
            e = engram_round(args.engram, path, args.threads, args.prompt_tokens, args.decode_tokens)
            best["e_pp"] = max(best["e_pp"], e["prefill_tok_s"])
            best["e_tg"] = max(best["e_tg"], e["decode_tok_s"])
            best["limit"] = max(best["limit"], e.get("limit_tok_s") or 0.0)
            loads.append(load())
            r = llamacpp_round(path, args.threads, args.prompt_tokens, args.decode_tokens)
            if r:
                best["l_pp"] = max(best["l_pp"], r["prefill_tok_s"])
                best["l_tg"] = max(best["l_tg"], r["decode_tok_s"])
            print(f"[{fmt} {writer} round {k + 1}] engram {e['prefill_tok_s']:.1f} / {e['decode_tok_s']:.2f}, "
                  f"llama.cpp {r['prefill_tok_s'] if r else 0:.1f} / {r['decode_tok_s'] if r else 0:.2f} tok/s", file=sys.stderr, flush=True)
        rows.append({"format": fmt, "file": name, "written_by": writer, **{k: round(v, 2) for k, v in best.items()}})

    info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    result = {"machine": machine(), "threads": args.threads, "rounds": args.rounds, "prompt_tokens": args.prompt_tokens,
              "decode_tokens": args.decode_tokens, "llama_cpp_python": llama_cpp.__version__, "llama_cpp_system_info": info,
              "load_min": round(min(loads), 2) if loads else None, "load_max": round(max(loads), 2) if loads else None, "rows": rows}
    if args.json_out:
        write_json_out(args.json_out, result)
    print(f"Machine: {result['machine']}; {args.threads} threads; llama-cpp-python {llama_cpp.__version__}; "
          f"pp{args.prompt_tokens} / tg{args.decode_tokens}, alternating, best of {args.rounds}; "
          f"load average {result['load_min']}-{result['load_max']}")
    print(f"llama.cpp: {info}\n")
    print("| format (file written by) | Engram prefill / decode (tok/s) | llama.cpp | ratio | decode limit (tok/s) | Engram decode of limit | llama.cpp of limit |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        rp = r["e_pp"] / r["l_pp"] if r["l_pp"] else 0
        rt = r["e_tg"] / r["l_tg"] if r["l_tg"] else 0
        lim = r["limit"]
        print(f"| {r['format']} ({r['written_by']}) | {r['e_pp']:.1f} / {r['e_tg']:.2f} | {r['l_pp']:.1f} / {r['l_tg']:.2f} | "
              f"{rp:.2f}x / {rt:.2f}x | {lim:.1f} | {100 * r['e_tg'] / lim if lim else 0:.0f}% | {100 * r['l_tg'] / lim if lim else 0:.0f}% |")


if __name__ == "__main__":
    main()
