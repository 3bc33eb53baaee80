#!/usr/bin/env bash
# Live admission benchmark: two clients share one small nvwc cache over a slow
# backing store: nbdkit memory behind the delay filter (1 ms per write) and the
# rate filter (RATE bits/s in total, default 320M = 40 MB/s), a networked disk.
#   critical client: WAL-like, 4 KiB sequential writes, each followed by a
#     FLUSH (fio --fsync=1), queue depth 1; marked critical with `nvwc hint`;
#   background client: 256 KiB sequential writes, queue depth 8, never flushes.
# For each admission policy (all, sync, critical, critical+pi+ioi) it prints
# the critical client's write IOPS, p99/p99.9 of its writes and of its
# flushes, the background client's MB/s, and the bytes written to the cache
# device; then the ratios the admission issue asks for. Medians of REPS runs.
# Usage: scripts/bench-admission.sh [RUNTIME_SECONDS=8] [REPS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${1:-8}
REPS=${2:-3}
CACHE=${CACHE_SIZE:-64M}
RATE=${RATE:-320M}
for t in fio nbdkit python3; do command -v $t >/dev/null || { echo "missing $t (scripts/test.sh installs it)"; exit 2; }; done
cargo build --release -q -p nvwc
NVWC=$(realpath "${CARGO_TARGET_DIR:-target}/release/nvwc")
W=$(mktemp -d /tmp/nvwc-bench-adm.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT
wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }
status() { "$NVWC" status --control "$W/n.ctl"; }
conn_ids() { status | python3 -c 'import json,sys; print(" ".join(str(c["id"]) for c in json.load(sys.stdin)["connections"]))'; }
cache_bytes() { status | python3 -c 'import json,sys; print(json.load(sys.stdin)["exports"][0]["stats"]["cache_write_bytes"])'; }

one_run() { # admission -> "iops w99 w999 f99 f999 bg_mbps cache_mb reissued"
  local adm=$1
  rm -rf "$W"/*
  nbdkit -U "$W/d.sock" -f --exit-with-parent --filter=rate --filter=delay memory 4G delay-write=1ms rate="$RATE" & PIDS+=($!); wait_sock "$W/d.sock"
  (cd "$W" && exec "$NVWC" serve --backing "nbd+unix:///?socket=$W/d.sock" --cache cache.img --cache-size "$CACHE" \
     --listen none --unix n.sock --control n.ctl --write-policy write-back --admission "$adm" >serve.log 2>&1) & PIDS+=($!)
  wait_sock "$W/n.sock"; for _ in $(seq 100); do [ -S "$W/n.ctl" ] && break; sleep 0.05; done
  local uri="nbd+unix:///?socket=$W/n.sock"
  # Background stream first; it runs past the critical client's window.
  timeout -k 5 $((RUNTIME * 4 + 30)) fio --name=bg --ioengine=nbd --uri="$uri" --rw=write --bs=256k --iodepth=8 \
     --offset=2G --size=2G --time_based --runtime=$((RUNTIME + 4)) --output-format=json >"$W/bg.json" 2>/dev/null &
  local bgpid=$!
  sleep 1
  local before; before=$(conn_ids)
  local c0; c0=$(cache_bytes)
  timeout -k 5 $((RUNTIME * 4 + 30)) fio --name=crit --ioengine=nbd --uri="$uri" --rw=write --bs=4k --iodepth=1 --fsync=1 \
     --offset=0 --size=1G --time_based --ramp_time=2 --runtime="$RUNTIME" --output-format=json >"$W/crit.json" 2>/dev/null &
  local cpid=$!
  # Mark the critical client's connection (fio's ramp time covers the gap).
  local hinted=""
  for _ in $(seq 100); do
    for id in $(conn_ids); do
      case " $before " in *" $id "*) ;; *) "$NVWC" hint --control "$W/n.ctl" --connection "$id" --critical on >/dev/null && hinted=$id ;; esac
    done
    [ -n "$hinted" ] && break; sleep 0.02
  done
  [ -n "$hinted" ] || { echo "could not find the critical client's connection" >&2; exit 1; }
  wait "$cpid" || true
  local c1; c1=$(cache_bytes)
  local reissued; reissued=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["exports"][0]["stats"]["reissued_writes"])')
  wait "$bgpid" || true
  stop_all
  python3 - "$W/crit.json" "$W/bg.json" "$c0" "$c1" "$reissued" <<'EOF'
import json, sys
def load(p):
    t = open(p).read()
    return json.loads(t[t.index("{"):])["jobs"][0]
c, b = load(sys.argv[1]), load(sys.argv[2])
w, f = c["write"], c["sync"]
wp, fp = w["clat_ns"]["percentile"], f["lat_ns"]["percentile"]
mb = (int(sys.argv[4]) - int(sys.argv[3])) / 1e6
print("%.0f %.0f %.0f %.0f %.0f %.1f %.1f %s" % (w["iops"], wp["99.000000"] / 1e3, wp["99.900000"] / 1e3,
      fp["99.000000"] / 1e3, fp["99.900000"] / 1e3, b["write"]["bw_bytes"] / 1e6, mb, sys.argv[5]))
EOF
}

echo "== admission: critical WAL-like client vs a background stream, cache $CACHE, backing nbdkit memory + delay-write=1ms + rate=$RATE bit/s"
echo "   ${RUNTIME}s x ${REPS} per policy, medians (latencies in us; cache_MB = bytes written to the cache device during the critical window)"
declare -A RES
for adm in all sync critical critical+pi+ioi; do
  vals=()
  for _ in $(seq "$REPS"); do vals+=("$(one_run "$adm")"); done
  med() { printf '%s\n' "${vals[@]}" | awk -v k="$1" '{print $k}' | sort -g | sed -n "$(( (REPS + 1) / 2 ))p"; }
  line="$(med 1) $(med 2) $(med 3) $(med 4) $(med 5) $(med 6) $(med 7) $(med 8)"
  RES[$adm]=$line
  set -- $line
  printf 'admission=%-16s crit_iops=%-6s write_p99=%-7s write_p99.9=%-7s flush_p99=%-7s flush_p99.9=%-7s bg_MBps=%-6s cache_MB=%-7s reissued=%s\n' "$adm" "$@"
done

python3 - "${RES[all]}" "${RES[critical+pi+ioi]}" <<'EOF'
import sys
a = [float(x) for x in sys.argv[1].split()]
c = [float(x) for x in sys.argv[2].split()]
# The latency a WAL commit sees: its write, then its flush; take the worse
# p99.9 of the two, for each policy.
pa, pc = max(a[2], a[4]), max(c[2], c[4])
lat = pc / pa if pa else float("nan")
by = c[6] / a[6] if a[6] else float("nan")
print("critical+pi+ioi vs all: p99.9 (worse of write, flush) %.0f/%.0f us = %.3f (target <= 0.2); cache bytes %.1f/%.1f MB = %.3f (target <= 0.5); critical IOPS %.0f/%.0f = %.2fx"
      % (pc, pa, lat, c[6], a[6], by, c[0], a[0], c[0] / a[0] if a[0] else float("nan")))
EOF
