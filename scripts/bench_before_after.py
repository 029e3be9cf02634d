#!/usr/bin/env python3
"""Tables for scripts/bench_before_after.sh: old vs new engram binaries.

Reads WORK_DIR/runs/r<round>-<case>-<old|new>.json (the `--json` output of one
`engram bench ...` run: one JSON object per line) and prints, per case, one
markdown table: for every timing metric of every row (a history length, a
concurrency level, ...) the old binary's median over rounds, the new one's,
new/old of those medians, and each round's new/old (side by side in time, so
their spread shows the noise). `better` says which way is faster: ↓ for times
and time ratios, ↑ for rates.

Also reports what the two binaries disagree on besides timings: JSON keys only
one of them prints, and fields that should be equal (token counts, model,
formats, entry sizes) but are not.

Usage: python3 scripts/bench_before_after.py WORK_DIR   (or WORK_DIR/runs.<time>: an earlier run)
"""

import json
import re
import statistics
import sys
from collections import defaultdict
from pathlib import Path

RUN_FILE = re.compile(r"^r(\d+)-(.+)-(old|new)\.json$")
# Fields that describe a row rather than measure it (used to name the row).
ROW_KEYS = ("history_tokens", "system_prompt_tokens", "concurrency", "quality_vs_f32")


def is_metric(key):
    return key.endswith(("_ms", "_gb_s")) or "_tok_s" in key or key == "speedup" or "_vs_" in key


def better(key):
    if key.endswith("_ms") or "_vs_" in key:
        return "↓"
    return "↑"


def row_name(row):
    for k in ROW_KEYS:
        if k in row:
            label = {"history_tokens": "history", "system_prompt_tokens": "system prompt", "quality_vs_f32": "quality"}.get(k, k)
            return f"{label} {row[k]}"
    if "second_user_ttft_interleaved_ms" in row:
        return "staggered arrivals"
    if "prefill_tok_s" in row:
        return f"pp{row.get('prompt_tokens', '?')} / tg{row.get('decode_tokens', '?')}"
    return "row"


def fmt(x):
    if x is None:
        return "-"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 100:
        return f"{x:.1f}"
    if a >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def number(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def load(runs):
    """{case: {which: {round: [rows]}}}"""
    data = defaultdict(lambda: defaultdict(dict))
    for p in sorted(runs.iterdir()):
        m = RUN_FILE.match(p.name)
        if not m:
            continue
        rnd, case, which = int(m.group(1)), m.group(2), m.group(3)
        rows = []
        for i, line in enumerate(p.read_text().splitlines(), 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"{p}:{i}: not JSON ({e})")
        if not rows:
            sys.exit(f"{p}: no JSON rows (see {p.with_suffix('.log')})")
        data[case][which][rnd] = rows
    return data


def table(case, by_which, out):
    # {row name: {which: {round: row}}}, keeping the rows' first-seen order.
    rows = {}
    for which in ("old", "new"):
        for rnd, rs in sorted(by_which.get(which, {}).items()):
            for r in rs:
                rows.setdefault(row_name(r), {"old": {}, "new": {}})[which][rnd] = r
    rounds = sorted(set(by_which.get("old", {})) & set(by_which.get("new", {})))
    out.append(f"\n### {case}\n")
    if not rounds:
        out.append(f"(no round has both binaries: old rounds {sorted(by_which.get('old', {}))}, new {sorted(by_which.get('new', {}))})\n")
        return
    out.append(f"rounds {', '.join(map(str, rounds))}; new/old < 1 is faster for ↓ metrics, > 1 for ↑\n")
    out.append("| row | metric | better | old (median) | new (median) | new/old | per round new/old |")
    out.append("|---|---|:-:|---:|---:|---:|---|")
    notes = []
    keys_old, keys_new = set(), set()
    for name, w in rows.items():
        for r in w["old"].values():
            keys_old |= set(r)
        for r in w["new"].values():
            keys_new |= set(r)
        keys = []
        for r in list(w["old"].values()) + list(w["new"].values()):
            keys += [k for k in r if k not in keys]
        for k in keys:
            vals = {which: {rnd: r.get(k) for rnd, r in w[which].items()} for which in ("old", "new")}
            if is_metric(k):
                num = {which: {rnd: number(v) for rnd, v in vals[which].items() if number(v) is not None} for which in vals}
                if not num["old"] and not num["new"]:
                    continue
                med = {which: statistics.median(num[which].values()) if num[which] else None for which in num}
                if not med["old"] and not med["new"]:
                    continue  # 0 in both (e.g. a checksum that had always finished)
                ratio = med["new"] / med["old"] if med["old"] and med["new"] is not None else None
                per = [num["new"][x] / num["old"][x] for x in rounds if num["old"].get(x) and x in num["new"]]
                out.append(
                    f"| {name} | {k} | {better(k)} | {fmt(med['old'])} | {fmt(med['new'])} | "
                    f"{'-' if ratio is None else f'{ratio:.3f}'} | {' '.join(f'{p:.2f}' for p in per) or '-'} |"
                )
            elif not isinstance(vals["old"].get(rounds[0]), (list, dict)):
                # A descriptive field: both binaries should print the same value.
                seen_old = {json.dumps(v) for v in vals["old"].values()}
                seen_new = {json.dumps(v) for v in vals["new"].values()}
                if seen_old != seen_new and k not in ("resident_before_disk_run",):
                    notes.append(f"- {name}: `{k}` old {', '.join(sorted(seen_old))} / new {', '.join(sorted(seen_new))}")
    only_old, only_new = sorted(keys_old - keys_new), sorted(keys_new - keys_old)
    if only_old:
        notes.append(f"- keys only the old binary prints: {', '.join(only_old)}")
    if only_new:
        notes.append(f"- keys only the new binary prints: {', '.join(only_new)}")
    if notes:
        out.append("\nDifferences besides timings:\n")
        out.extend(notes)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    work = Path(sys.argv[1])
    # WORK_DIR, or one of its runs folders (an earlier run is kept as runs.<when it started>).
    runs = work / "runs" if (work / "runs").is_dir() else work
    if not runs.is_dir():
        sys.exit(f"{runs}: no such directory (run scripts/bench_before_after.sh first)")
    data = load(runs)
    if not data:
        sys.exit(f"{runs}: no r<round>-<case>-<old|new>.json files")
    out = []
    meta = runs / "meta.json"
    if meta.exists():
        m = json.loads(meta.read_text())
        out.append(
            f"Old: `{m.get('old')}` (sha256 {m.get('old_sha256')}), new: `{m.get('new')}` (sha256 {m.get('new_sha256')}); "
            f"{m.get('rounds')} rounds, ABBA order, {m.get('threads')} threads, {m.get('cpu')}, started {m.get('started')}"
            + (" — SMOKE sizes, not for reporting" if m.get("smoke") else "")
        )
    cases = runs / "cases.txt"
    if cases.exists():
        out.append("\n" + "\n".join(f"- {line}" for line in cases.read_text().splitlines() if line.strip()))
    order = [line.split(":")[0] for line in cases.read_text().splitlines()] if cases.exists() else []
    for case in sorted(data, key=lambda c: (order.index(c) if c in order else len(order), c)):
        table(case, data[case], out)
    print("\n".join(out))


if __name__ == "__main__":
    main()
