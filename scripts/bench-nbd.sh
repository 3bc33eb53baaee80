#!/usr/bin/env bash
# NBD benchmark through fio's nbd engine, everything in one run on the same
# machine and files. Prints IOPS, p50/p99 completion latency and ratios.
#   fast path (cache hits, write-back, default and --rewrite-in-place) vs nbdkit file, nbdkit --filter=cache file,
#   qemu-nbd, and nbdkit memory (the transport ceiling);
#   slow backing (nbdkit delay filter, 1 ms per write) as nvwc's upstream for
#   write-back, ordered and write-through, and under nbdkit's cache filter.
# Usage: scripts/bench-nbd.sh [RUNTIME_SECONDS=5] [REPS=3]
#   BENCH_ONLY=fast|slow runs one half (the ratios needing the other half are skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${1:-5}
REPS=${2:-3}
for t in fio nbdkit qemu-nbd python3; do command -v $t >/dev/null || { echo "missing $t (scripts/test.sh installs it)"; exit 2; }; done
cargo build --release -q -p nvwc
NVWC=$(realpath "${CARGO_TARGET_DIR:-target}/release/nvwc")
W=$(mktemp -d /tmp/nvwc-bench.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT

wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }

# fio JSON -> "iops p50_us p99_us"
# A run that cannot finish its in-flight requests within 3x its runtime + 20 s
# (a server stalled on a full cache) is cut off and reported as "0 stalled stalled".
run_fio() { # uri rw bs
  local out
  out=$(timeout -k 5 $((RUNTIME * 3 + 20)) fio --name=b --ioengine=nbd --uri="$1" --rw="$2" --bs="$3" --iodepth=16 --size=256M \
      --time_based --runtime="$RUNTIME" --output-format=json 2>/dev/null) || { echo "0 stalled stalled"; return; }
  printf '%s' "$out" |
  python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]["write"]; p=j["clat_ns"]["percentile"]; print("%.0f %.1f %.1f" % (j["iops"], p["50.000000"]/1e3, p["99.000000"]/1e3))'
}

declare -A RES
measure() { # name uri
  for wl in "randwrite 4k" "write 64k"; do
    set -- "$1" "$2" $wl
    local vals=()
    for r in $(seq "$REPS"); do vals+=("$(run_fio "$2" "$3" "$4")"); done
    # median by IOPS
    local med
    med=$(printf '%s\n' "${vals[@]}" | sort -n -k1 | sed -n "$(( (REPS + 1) / 2 ))p")
    RES["$1 $3-$4"]="$med"
    printf '%-42s %-14s iops=%-8s p50_us=%-8s p99_us=%s\n' "$1" "$3 $4" $med
  done
}

