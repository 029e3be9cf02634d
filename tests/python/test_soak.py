"""Soak: many clients over several tenants against one real `engram serve`.

32 client threads over 4 tenants (API keys from a key file) run a mix for
ENGRAM_SOAK_SECONDS (20 s by default, the CI profile; a long soak is 600):
multi-turn chats that extend their own conversation, streamed chats, agent
generations, and streams the client abandons after the first chunk. Checked:

- no 5xx other than a 503 with Retry-After (documented overload), no 429 without it;
- the server's RSS never exceeds the KV budget + the model file + a stated overhead
  (OVERHEAD_MIB: the runtime, tokenizer, thread stacks and allocator slack);
- every non-streamed answer at temperature 0 equals a cold server's answer to the
  same messages (a second server, started after the soak, never saw them before);
- p50 / p99 time to first token and inter-token gap are printed.
"""

import json
import os
import random
import threading
import time

import openai
import requests

from conftest import fixture_model, spawn_server, stop_server

TENANTS = 4
CLIENTS = 32
KV_BUDGET_MIB = 48
OVERHEAD_MIB = 200
SECONDS = float(os.environ.get("ENGRAM_SOAK_SECONDS", "20"))
WORDS = ["cache", "block", "tenant", "agent", "ring", "budget", "turn", "thread", "disk", "prefix"]


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class Log:
    def __init__(self):
        self.lock = threading.Lock()
        self.statuses = []  # (status, retry_after)
        self.ttft = []
        self.gaps = []
        self.answers = []  # (tenant, messages, answer)
        self.errors = []

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                getattr(self, k).append(v)


def client_loop(i, base, key, model, stop_at, log):
    rng = random.Random(i)
    client = openai.OpenAI(base_url=base + "/v1", api_key=key, max_retries=0, timeout=120)
    auth = {"Authorization": f"Bearer {key}"}
    convo = [{"role": "system", "content": f"Client {i} speaks briefly."}]
    agent = None
    while time.time() < stop_at:
        kind = rng.choice(["chat", "chat", "stream", "agent", "cancel"])
        say = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8)))
        try:
            if kind == "chat":
                convo.append({"role": "user", "content": say})
                msgs = list(convo)
                r = client.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0)
                answer = r.choices[0].message.content
                log.add(statuses=(200, None), answers=(key, msgs, answer))
                convo.append({"role": "assistant", "content": answer})
                if len(convo) > 12:
                    convo = convo[:1]
            elif kind in ("stream", "cancel"):
                t0 = time.time()
                last = None
                stream = client.chat.completions.create(
                    model=model, messages=[{"role": "user", "content": say}], max_tokens=16,
                    temperature=0, stream=True)
                for chunk in stream:
                    now = time.time()
                    if chunk.choices and chunk.choices[0].delta.content:
                        if last is None:
                            log.add(ttft=now - t0)
                        else:
                            log.add(gaps=now - last)
                        last = now
                        if kind == "cancel":
                            break
                stream.close()
                log.add(statuses=(200, None))
            else:
                if agent is None:
                    r = requests.post(base + "/v1/agents", headers=auth, json={"system": "You are terse."}, timeout=60)
                    log.add(statuses=(r.status_code, r.headers.get("retry-after")))
                    if r.status_code == 201:
                        agent = r.json()["id"]
                    continue
                r = requests.post(base + f"/v1/agents/{agent}/generate", headers=auth,
                                  json={"prompt": say, "max_tokens": 8, "temperature": 0}, timeout=120)
                log.add(statuses=(r.status_code, r.headers.get("retry-after")))
        except openai.APIStatusError as e:
            log.add(statuses=(e.status_code, e.response.headers.get("retry-after")))
        except Exception as e:  # a dropped connection, a timeout: never expected
            log.add(errors=f"{kind}: {type(e).__name__}: {e}")


def pct(xs, p):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))]


def test_soak(tmp_path):
    model_path = fixture_model(tmp_path)
    keys = [f"key-{t}-{os.getpid()}" for t in range(TENANTS)]
    key_file = tmp_path / "keys"
    key_file.write_text("".join(f"{k}=tenant{t}\n" for t, k in enumerate(keys)))
    proc, base = spawn_server(model_path, tmp_path / "soak", "--api-key-file", str(key_file),
                              "--kv-budget-mib", str(KV_BUDGET_MIB), "--max-batch", "8")
    log = Log()
    rss = []
    try:
        stop_at = time.time() + SECONDS
        threads = [threading.Thread(target=client_loop, args=(i, base, keys[i % TENANTS], "tiny-q8_0", stop_at, log))
                   for i in range(CLIENTS)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            rss.append(rss_mib(proc.pid))
            time.sleep(0.2)
        for t in threads:
            t.join()
        assert proc.poll() is None, "the server died"
    finally:
        stop_server(proc)

    model_mib = model_path.stat().st_size / 2**20
    bound = KV_BUDGET_MIB + model_mib + OVERHEAD_MIB
    codes = {}
    for status, _ in log.statuses:
        codes[status] = codes.get(status, 0) + 1
    print(f"\nsoak {SECONDS:.0f} s, {CLIENTS} clients, {TENANTS} tenants: responses by status {codes}; "
          f"TTFT p50 {pct(log.ttft, 50) * 1e3:.1f} ms p99 {pct(log.ttft, 99) * 1e3:.1f} ms; "
          f"inter-token p50 {pct(log.gaps, 50) * 1e3:.1f} ms p99 {pct(log.gaps, 99) * 1e3:.1f} ms; "
          f"RSS max {max(rss):.0f} MiB (bound {bound:.0f} = KV {KV_BUDGET_MIB} + model {model_mib:.0f} + {OVERHEAD_MIB})")
    assert not log.errors, log.errors[:5]
    bad = [(s, ra) for s, ra in log.statuses if s >= 500 and not (s == 503 and ra)]
    assert not bad, f"5xx other than 503 with Retry-After: {bad[:5]}"
    assert all(ra for s, ra in log.statuses if s == 429), "a 429 without Retry-After"
    assert codes.get(200, 0) > CLIENTS, "the soak did too little work to mean anything"
    assert max(rss) <= bound, f"RSS {max(rss):.0f} MiB over {bound:.0f}"

    # Temperature 0: every answer equals a cold server's (fresh data dir, sessions not shared).
    cold, cold_base = spawn_server(model_path, tmp_path / "cold", "--disk-budget-mib", "0")
    try:
        client = openai.OpenAI(base_url=cold_base + "/v1", api_key="x", max_retries=0, timeout=120)
        sample = random.Random(0).sample(log.answers, min(60, len(log.answers)))
        for _, msgs, answer in sample:
            r = client.chat.completions.create(model="tiny-q8_0", messages=msgs, max_tokens=12, temperature=0)
            assert r.choices[0].message.content == answer, json.dumps(msgs)
        print(f"{len(sample)} of {len(log.answers)} temperature-0 answers replayed on a cold server: all equal")
    finally:
        stop_server(cold)
