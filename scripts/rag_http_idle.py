"""Idle-time population (PerCache) in `engram serve`: what a request pays when it arrives while
idle units run, and what the units leave behind.

Run against two servers started the same way except for `--rag-idle` (one at a time, so they do
not compete for the cores):

    engram serve --data-dir D1 --port 18091 --threads 2 --rag-idle off &   python3 scripts/rag_http_idle.py off http://127.0.0.1:18091
    engram serve --data-dir D2 --port 18092 --threads 2 --rag-idle on  &   python3 scripts/rag_http_idle.py on  http://127.0.0.1:18092

Each run ingests the same six documents, then at once asks the same questions (QA off, so every
one is generated) and prints each answer's latency, whether idle units ran during it, and at the
end the idle counters (`/metrics`: units, longest unit, compute). With `on` it then waits for the
idle work to end (at most --wait seconds) and asks the predicted questions whose answers are in
the QA bank, checking each against the generated answer (QA off) to the same question.
Answers are written to `<mode>.answers.json` so the two runs can be compared token for token.

Side by side in one run (the script starts and stops both servers itself, one after the other,
on fresh data dirs; same documents, same questions, same pauses):

    python3 scripts/rag_http_idle.py both [ENGRAM_BINARY] [ROUNDS]

asks the six questions ROUNDS times (default 3) with seeded pauses of 0.1–0.6 s between them, so
requests land while idle units run, and prints per request the latency with idle off and on,
the added latency (on − off: mean and p95, over all requests and over those that stopped a
unit), the units interrupted (`engram_rag_idle_interrupted_total`), the longest stretch a
unit ran between two interrupt checks (`engram_rag_idle_longest_step_ms`), and the time from a
request's arrival to the interrupted unit letting go (`engram_rag_idle_yield_ms_total` /
interrupted, `engram_rag_idle_longest_yield_ms`).
"""
import json, os, random, statistics, subprocess, sys, tempfile, time, urllib.request

from _rag_corpus import DOCS

mode = sys.argv[1]
base = sys.argv[2] if len(sys.argv) > 2 and mode != "both" else "http://127.0.0.1:18091"
wait_s = float(sys.argv[3]) if len(sys.argv) > 3 and mode != "both" else 600


def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        raw = r.read()
        return raw.decode() if path == "/metrics" else json.loads(raw)


def metrics():
    out = {}
    for line in call("GET", "/metrics").splitlines():
        if line.startswith("engram_rag_idle_"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def units(m):
    return sum(v for k, v in m.items() if k.startswith("engram_rag_idle_units_total"))


docs = DOCS
questions = ["Which room is the budget review in?", "Which hotel is booked for the offsite?", "Who writes the benchmark?",
             "What should I do before noon?", "When is the take-home task due?", "Who prepares the webinar slides?"]



def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))] if xs else float("nan")


def measure(mode, rounds):
    """Ingests, then asks the questions `rounds` times with seeded pauses: one row per request."""
    call("POST", "/v1/rag/documents", docs)
    rng, rows = random.Random(17), []
    for r in range(rounds):
        for q in questions:
            time.sleep(rng.uniform(0.1, 0.6))
            before = metrics()
            a = call("POST", "/v1/rag/query", {"query": q, "max_tokens": 32, "use_qa": False})
            after = metrics()
            stopped = after.get("engram_rag_idle_interrupted_total", 0) - before.get("engram_rag_idle_interrupted_total", 0)
            rows.append({"round": r, "query": q, "total_ms": a["timings"]["total_ms"], "ttft_ms": a["timings"]["ttft_ms"],
                         "cached": a["usage"]["cached_tokens"], "answer": a["answer"], "stopped_units": stopped})
    return rows, metrics()


