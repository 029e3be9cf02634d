#!/usr/bin/env python3
"""llama.cpp's side of `engram bench cache`: multi-turn time to first token.

For each history length H (`--history`, default 1024,4096) a deterministic
pseudo-random history of H token ids in [1, 2047] is followed by a new
64-token user turn. With llama-cpp-python on the same GGUF (n_ctx = H + 256,
n_batch = n_ubatch = 512, n_threads = n_threads_batch = --threads) it times
the first token of the answer three ways:

  * cold: KV cleared (model loaded and warmed up, not timed), then
    eval(history + user) and the argmax of the last logits;
  * hot: the same Llama instance right after eval(history): eval(user) on top,
    then the argmax (llama.cpp keeping the slot in RAM);
  * warm: `Llama.save_state()` after the history, its raw llama.cpp state
    bytes (`llama_state_get_data`) written to a file; then in a FRESH child
    process: model load, a tiny warm-up eval and reset (not timed), then timed:
    read the file + `llama_state_set_data` (what `Llama.load_state` calls) +
    eval(user) + argmax. This is what a restarted llama.cpp server restoring
    a saved slot does. The file has just been written, so it is normally in
    the page cache ("warm ms"); the child then also evicts it
    (fsync + posix_fadvise DONTNEED) and times the same again ("warm, file
    evicted ms"), i.e. a read from disk.

llama.cpp runs in child processes (a crash does not end the run). By default
its extra weight buffer types (repack / AMX, llama-bench's --no-repack) are
OFF, because llama-cpp-python 0.3.x segfaults with them on quantized files on
some machines; `--extra-bufts` turns them on.

Prints a Markdown table (H, cold ms, hot ms, warm ms, warm/hot, state MB) and
writes JSON with `--json-out`.

Usage (from the repository root):

    pip install llama-cpp-python
    python3 scripts/bench_multiturn_llamacpp.py --model /tmp/engram-fixtures/llama-1b-q4_0.gguf \\
        --history 1024,4096 --threads 2 --json-out /tmp/multiturn-llamacpp.json
"""

import argparse
import json
import os
import sys
import tempfile
import time

from _bench_common import argmax_last, import_llama_cpp_or_exit, load_llama, machine, run_json_child, write_json_out

N_USER = 64
N_BATCH = 512
CTX_MARGIN = 256


def history_tokens(n, seed=0):
    # Deterministic pseudo-random ids in [1, 2047] (a 64-bit LCG, top bits).
    out = []
    x = 0x9E3779B97F4A7C15 ^ seed
    for _ in range(n):
        x = (x * 6364136223846793005 + 1442695040888963407) & 0xFFFFFFFFFFFFFFFF
        out.append(1 + (x >> 33) % 2047)
    return out


def user_tokens(h):
    # A different stream per history length, so the user turn is never a copy
    # of part of the history.
    return history_tokens(N_USER, seed=h + 1)


def child_main(path, h, threads, extra_bufts, state_path):
    """cold + hot, and writes the post-history state to state_path."""
    llm = load_llama(path, h + CTX_MARGIN, N_BATCH, threads, extra_bufts)
    hist, user = history_tokens(h), user_tokens(h)

    # Warm-up: pages the weights in, lets llama.cpp allocate its buffers.
    llm.reset()
    llm.eval(hist[:N_BATCH] if h >= N_BATCH else hist)

    # cold: nothing cached.
    llm.reset()
    t = time.perf_counter()
    llm.eval(hist + user)
    tok_cold = argmax_last(llm)
    cold = time.perf_counter() - t

    # hot: history evaluated (untimed), then the new turn on top.
    llm.reset()
    t = time.perf_counter()
    llm.eval(hist)
    hist_s = time.perf_counter() - t
    st = llm.save_state()
    t = time.perf_counter()
    llm.eval(user)
    tok_hot = argmax_last(llm)
    hot = time.perf_counter() - t

    # Persist the raw llama.cpp state (what llama_state_set_data takes).
    t = time.perf_counter()
    with open(state_path, "wb") as f:
        f.write(st.llama_state)
    save_s = time.perf_counter() - t
    return {
        "cold_ms": cold * 1e3,
        "hot_ms": hot * 1e3,
        "history_eval_ms": hist_s * 1e3,
        "state_write_ms": save_s * 1e3,
        "state_bytes": int(st.llama_state_size),
        "n_tokens_at_save": int(st.n_tokens),
        "tok_cold": tok_cold,
        "tok_hot": tok_hot,
    }


def evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def page_cache_fraction(path):
    """Fraction of the file's pages resident in the page cache (mincore), or None."""
    try:
        import ctypes
        import mmap

        size = os.path.getsize(path)
        if size == 0:
            return None
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            if addr in (None, ctypes.c_void_p(-1).value):
                return None
            page = mmap.PAGESIZE
            n = (size + page - 1) // page
            vec = (ctypes.c_ubyte * n)()
            rc = libc.mincore(ctypes.c_void_p(addr), size, vec)
            libc.munmap(ctypes.c_void_p(addr), size)
            if rc != 0:
                return None
            return sum(b & 1 for b in vec) / n
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001 - informational only
        return None


def child_warm(path, h, threads, extra_bufts, state_path, n_tokens):
    """A fresh process, as a restarted server: restore the saved state, then the new turn."""
    import ctypes

    import llama_cpp

    llm = load_llama(path, h + CTX_MARGIN, N_BATCH, threads, extra_bufts)
    user = user_tokens(h)
    # Warm-up (not timed): weights paged in, compute buffers allocated.
    llm.reset()
    llm.eval(user[:8])
    llm.reset()

    def restore_and_eval():
        t = time.perf_counter()
        with open(state_path, "rb") as f:
            data = f.read()
        t_read = time.perf_counter()
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        if llama_cpp.llama_state_set_data(llm._ctx.ctx, buf, len(data)) != len(data):
            raise RuntimeError("llama_state_set_data failed")
        # What Llama.load_state does besides the llama.cpp call: the token count
        # (eval() appends at n_tokens and drops KV cells past it).
        llm.n_tokens = n_tokens
        llm.input_ids[:n_tokens] = history_tokens(h)
        t_set = time.perf_counter()
        llm.eval(user)
        tok = argmax_last(llm)
        t_end = time.perf_counter()
        return {
            "ms": (t_end - t) * 1e3,
            "read_ms": (t_read - t) * 1e3,
            "set_state_ms": (t_set - t_read) * 1e3,
            "eval_user_ms": (t_end - t_set) * 1e3,
            "tok": tok,
        }

    cached_before = page_cache_fraction(state_path)
    warm = restore_and_eval()
    warm["page_cache_fraction_before"] = cached_before
    llm.reset()
    evict(state_path)
    cached_before = page_cache_fraction(state_path)
    disk = restore_and_eval()
    disk["page_cache_fraction_before"] = cached_before
    return {"warm": warm, "warm_evicted": disk}


