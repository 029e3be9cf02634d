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
"""
import json, statistics, sys, time, urllib.request

mode = sys.argv[1]
base = sys.argv[2] if len(sys.argv) > 2 else "http://127.0.0.1:18091"
wait_s = float(sys.argv[3]) if len(sys.argv) > 3 else 600


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


topics = [
    ("budget", "Alice", "The budget review moved to Thursday at 3 pm in room Fjord. Bring the Q1 forecast and the hiring plan. Carol joins remotely from Oslo and will present the travel costs."),
    ("offsite", "Bob", "The team offsite is in Porto from May 4 to May 6. Flights leave Lisbon at noon. Hotel Ribeira is booked for everyone and the dinner is on the second evening."),
    ("release", "Dana", "We agreed to ship the cache tier in June. Dana owns the disk format, Eli writes the benchmark, and the next design sync is on Tuesday morning."),
    ("dentist", "Clinic", "Dentist appointment on Monday at 8 am at the Smile Clinic. Call the garage about the car before noon and pick up the parcel at the post office."),
    ("hiring", "Frank", "Frank scheduled three interviews for the backend role next Wednesday. The take-home task is due Friday and the panel is Frank, Grace and Heidi."),
    ("launch", "Grace", "The product launch webinar is on the 14th at 5 pm. Grace prepares the slides, marketing sends the invitations and support staffs the chat."),
]
docs = [{"id": f"{t}-{i}", "type": "txt", "text": f"From: {who}. Subject: {t}. {body} " * 2} for i, (t, who, body) in enumerate(topics)]
questions = ["Which room is the budget review in?", "Which hotel is booked for the offsite?", "Who writes the benchmark?",
             "What should I do before noon?", "When is the take-home task due?", "Who prepares the webinar slides?"]

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
