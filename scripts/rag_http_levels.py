"""Measures /v1/rag/query per cache level on a running `engram serve` (cold, chunk KV tree, QA bank)."""
import json, statistics, sys, urllib.request

from _rag_corpus import DOCS

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:18087"

def call(method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req) as r:
        return json.loads(r.read())

docs = DOCS
call("POST", "/v1/rag/documents", docs)
questions = ["When is the budget review?", "Where is the team offsite?", "Who owns the disk format?",
             "When is the dentist appointment?", "Who is on the interview panel?", "When is the launch webinar?"]
rows = {"none": [], "kv": [], "qa": []}
same = 0
for q in questions:
    cold = call("POST", "/v1/rag/query", {"query": q, "max_tokens": 32, "use_qa": False})
    warm = call("POST", "/v1/rag/query", {"query": q, "max_tokens": 32, "use_qa": False})
    fill = call("POST", "/v1/rag/query", {"query": q, "max_tokens": 32})
    hit = call("POST", "/v1/rag/query", {"query": q, "max_tokens": 32})
    print(q, [(a["cache_level"], round(a["timings"]["embed_ms"]), round(a["timings"]["retrieve_ms"]), round(a["timings"]["ttft_ms"]), round(a["timings"]["total_ms"])) for a in (cold, warm, fill, hit)])
    for a in (cold, warm, fill, hit):
        rows[a["cache_level"]].append(a)
    same += warm["answer"] == cold["answer"]
print(f"{'level':6} {'n':>3} {'mean ttft ms':>13} {'mean total ms':>14} {'prompt tok':>10} {'cached tok':>10}")
for level, v in rows.items():
    if v:
        print(f"{level:6} {len(v):3} {statistics.mean(a['timings']['ttft_ms'] for a in v):13.1f} "
              f"{statistics.mean(a['timings']['total_ms'] for a in v):14.1f} "
              f"{statistics.mean(a['usage']['prompt_tokens'] for a in v):10.0f} {statistics.mean(a['usage']['cached_tokens'] for a in v):10.0f}")
print(f"kv answers identical to the cold answers: {same}/{len(questions)}")