if mode == "both":
    binary = sys.argv[2] if len(sys.argv) > 2 else "target/release/engram"
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    results = {}
    for i, m in enumerate(["off", "on"]):
        port = 18191 + i
        base = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryDirectory() as d:
            srv = subprocess.Popen([binary, "serve", "--data-dir", d, "--port", str(port), "--threads", "2", "--rag-idle", m],
                                   stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "serve.log"), "w"))
            try:
                for _ in range(600):
                    try:
                        urllib.request.urlopen(base + "/health").read()
                        break
                    except Exception:
                        time.sleep(0.1)
                results[m] = measure(m, rounds)
            finally:
                srv.terminate()
                srv.wait()
    off, on = results["off"][0], results["on"][0]
    print(f"{'question':42} {'round':>5} {'off ms':>8} {'on ms':>8} {'added':>8} {'stopped':>7} {'cached on':>9}")
    for a, b in zip(off, on):
        print(f"{a['query']:42} {a['round']:5} {a['total_ms']:8.1f} {b['total_ms']:8.1f} {b['total_ms'] - a['total_ms']:8.1f} "
              f"{b['stopped_units']:7.0f} {b['cached']:9}")
    added = [b["total_ms"] - a["total_ms"] for a, b in zip(off, on)]
    added_stop = [b["total_ms"] - a["total_ms"] for a, b in zip(off, on) if b["stopped_units"] > 0]
    m = results["on"][1]
    summary = {
        "requests": len(off),
        "mean_total_ms_off": statistics.mean(r["total_ms"] for r in off),
        "mean_total_ms_on": statistics.mean(r["total_ms"] for r in on),
        "mean_added_ms": statistics.mean(added), "p95_added_ms": p95(added),
        # After the first round both servers' trees hold the prompts: what sharing the device
        # with idle work costs, without idle work's own benefit.
        "mean_added_ms_rounds_after_first": statistics.mean(b["total_ms"] - a["total_ms"] for a, b in zip(off, on) if a["round"] > 0)
        if rounds > 1 else None,
        "requests_that_stopped_a_unit": len(added_stop),
        "mean_added_ms_stopping": statistics.mean(added_stop) if added_stop else None,
        "p95_added_ms_stopping": p95(added_stop) if added_stop else None,
        "units_interrupted": m.get("engram_rag_idle_interrupted_total", 0),
        "longest_step_ms": m.get("engram_rag_idle_longest_step_ms", 0),
        "mean_yield_ms": m.get("engram_rag_idle_yield_ms_total", 0) / max(1, m.get("engram_rag_idle_interrupted_total", 0)),
        "longest_yield_ms": m.get("engram_rag_idle_longest_yield_ms", 0),
        "longest_unit_ms": m.get("engram_rag_idle_longest_unit_ms", 0),
        "units_finished": units(m),
        "same_answers": sum(a["answer"] == b["answer"] for a, b in zip(off, on)),
    }
    print(json.dumps(summary, indent=1))
    sys.exit(0)

call("POST", "/v1/rag/documents", docs)
rows = []
for q in questions:
    before = metrics()
    t = time.time()
    a = call("POST", "/v1/rag/query", {"query": q, "max_tokens": 32, "use_qa": False})
    wall = (time.time() - t) * 1e3
    during = units(metrics()) - units(before) if mode == "on" else 0
    rows.append((q, a, wall, during))
    print(f"{q:45} total {a['timings']['total_ms']:8.1f} ms  ttft {a['timings']['ttft_ms']:8.1f} ms  "
          f"cached {a['usage']['cached_tokens']:4}/{a['usage']['prompt_tokens']:4}  idle units finished meanwhile {during:.0f}")
print(f"mode {mode}: mean total {statistics.mean(r[1]['timings']['total_ms'] for r in rows):.1f} ms, "
      f"mean ttft {statistics.mean(r[1]['timings']['ttft_ms'] for r in rows):.1f} ms")
json.dump({q: a["answer"] for q, a, _, _ in rows}, open(f"{mode}.answers.json", "w"), indent=1)
if mode != "on":
    sys.exit(0)

m = metrics()
print("idle so far:", {k.replace("engram_rag_idle_", ""): v for k, v in m.items()})
t0, last, still = time.time(), units(m), 0
while time.time() - t0 < wait_s and still < 3:
    time.sleep(1)
    n = units(metrics())
    still = still + 1 if n == last else 0
    last = n
m = metrics()
print(f"idle after {time.time() - t0:.0f} s more:", {k.replace("engram_rag_idle_", ""): v for k, v in m.items()})
preds = [p for p in call("GET", "/v1/rag/predictions")["data"] if p["answered"]]
same = 0
for p in preds[:6]:
    hit = call("POST", "/v1/rag/query", {"query": p["query"], "max_tokens": 32})
    gen = call("POST", "/v1/rag/query", {"query": p["query"], "max_tokens": 32, "use_qa": False})
    same += hit["answer"] == gen["answer"]
    print(f"predicted {p['query']!r}: {hit['cache_level']} in {hit['timings']['total_ms']:.1f} ms "
          f"(generated {gen['timings']['total_ms']:.1f} ms), same answer: {hit['answer'] == gen['answer']}")
print(f"predicted answers equal to the generated ones: {same}/{min(len(preds), 6)} "
      f"({len(preds)} predicted questions answered in idle time)")