def run_child(args_list):
    out, r = run_json_child(__file__, args_list)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(out.args)} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="/tmp/engram-fixtures/llama-1b-q4_0.gguf")
    ap.add_argument("--history", default="1024,4096", help="comma-separated history lengths (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--extra-bufts", action="store_true", help="keep llama.cpp's repack/AMX weight buffers (may segfault)")
    ap.add_argument("--state-dir", help="where the state files go (default: a temporary directory, removed afterwards)")
    ap.add_argument("--json-out", help="also write the results as JSON to this file")
    ap.add_argument("--child", choices=["main", "warm"], help=argparse.SUPPRESS)
    ap.add_argument("--h", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--state", help=argparse.SUPPRESS)
    ap.add_argument("--n-tokens", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.child == "main":
        print(json.dumps(child_main(args.model, args.h, args.threads, args.extra_bufts, args.state)))
        return
    if args.child == "warm":
        print(json.dumps(child_warm(args.model, args.h, args.threads, args.extra_bufts, args.state, args.n_tokens)))
        return

    llama_cpp = import_llama_cpp_or_exit()
    if not os.path.exists(args.model):
        sys.exit(f"{args.model} not found")

    histories = [int(x) for x in args.history.split(",") if x]
    state_dir = args.state_dir or tempfile.mkdtemp(prefix="mt-llamacpp-")
    os.makedirs(state_dir, exist_ok=True)
    common = ["--model", args.model, "--threads", str(args.threads)] + (["--extra-bufts"] if args.extra_bufts else [])
    rows = []
    for h in histories:
        state = os.path.join(state_dir, f"state-{h}.bin")
        print(f"[H={h}] cold + hot ...", file=sys.stderr, flush=True)
        m = run_child(common + ["--child", "main", "--h", str(h), "--state", state])
        print(f"[H={h}] cold {m['cold_ms']:.0f} ms, hot {m['hot_ms']:.0f} ms; warm (fresh process) ...", file=sys.stderr, flush=True)
        w = run_child(common + ["--child", "warm", "--h", str(h), "--state", state, "--n-tokens", str(m["n_tokens_at_save"])])
        print(f"[H={h}] warm {w['warm']['ms']:.0f} ms, evicted {w['warm_evicted']['ms']:.0f} ms", file=sys.stderr, flush=True)
        rows.append({
            "history": h,
            "user_tokens": N_USER,
            "n_ctx": h + CTX_MARGIN,
            "cold_ms": round(m["cold_ms"], 1),
            "hot_ms": round(m["hot_ms"], 1),
            "warm_ms": round(w["warm"]["ms"], 1),
            "warm_evicted_ms": round(w["warm_evicted"]["ms"], 1),
            "warm_over_hot": round(w["warm"]["ms"] / m["hot_ms"], 2),
            "state_bytes": m["state_bytes"],
            "state_mb": round(m["state_bytes"] / 1e6, 1),
            "history_eval_ms": round(m["history_eval_ms"], 1),
            "state_write_ms": round(m["state_write_ms"], 1),
            "warm_detail": w["warm"],
            "warm_evicted_detail": w["warm_evicted"],
            "first_token": {"cold": m["tok_cold"], "hot": m["tok_hot"], "warm": w["warm"]["tok"], "warm_evicted": w["warm_evicted"]["tok"]},
        })
        if not args.state_dir:
            os.remove(state)
    if not args.state_dir:
        os.rmdir(state_dir)

    result = {
        "machine": machine(),
        "loadavg_end": os.getloadavg(),
        "threads": args.threads,
        "model": args.model,
        "n_batch": N_BATCH,
        "llama_cpp_python_version": getattr(llama_cpp, "__version__", "?"),
        "llamacpp_extra_bufts": args.extra_bufts,
        "rows": rows,
    }
    print(f"Machine: {result['machine']}; threads {args.threads}; llama-cpp-python {result['llama_cpp_python_version']}; "
          f"extra buffer types (repack/AMX) {'on' if args.extra_bufts else 'off'}; load average at end {os.getloadavg()[0]:.2f}")
    print(f"Model: {args.model}; user turn {N_USER} tokens; n_ctx = H + {CTX_MARGIN}; one run each\n")
    print("| H | cold ms | hot ms | warm ms | warm/hot | state MB | warm, file evicted ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['history']} | {r['cold_ms']:.0f} | {r['hot_ms']:.0f} | {r['warm_ms']:.0f} | {r['warm_over_hot']:.2f} "
              f"| {r['state_mb']:.1f} | {r['warm_evicted_ms']:.0f} |")
    print()
    for r in rows:
        d = r["warm_detail"]
        pc = d["page_cache_fraction_before"]
        print(f"H={r['history']}: warm = read {d['read_ms']:.0f} + set_state {d['set_state_ms']:.0f} + eval(user) {d['eval_user_ms']:.0f} ms; "
              f"state file {'in page cache' if pc and pc > 0.99 else 'resident fraction ' + str(pc)} (just written); "
              f"first tokens {r['first_token']}")
    if args.json_out:
        write_json_out(args.json_out, result)


if __name__ == "__main__":
    main()
