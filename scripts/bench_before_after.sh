#!/usr/bin/env bash
# Before/after benchmark of two engram binaries: `bench speed`,
# `bench cache` (histories 1K / 4K / 16K) and `bench serve`, the old and the
# new binary run side by side in one run.
#
# What it measures. For ROUNDS rounds (default 3), each bench case runs once
# with each binary, back to back; the order alternates every other round
# (old,new / new,old / old,new ... = ABBA), so drift of the machine between
# minutes falls on both binaries alike. Every run's `--json` output is kept
# under WORK_DIR/runs/, then scripts/bench_before_after.py prints one markdown
# table per case: per metric the old median, the new median, new/old, and each
# round's new/old (the spread of those is the noise).
#
# Cases (sizes chosen so that 3 rounds take ~15-17 min on an idle 2-core AVX2 machine):
#   speed-llama1b  `bench speed` on the llama-1b fixture of docs/benchmarks.md (Q4_0): pp128 / tg32, 1 rep
#                  (the default pp512 / tg128 x 2 reps takes ~2 min a run here: ~15 tok/s prefill)
#   speed-pycode   `bench speed` on models/pycode-long (Q8_0, 15.7M params): pp512 / tg128, 2 reps
#   speed-pycode-4k  the same with a 4096-token prompt (tg32, 1 rep): long-context prefill, where
#                  attention dominates; it stands in for bench cache's cold TTFT (skipped below)
#   cache-pycode   `bench cache` on pycode-long: histories 1024,4096,16256 (16256 + the 64-token
#                  user turn + 33 tokens of decode-at-depth fit its 16384-token context; at 16320
#                  decode_tok_s_at_depth reads 0), --skip-cold, system prompts 180,1024,
#                  2 internal rounds. Prefilling the 16K history once costs ~2 min here, which is
#                  most of this case's time; cold TTFT (another prefill of every history) would
#                  double it.
#   serve-pycode   `bench serve` on pycode-long, defaults (concurrency 1,2,4,8, 64 / 64 tokens)
#   (no `bench serve` on llama-1b: docs/benchmarks.md's setting, 8 sessions x 64 + 64 tokens, takes
#   minutes a run here, and short runs of it are not usable: with 4-16 decoded tokens the
#   random-weight fixture's sessions sent their text only at the end (aggregate decode read
#   ~1e6 tok/s at 4 sessions) and the staggered-arrival part failed with "the engine
#   stopped", in both binaries)
# llama-1b (the benchmarks' shape) cannot prefill 4K or 16K tokens here in the time
# (6-15 tok/s prefill on these 2 AVX2 cores: one 16K prefill would take 20+ min),
# so `bench cache` runs on the repository's 16K-context pycode-long model (copied
# into WORK_DIR first).
#
# How to run (on an otherwise idle machine; nothing else building):
#   scripts/bench_before_after.sh /work/bin/engram-old /work/bin/engram-new /tmp/bba
# Environment: ROUNDS (3), THREADS (2), CASES (space-separated subset of the
# cases above, default all), SMOKE=1 (tiny sizes, ~1-2 min with ROUNDS=2 once the
# fixture exists: checks the script, not the speed). The llama-1b fixture is made once
# (`engram fixture llama-1b --formats q4_0` with the new binary, ~2 min, 0.6 GB)
# and reused from WORK_DIR/fixtures on later runs.
#
# How long: ~5.5 min a round on an idle 2-core AVX2 machine (one round used 9.7
# CPU-minutes; it took 10.3 min while another job held one of the two cores), so
# ~17 min with ROUNDS=3 and ~11 min with ROUNDS=2 (+2 min the first time, for the
# fixture). About 80% of it is cache-pycode's 16K prefill, once per run.
#
# Only the table: python3 scripts/bench_before_after.py WORK_DIR
set -euo pipefail

