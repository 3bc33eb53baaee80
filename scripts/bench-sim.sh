#!/usr/bin/env bash
# Simulator benchmarks: replay requests/s of `nvwc sim` (engine + device
# models), of the engine alone (instant devices), and of `nvwc mrc --shards`.
# Usage: scripts/bench-sim.sh [--trace FILE] [--limit N] [--libcachesim PATH] [--repeat-max N]
#   --repeat-max N      longest repetition of the trace for the memory/throughput
#                       section (default 100: 11.4M requests of the default trace)
#   (traces default to $NVWC_TRACES, else ../shared/traces)
#   --libcachesim PATH  also time libCacheSim's `cachesim` binary at PATH on the
#                       same trace (LRU, 64 MiB, vscsi reader) for comparison.
set -euo pipefail
cd "$(dirname "$0")/.."
TRACE=${NVWC_TRACES:-../shared/traces}/cloudPhysicsIO.vscsi
LIMIT=""
LCS=""
REPEAT_MAX=100
while [ $# -gt 0 ]; do
  case "$1" in
    --trace) TRACE="$2"; shift 2 ;;
    --limit) LIMIT="--limit $2"; shift 2 ;;
    --libcachesim) LCS="$2"; shift 2 ;;
    --repeat-max) REPEAT_MAX="$2"; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
cargo build --release -q -p nvwc
NVWC="$CARGO_TARGET_DIR/release/nvwc"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
INSTANT='{"type":"solid-state","name":"instant","capacity_bytes":1099511627776,"parallel_units":1024,"chunk_bytes":0,"read_ns":0,"write_ns":0,"link_read_bytes_per_sec":0,"link_write_bytes_per_sec":0,"link_full_duplex":true,"flush_ns":0,"trim_ns":0}'

rate() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(' '.join('%s/%s %.0f req/s (%d requests, %.2f s)' % (r['write_policy'], r['replacement'], r['replay_rate'], r['requests'], r['wall_seconds']) for r in d))" "$1"; }

echo "== trace: $TRACE"
echo "== driver vs hit-ratio model, same run: write-back + LRU, 64 MiB, net backing, nvdram cache, one thread (median of 3; rates from CPU time, not wall, when the machine is shared)"
for m in des hit-ratio; do
  for i in 1 2 3; do
    /usr/bin/time -f "%U %S" -o "$TMP/cpu.$m.$i" "$NVWC" sim --model $m --trace "$TRACE" $LIMIT --threads 1 --quiet --write-policy wb --replacement lru --cache-size 64M --json "$TMP/$m.$i.json"
  done
done
python3 - "$TMP" <<'PY'
import json, statistics, sys
t = sys.argv[1]
def med(m):
    wall, cpu = [], []
    for i in (1, 2, 3):
        r = json.load(open(f"{t}/{m}.{i}.json"))[0]
        u, s = map(float, open(f"{t}/cpu.{m}.{i}").read().split())
        wall.append(r["replay_rate"]); cpu.append(r["requests"] / max(u + s, 1e-3))
    return r["requests"], statistics.median(wall), statistics.median(cpu)
n, dw, dc = med("des")
_, hw, hc = med("hit-ratio")
print("driver (des):      %d requests, %.0f req/s (wall, run loop), %.0f req/s (process CPU time)" % (n, dw, dc))
print("hit-ratio model:   %d requests, %.0f req/s (wall, run loop), %.0f req/s (process CPU time)" % (n, hw, hc))
print("driver / hit-ratio: %.3f (wall), %.3f (CPU)" % (dw / hw, dc / hc))
PY
echo "== nvwc sim, one run per policy, one thread (nvdram cache, net backing, 64 MiB, closed loop qd 1)"
"$NVWC" sim --trace "$TRACE" $LIMIT --threads 1 --quiet --write-policy wt,wb,ordered,journaled --replacement lru --cache-size 64M --json "$TMP/sim.json"
rate "$TMP/sim.json"
echo "== nvwc sim with stack replacement (online knee), hdd-hp97560 backing"
"$NVWC" sim --trace "$TRACE" $LIMIT --threads 1 --quiet --write-policy wb --replacement stack --cache-size 8M --backing hdd-hp97560 --json "$TMP/stack.json"
rate "$TMP/stack.json"
echo "== engine alone: instant cache and backing devices (write-back, lru, 64 MiB, qd 32)"
"$NVWC" sim --trace "$TRACE" $LIMIT --threads 1 --quiet --write-policy wb --replacement lru --cache-size 64M --qd 32 --backing "$INSTANT" --cache-device "$INSTANT" --backing-qd 1024 --json "$TMP/instant.json"
rate "$TMP/instant.json"
echo "== parallel sweep: 8 runs on $(nproc) threads"
start=$(date +%s.%N)
"$NVWC" sim --trace "$TRACE" $LIMIT --quiet --write-policy wt,wb --replacement lru,arc --cache-size 16M,256M --json "$TMP/sweep.json"
end=$(date +%s.%N)
python3 -c "import json; d=json.load(open('$TMP/sweep.json')); n=sum(r['requests'] for r in d); w=$end-$start; print('%d requests in %.2f s wall: %.0f req/s aggregate' % (n, w, n/w))"
for r in 0.01 0.1; do
  echo "== nvwc mrc --shards $r"
  "$NVWC" mrc --trace "$TRACE" $LIMIT --shards $r --rows 2 --json "$TMP/mrc.json" >/dev/null
  python3 -c "import json; d=json.load(open('$TMP/mrc.json')); print('%.0f requests/s, %.0f block accesses/s (%d requests, %.3f s)' % (d['requests_per_sec'], d['accesses_per_sec'], d['records'], d['wall_seconds']))"
done
echo "== nvwc mrc (exact)"
"$NVWC" mrc --trace "$TRACE" $LIMIT --rows 2 --json "$TMP/mrc.json" >/dev/null
python3 -c "import json; d=json.load(open('$TMP/mrc.json')); print('%.0f requests/s, %.0f block accesses/s' % (d['requests_per_sec'], d['accesses_per_sec']))"
if [ -n "$LCS" ]; then
  echo "== libCacheSim: $LCS $TRACE vscsi lru 64mb"
  start=$(date +%s.%N)
  "$LCS" "$TRACE" vscsi lru 64mb
  end=$(date +%s.%N)
  python3 -c "print('wall %.2f s' % ($end-$start))"
fi

echo "== memory and throughput as the trace grows: the trace repeated 1x, 10x, ${REPEAT_MAX}x (nvwc trace convert --repeat N, compact binary format, streamed)"
for x in $(printf "%s\n" 1 10 "$REPEAT_MAX" | sort -un); do
  "$NVWC" trace convert --repeat $x "$TRACE" "$TMP/x$x.nvwc" >/dev/null
done
for m in hit-ratio des; do
  for x in $(printf "%s\n" 1 10 "$REPEAT_MAX" | sort -un); do
    /usr/bin/time -f "%M %U %S" -o "$TMP/rss" "$NVWC" sim --model $m --trace "$TMP/x$x.nvwc" --write-policy wb --replacement lru \
      --cache-size 64M --threads 1 --quiet --json "$TMP/rss.json"
    python3 -c "import json; r=json.load(open('$TMP/rss.json'))[0]; m,u,s=open('$TMP/rss').read().split(); print('$m ${x}x: %d requests, peak RSS %s KiB, %.1f s wall, %.0f req/s (wall), %.0f req/s (CPU)' % (r['requests'], m, r['wall_seconds'], r['replay_rate'], r['requests']/max(float(u)+float(s),1e-3)))"
  done
done