fresh() { rm -f "$W"/*.img "$W"/*.sock "$W"/*.nvwc-redo; rm -rf "$W/nvwc-data"; truncate -s 1G "$W/backing.img"; }

ONLY=${BENCH_ONLY:-all}
if [ "$ONLY" != slow ]; then
echo "== fast path (fio nbd engine, QD16, ${RUNTIME}s x ${REPS}, medians)"
fresh; nbdkit -U "$W/k.sock" -f --exit-with-parent memory 1G & PIDS+=($!); wait_sock "$W/k.sock"
measure nbdkit-memory "nbd+unix:///?socket=$W/k.sock"; stop_all
fresh; nbdkit -U "$W/k.sock" -f --exit-with-parent file "$W/backing.img" & PIDS+=($!); wait_sock "$W/k.sock"
measure nbdkit-file "nbd+unix:///?socket=$W/k.sock"; stop_all
fresh; nbdkit -U "$W/k.sock" -f --exit-with-parent --filter=cache file "$W/backing.img" & PIDS+=($!); wait_sock "$W/k.sock"
measure nbdkit-cache-filter "nbd+unix:///?socket=$W/k.sock"; stop_all
fresh; qemu-nbd -t -k "$W/q.sock" -f raw --cache=writeback "$W/backing.img" & PIDS+=($!); wait_sock "$W/q.sock"
measure qemu-nbd "nbd+unix:///?socket=$W/q.sock"; stop_all
fresh; (cd "$W" && exec "$NVWC" serve --backing backing.img --cache cache.img --cache-size 768M --listen none --unix n.sock --write-policy write-back >/dev/null 2>&1) & PIDS+=($!); wait_sock "$W/n.sock"
measure nvwc-write-back "nbd+unix:///?socket=$W/n.sock"; stop_all
# The opt-in mode that rewrites committed dirty blocks in place (no fresh slot
# per rewrite; a failed cache-device write can then damage a flushed block).
fresh; (cd "$W" && exec "$NVWC" serve --backing backing.img --cache cache.img --cache-size 768M --listen none --unix n.sock --write-policy write-back --rewrite-in-place >/dev/null 2>&1) & PIDS+=($!); wait_sock "$W/n.sock"
measure nvwc-write-back+rewrite-in-place "nbd+unix:///?socket=$W/n.sock"; stop_all
fi

if [ "$ONLY" != fast ]; then
echo "== slow backing: nbdkit delay filter, delay-write=1ms"
for pol in write-back write-back+rewrite-in-place ordered journaled write-through; do
  flags="--write-policy ${pol%%+*}"; [ "$pol" = "${pol%%+*}" ] || flags="$flags --rewrite-in-place"
  fresh; nbdkit -U "$W/d.sock" -f --exit-with-parent --filter=delay file "$W/backing.img" delay-write=1ms & PIDS+=($!); wait_sock "$W/d.sock"
  (cd "$W" && exec "$NVWC" serve --backing "nbd+unix:///?socket=$W/d.sock" --cache cache.img --cache-size 768M --listen none --unix n.sock $flags >/dev/null 2>&1) & PIDS+=($!); wait_sock "$W/n.sock"
  measure "nvwc-$pol/slow" "nbd+unix:///?socket=$W/n.sock"; stop_all
done
fresh; nbdkit -U "$W/c.sock" -f --exit-with-parent --filter=cache --filter=delay file "$W/backing.img" delay-write=1ms & PIDS+=($!); wait_sock "$W/c.sock"
measure "nbdkit-cache-filter/slow" "nbd+unix:///?socket=$W/c.sock"; stop_all
fi

echo "== ratios (IOPS)"
python3 - "$(declare -p RES)" <<'PY'
import sys, re
d = dict(re.findall(r'\["([^"]+)"\]="([^"]*)"', sys.argv[1]))
iops = {k: float(v.split()[0]) for k, v in d.items()}
for wl in ["randwrite-4k", "write-64k"]:
  for v in ["nvwc-write-back", "nvwc-write-back+rewrite-in-place"]:
    if f"{v} {wl}" in iops:
      n = iops[f"{v} {wl}"]
      best = max(iops[f"nbdkit-file {wl}"], iops[f"qemu-nbd {wl}"])
      print(f"{wl}: {v} / best(nbdkit-file, qemu-nbd) = {n/best:.2f}  (target >= 1.0)")
      print(f"{wl}: {v} / nbdkit-memory               = {n/iops[f'nbdkit-memory {wl}']:.2f}  (target >= 0.8)")
      print(f"{wl}: {v} / nbdkit-cache-filter         = {n/iops[f'nbdkit-cache-filter {wl}']:.2f}")
  if f"nvwc-write-back/slow {wl}" in iops:
    wt = iops[f"nvwc-write-through/slow {wl}"]
    for v in ["write-back", "write-back+rewrite-in-place"]:
      wb = iops[f"nvwc-{v}/slow {wl}"]
      print(f"{wl}: slow backing: {v} / write-through = {wb/wt:.1f}  (target >= 10)")
    wb = iops[f"nvwc-write-back/slow {wl}"]
    print(f"{wl}: slow backing: ordered / write-through    = {iops[f'nvwc-ordered/slow {wl}']/wt:.1f}")
    print(f"{wl}: slow backing: journaled / write-through  = {iops[f'nvwc-journaled/slow {wl}']/wt:.1f}")
    print(f"{wl}: slow backing: nvwc write-back / nbdkit cache filter = {wb/iops[f'nbdkit-cache-filter/slow {wl}']:.2f}")
PY
