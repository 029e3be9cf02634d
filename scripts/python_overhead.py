"""The Python package's overhead against the CLI on the same work: decode tok/s of
`engram generate` and of `engram.Engine.complete(stream=True)`, same model, same threads, same
prompt and token count (EOS ignored, greedy), alternating A/B for a few rounds.

    python scripts/python_overhead.py --engram target/release/engram --model M.gguf --threads 2

CLI: the `decode … tok/s` its stderr reports ((tokens - 1) / time after the first token).
Python: the same measure from the stream — (chunks with text - 1) / (last chunk - first chunk) —
through the engine thread and the scheduler, every wait with the GIL released."""

import argparse
import re
import statistics
import subprocess
import tempfile
import time

import engram

PROMPT = "def quicksort(items):"


def cli_decode(args, data):
    out = subprocess.run(
        [args.engram, "generate", "--model", args.model, "--prompt", PROMPT, "--max-tokens", str(args.tokens),
         "--threads", str(args.threads), "--ignore-eos", "--temperature", "0", "--data-dir", data],
        capture_output=True, text=True, check=True)
    return float(re.search(r"decode ([0-9.]+) tok/s", out.stderr).group(1))


def python_decode(engine, args):
    times = []
    for c in engine.complete(PROMPT, max_tokens=args.tokens, ignore_eos=True, temperature=0, stream=True):
        if c["choices"][0]["text"]:
            times.append(time.perf_counter())
    return (len(times) - 1) / (times[-1] - times[0])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engram", default="target/release/engram")
    p.add_argument("--model", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        engine = engram.Engine(model=args.model, data_dir=d2, threads=args.threads)
        python_decode(engine, args)  # warm-up: page the weights in
        cli, py = [], []
        for r in range(args.rounds):
            cli.append(cli_decode(args, d1))
            py.append(python_decode(engine, args))
            print(f"round {r + 1}: cli {cli[-1]:.1f} tok/s, python {py[-1]:.1f} tok/s")
        engine.close()
    c, q = statistics.median(cli), statistics.median(py)
    print(f"median: cli {c:.1f} tok/s, python {q:.1f} tok/s, python/cli {q / c:.3f}")


if __name__ == "__main__":
    main()
