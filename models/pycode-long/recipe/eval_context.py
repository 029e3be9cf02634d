"""Does pycode-long use its context? Held-out loss by position, and with the history cut.

Loads the committed Hugging Face folder with transformers (f32 by default) and
scores held-out 16K windows: the first seq+1 tokens of held-out package documents
(prep.py's hold-out rule, so none of this text was trained on), then the next
non-overlapping ones, taken round-robin over the units, --per-unit at most each.

Prints and writes (--out, JSON):
- mean next-token loss (nats) by the target's position in the window: 0-1K, 1-4K,
  4-8K, 8-16K, and per 1K;
- the loss on each window's last 1,024 targets with the full history (15K+ tokens
  before them) and with the history truncated to the 1,024 tokens before that
  segment (a fresh 2,048-token window; each scored token then sees 1,024-2,047
  tokens), on the same tokens.

By default the held-out text is built from this machine's own Python sources
(stdlib + site-packages), e.g. on a CPU:
    python models/pycode-long/recipe/eval_context.py --model models/pycode-long --windows 4
With --data it reads prep.py's heldout.bin/heldout.json instead (the device run).
"""
import argparse, hashlib, json, os, sys, time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import prep  # noqa: E402

EDGES = [1, 1024, 4096, 8192, 16385]
NAMES = ["0-1K", "1-4K", "4-8K", "8-16K"]
TAIL = 1024


def heldout_units(data=None, roots=None, tokenizer_path=None):
    """{unit name: uint16 ids} of the held-out units."""
    if data:
        held = np.fromfile(os.path.join(data, "heldout.bin"), dtype=np.uint16)
        offs = json.load(open(os.path.join(data, "heldout.json")))
        return {n: held[s:e] for n, (s, e) in offs.items()}
    rts = [("site", r) for r in roots] if roots else prep.default_roots()
    units = prep.load_units(rts, prep.is_held_out)
    enc = prep.encode_units(prep.tokenizer(tokenizer_path), units)
    return {n: ids for n, ids, _ in enc}


def pick_windows(units, seq, n, per_unit):
    """[(unit, k, ids of window k: tokens k*(seq+1) .. (k+1)*(seq+1))], round-robin over units by name."""
    cand = {u: min(per_unit, len(ids) // (seq + 1)) for u, ids in sorted(units.items())}
    out = []
    for k in range(per_unit):
        for u, c in cand.items():
            if k < c and len(out) < n:
                out.append((u, k, units[u][k * (seq + 1):(k + 1) * (seq + 1)].astype(np.int64)))
    return out


@torch.inference_mode()
def nll(model, ids, device):
    """Per-target next-token loss for ids (1-D): len(ids)-1 values, f32 on the CPU."""
    x = torch.from_numpy(ids).to(device)[None]
    logits = model(input_ids=x[:, :-1]).logits.float()
    return torch.nn.functional.cross_entropy(logits[0], x[0, 1:], reduction="none").cpu()


def evaluate(model, windows, seq, device, deadline=None, log=print):
    sums = np.zeros(len(EDGES) - 1); counts = np.zeros(len(EDGES) - 1)
    k1 = (seq + 1023) // 1024
    per1k_s = np.zeros(k1); per1k_n = np.zeros(k1)
    full_tail, cut_tail, used = [], [], []
    for i, (u, k, ids) in enumerate(windows):
        if deadline and time.time() > deadline:
            log(f"eval: deadline, {i} windows scored"); break
        t = time.time()
        l = nll(model, ids, device).numpy().astype(np.float64)   # l[p-1] = loss of target p (p = 1..seq)
        pos = np.arange(1, seq + 1)
        for b in range(len(EDGES) - 1):
            m = (pos >= EDGES[b]) & (pos < EDGES[b + 1])
            sums[b] += l[m].sum(); counts[b] += m.sum()
        np.add.at(per1k_s, (pos - 1) // 1024, l); np.add.at(per1k_n, (pos - 1) // 1024, 1)
        # last TAIL targets (positions seq-TAIL+1 .. seq), history cut to the TAIL tokens before them
        cut = nll(model, ids[seq - 2 * TAIL + 1:], device).numpy()[TAIL - 1:]
        assert len(cut) == TAIL
        full_tail.append(float(l[-TAIL:].mean())); cut_tail.append(float(cut.mean()))
        used.append({"unit": u, "window": k, "sha256_16": hashlib.sha256(ids.tobytes()).hexdigest()[:16]})
        log(f"window {i} {u}#{k}: 0-1K {l[:1023].mean():.3f} 8-16K {l[8191:].mean():.3f}  last-1K full {full_tail[-1]:.3f} "
            f"cut {cut_tail[-1]:.3f}  ({time.time() - t:.1f}s)")
    nb = len(used)
    res = {
        "windows": nb, "seq": seq, "tokens_scored": int(counts.sum()),
        "bucket_loss": {NAMES[b]: round(sums[b] / counts[b], 4) for b in range(len(NAMES)) if counts[b]},
        "per_1k_loss": [round(s / n, 4) for s, n in zip(per1k_s, per1k_n) if n],
        "last_1k_full_history": round(float(np.mean(full_tail)), 4) if nb else None,
        "last_1k_history_cut_to_1k": round(float(np.mean(cut_tail)), 4) if nb else None,
        "last_1k_cut_worse_in_windows": int(sum(c > f for c, f in zip(cut_tail, full_tail))),
        "window_list": used,
    }
    return res


def sample(model, tok, prompt, device, n=60):
    ids = tok(prompt, return_tensors="pt").input_ids.to(device)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=n, do_sample=False)
    return tok.decode(out[0][ids.shape[1]:], skip_special_tokens=False)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.dirname(HERE))
    ap.add_argument("--data", help="prep.py output folder (heldout.bin); default: build from this machine's sources")
    ap.add_argument("--roots", nargs="*")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--per-unit", type=int, default=2)
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--time-limit", type=float, default=0)
    ap.add_argument("--sample", nargs="*", default=["def parse_args("])
    ap.add_argument("--out")
    a = ap.parse_args()
    t0 = time.time()
    if a.threads:
        torch.set_num_threads(a.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=getattr(torch, a.dtype), attn_implementation="sdpa").to(a.device).eval()
    tok = AutoTokenizer.from_pretrained(a.model)
    units = heldout_units(a.data, a.roots, os.path.join(a.model, "tokenizer.json"))
    windows = pick_windows(units, a.seq, a.windows, a.per_unit)
    print(f"held-out units: {len(units)} ({sum(len(v) for v in units.values())} tokens); "
          f"long enough: {sorted(u for u, v in units.items() if len(v) > a.seq)}; windows: {len(windows)}", flush=True)
    res = evaluate(model, windows, a.seq, a.device, deadline=t0 + a.time_limit if a.time_limit else None,
                   log=lambda s: print(s, flush=True))
    res.update({"model": os.path.abspath(a.model), "dtype": a.dtype, "device": a.device,
                "heldout_units": {u: len(v) for u, v in sorted(units.items())}})
    res["samples"] = {p: sample(model, tok, p, a.device) for p in a.sample}
    res["seconds"] = round(time.time() - t0, 1)
    print(json.dumps({k: v for k, v in res.items() if k not in ("window_list", "heldout_units")}, indent=1), flush=True)
    if a.out:
        json.dump(res, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
