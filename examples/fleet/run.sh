#!/usr/bin/env bash
# A fleet on one machine: Redis (the shared KV tier), three `engram serve` replicas, and
# HAProxy in front of them on port $FLEET_PORT (default 8080). Ctrl-C stops everything.
#
#   examples/fleet/run.sh [--model PATH] [any other `engram serve` flags]
#
# Needs redis-server and haproxy (Debian: apt-get install redis-server haproxy) and a built
# engram (cargo build --release; or ENGRAM_BIN=...).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${ENGRAM_BIN:-$root/target/release/engram}"
work="${FLEET_DIR:-$(mktemp -d -t engram-fleet-XXXXXX)}"
export FLEET_PORT="${FLEET_PORT:-8080}" R1_PORT="${R1_PORT:-8101}" R2_PORT="${R2_PORT:-8102}" R3_PORT="${R3_PORT:-8103}"
redis_port="${REDIS_PORT:-6380}"

for cmd in redis-server haproxy "$bin"; do
  command -v "$cmd" >/dev/null || { echo "missing: $cmd" >&2; exit 1; }
done

pids=()
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop EXIT INT TERM

# The tier: bounded by Redis itself (LRU eviction past maxmemory: an evicted key is a miss).
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no \
  --maxmemory "${REDIS_MAXMEMORY:-2gb}" --maxmemory-policy allkeys-lru >"$work/redis.log" 2>&1 &
pids+=($!)

for i in 1 2 3; do
  port_var="R${i}_PORT"
  "$bin" serve --port "${!port_var}" --data-dir "$work/replica-$i" \
    --kv-remote "redis://127.0.0.1:$redis_port/" "$@" >"$work/replica-$i.log" 2>&1 &
  pids+=($!)
done
for i in 1 2 3; do
  port_var="R${i}_PORT"
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:${!port_var}/health" >/dev/null && break
    sleep 0.5
  done
done

haproxy -f "$here/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
pids+=($!)
echo "fleet up: http://127.0.0.1:$FLEET_PORT (replicas on $R1_PORT $R2_PORT $R3_PORT, Redis on $redis_port); logs in $work"
wait -n
