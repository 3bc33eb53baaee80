#!/usr/bin/env bash
# Non-blocking writes benchmark (non-blocking-writes paper; docs/ARCHITECTURE.md "Patches").
# fio randwrite through the nbd engine at 1, 2 and 3 KiB (partial writes), and
# 4 KiB as a control, over a range much larger than the cache so most blocks are
# cold; nvwc write-back over an upstream nbdkit whose delay filter adds 1 ms to
# every READ (so a fetch-before-write costs a slow read, writes stay fast).
# Cache block sizes 4 KiB and 64 KiB; fetch modes blocking (the baseline),
# async, async-bg, lazy, and lazy with direct patch write-back (no fetch at all).
# One line per cell; ratio = the mode's IOPS / blocking's IOPS (medians of REPS).
# Usage: scripts/bench-nbw.sh [RUNTIME_SECONDS=5] [REPS=3]   (MODES="blocking lazy" to run fewer)
# Env: BACKING_THREADS (nbdkit --threads, default nbdkit's 16: the emulated
# backing store serves at most that many delayed reads at once, which bounds
# how fast lazy's background fetches can retire patches).
# Env: PATCH_MEM (nvwc --patch-mem, default the server's 64M). Lazy never
# fetches for a write: patches leave RAM as partial versions in the cache, or
# (write-back, cache short of room) as direct partial writes to the backing
# store, so a sustained run is bounded by the cache path, not by the backing
# read rate. async and async-bg fetch every patched block, as the paper's
# modes do, and are bounded by the backing read rate once patch memory fills.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${1:-5}
REPS=${2:-3}
for t in fio nbdkit python3; do command -v $t >/dev/null || { echo "missing $t (scripts/test.sh installs it)"; exit 2; }; done
cargo build --release -q -p nvwc
NVWC=$(realpath "${CARGO_TARGET_DIR:-target}/release/nvwc")
W=$(mktemp -d /tmp/nvwc-nbw.XXXXXX)
PIDS=()
# kill -9: a clean stop would first bring every patch up to date, which only
# costs time here (the measurement is over).
stop_all() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }
trap 'stop_all; rm -rf "$W"' EXIT
wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }

# fio JSON -> "iops p99_us"
run_fio() { # uri bs
  fio --name=b --ioengine=nbd --uri="$1" --rw=randwrite --bs="$2" --iodepth=16 --size=8G \
      --randrepeat=0 --time_based --runtime="$RUNTIME" --output-format=json 2>/dev/null |
  python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]["write"]; p=j["clat_ns"]["percentile"]; print("%.0f %.0f" % (j["iops"], p["99.000000"]/1e3))'
}

declare -A RES
echo "== non-blocking writes: fio randwrite QD16 over 8 GiB, nvwc write-back, 1 GiB cache, patch memory ${PATCH_MEM:-64M}, upstream nbdkit delay-read=1ms; ${RUNTIME}s x ${REPS}, medians"
for block in 4k 64k; do
  for mode in ${MODES:-blocking async async-bg lazy lazy+direct}; do
    fetch=${mode%+direct}
    extra=()
    [ "$mode" = lazy+direct ] && extra=(--patch-direct)
    for bs in 1k 2k 3k 4k; do
      vals=()
      for r in $(seq "$REPS"); do
        rm -f "$W"/*.img "$W"/*.sock; truncate -s 8G "$W/backing.img"
        nbdkit -U "$W/d.sock" -f --exit-with-parent --threads "${BACKING_THREADS:-16}" --filter=delay file "$W/backing.img" delay-read=1ms & PIDS+=($!); wait_sock "$W/d.sock"
        (cd "$W" && exec "$NVWC" serve --backing "nbd+unix:///?socket=$W/d.sock" --cache cache.img --cache-size 1G \
            --block-size "$block" --write-policy write-back --fetch "$fetch" "${extra[@]}" --patch-mem "${PATCH_MEM:-64M}" \
            --listen none --unix n.sock --control n.ctl >/dev/null 2>&1) & PIDS+=($!); wait_sock "$W/n.sock"
        vals+=("$(run_fio "nbd+unix:///?socket=$W/n.sock" "$bs")")
        stop_all
      done
      med=$(printf '%s\n' "${vals[@]}" | sort -n -k1 | sed -n "$(( (REPS + 1) / 2 ))p")
      RES["$mode $bs $block"]="$med"
      read -r iops p99 <<<"$med"
      base=${RES["blocking $bs $block"]%% *}
      ratio=$(python3 -c "print('%.2f' % ($iops / max($base, 1)))")
      printf 'mode=%-11s bs=%-3s block=%-3s iops=%-7s p99_us=%-8s ratio=%s\n' "$mode" "$bs" "$block" "$iops" "$p99" "$ratio"
    done
  done
done
echo "targets: lazy >= 5x blocking at bs=2k; the 4k control (no partial writes at block=4k) shows no loss"