usage() { echo "usage: $0 OLD_BINARY NEW_BINARY WORK_DIR   (env: ROUNDS=3 THREADS=2 CASES='...' SMOKE=0)" >&2; exit 2; }
[[ $# -eq 3 ]] || usage
OLD=$1 NEW=$2 WORK=$3
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
SMOKE=${SMOKE:-0}
ALL_CASES="speed-llama1b speed-pycode speed-pycode-4k cache-pycode serve-pycode"
CASES=${CASES:-$ALL_CASES}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(dirname "$HERE")

die() { echo "bench_before_after: $*" >&2; exit 1; }
for b in "$OLD" "$NEW"; do
    [[ -f $b ]] || die "binary not found: $b"
    [[ -x $b ]] || die "not executable: $b"
    "$b" --version >/dev/null 2>&1 || die "$b does not run (--version failed)"
    for sub in speed cache serve; do
        "$b" bench $sub --help >/dev/null 2>&1 || die "$b has no 'bench $sub'"
    done
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || die "ROUNDS must be a positive integer, got '$ROUNDS'"
for c in $CASES; do [[ " $ALL_CASES " == *" $c "* ]] || die "unknown case '$c' (known: $ALL_CASES)"; done
command -v python3 >/dev/null || die "python3 is needed for the table"

mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
[[ $WORK != *[[:space:]]* ]] || die "WORK_DIR must not contain spaces: '$WORK'"
OLD=$(cd "$(dirname "$OLD")" && pwd)/$(basename "$OLD")
NEW=$(cd "$(dirname "$NEW")" && pwd)/$(basename "$NEW")
RUNS=$WORK/runs
if [[ -d $RUNS ]] && compgen -G "$RUNS/*" >/dev/null; then
    # Keep an earlier run's files (named by when that run started), never mix them in.
    mv "$RUNS" "$RUNS.$(date -r "$RUNS/meta.json" +%Y%m%d-%H%M%S 2>/dev/null || date +%Y%m%d-%H%M%S)"
fi
mkdir -p "$RUNS" "$WORK/fixtures" "$WORK/models" "$WORK/data-old" "$WORK/data-new"

# Models: made or copied once, so neither binary can change them under the comparison.
LLAMA=$WORK/fixtures/llama-1b-q4_0.gguf
needs_llama=0
for c in $CASES; do [[ $c == *llama1b ]] && needs_llama=1; done
if [[ $needs_llama == 1 && ! -s $LLAMA ]]; then
    echo "== making the llama-1b Q4_0 fixture (once, ~2 min)" >&2
    "$NEW" fixture llama-1b --out "$WORK/fixtures" --formats q4_0 >"$WORK/fixtures/fixture.log" 2>&1 \
        || { tail -20 "$WORK/fixtures/fixture.log" >&2; die "engram fixture failed"; }
    rm -rf "$WORK/fixtures/llama-1b-hf"   # the 4.4 GB HF folder is not used
    [[ -s $LLAMA ]] || die "engram fixture did not write $LLAMA"
fi
PYCODE=$WORK/models/pycode-long-q8_0.gguf
if [[ ! -s $PYCODE ]]; then
    src=$REPO/models/pycode-long/pycode-long-q8_0.gguf
    [[ -s $src ]] || die "missing $src (the repository's pycode-long model)"
    cp "$src" "$PYCODE"
fi

# Each case: its bench subcommand and arguments (both binaries get the same ones).
case_args() {
    local c=$1 m
    if [[ $SMOKE == 1 ]]; then
        case $c in
        speed-llama1b) echo "speed --model $LLAMA --prompt-tokens 16 --decode-tokens 4 --reps 1" ;;
        speed-pycode) echo "speed --model $PYCODE --prompt-tokens 128 --decode-tokens 32 --reps 1" ;;
        speed-pycode-4k) echo "speed --model $PYCODE --prompt-tokens 512 --decode-tokens 8 --reps 1" ;;
        cache-pycode) echo "cache --model $PYCODE --history 256,1024,2048 --skip-cold --system 180 --repeat 1" ;;
        serve-pycode) echo "serve --model $PYCODE --concurrency 1,2 --prompt-tokens 32 --decode-tokens 16" ;;
        esac
        return
    fi
    case $c in
    speed-llama1b) echo "speed --model $LLAMA --prompt-tokens 128 --decode-tokens 32 --reps 1" ;;
    speed-pycode) echo "speed --model $PYCODE --prompt-tokens 512 --decode-tokens 128 --reps 2" ;;
    speed-pycode-4k) echo "speed --model $PYCODE --prompt-tokens 4096 --decode-tokens 32 --reps 1" ;;
    cache-pycode) echo "cache --model $PYCODE --history 1024,4096,16256 --skip-cold --system 180,1024 --repeat 2" ;;
    serve-pycode) echo "serve --model $PYCODE --concurrency 1,2,4,8 --prompt-tokens 64 --decode-tokens 64" ;;
    esac
}

run_one() { # round case which(old|new) binary
    local r=$1 c=$2 which=$3 bin=$4 args out err t0 t1
    read -r -a args <<<"$(case_args "$c")"
    out=$RUNS/r$r-$c-$which.json
    err=$RUNS/r$r-$c-$which.log
    t0=$(date +%s.%N)
    if ! "$bin" bench "${args[@]}" --threads "$THREADS" --data-dir "$WORK/data-$which" --json >"$out" 2>"$err"; then
        echo "--- stderr of the failed run ($err):" >&2
        tail -20 "$err" >&2
        die "round $r, $c, $which binary failed: $bin bench ${args[*]}"
    fi
    t1=$(date +%s.%N)
    grep -q '^{' "$out" || die "round $r, $c, $which: no JSON on stdout ($out)"
    printf '   %-14s %-3s %6.1f s   load %s\n' "$c" "$which" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$(cut -d' ' -f1-3 /proc/loadavg)" >&2
}

{
    echo "{"
    echo "  \"old\": \"$OLD\", \"old_sha256\": \"$(sha256sum "$OLD" | cut -c1-16)\","
    echo "  \"new\": \"$NEW\", \"new_sha256\": \"$(sha256sum "$NEW" | cut -c1-16)\","
    echo "  \"rounds\": $ROUNDS, \"threads\": $THREADS, \"smoke\": $SMOKE,"
    echo "  \"cases\": \"$CASES\","
    echo "  \"cpu\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//; s/"//g')\","
    echo "  \"started\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\""
    echo "}"
} >"$RUNS/meta.json"
for c in $CASES; do echo "$c: $(case_args "$c")" ; done >"$RUNS/cases.txt"

start=$(date +%s)
echo "== $ROUNDS rounds of: $CASES (old = $OLD, new = $NEW, $THREADS threads)" >&2
for ((r = 1; r <= ROUNDS; r++)); do
    if ((r % 2 == 1)); then order="old new"; else order="new old"; fi
    echo "== round $r/$ROUNDS ($order)" >&2
    for c in $CASES; do
        for which in $order; do
            if [[ $which == old ]]; then run_one "$r" "$c" old "$OLD"; else run_one "$r" "$c" new "$NEW"; fi
        done
    done
done
echo "== done in $(( $(date +%s) - start )) s; JSON in $RUNS" >&2
python3 "$HERE/bench_before_after.py" "$WORK" | tee "$WORK/table.md"
