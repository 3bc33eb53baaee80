#!/usr/bin/env bash
# Drain benchmark: how long `nvwc flush` takes to write back dirty data over
# a networked backing store (the destage path, docs/ARCHITECTURE.md
# "Destaging"), for one nvwc binary or two in the same interleaved rounds.
#
# Setup per cell, fresh every time: an nbdkit file backing store on tmpfs
# (BENCH_DIR, default /dev/shm) behind the delay filter with DELAY (default
# 5ms) on every backing READ *and* WRITE (nbdkit 1.32's delay filter has no
# delay-flush); `nvwc serve --write-policy POLICY` over it with a CACHE
# (default 128M) cache. nbdcopy fills it (untimed), then `nvwc flush` is
# timed: every dirty block written back and the backing store flushed, the
# server still serving. Workloads:
#   seq    SIZE (default 32M) written sequentially from offset 0;
#   rand   SIZE of 4 KiB blocks at random 4 KiB offsets over 4x SIZE (fio
#          randwrite, a fixed seed, so every binary gets the same blocks).
# Reported per binary, policy and workload: the median drain seconds over
# ROUNDS, and (with two binaries) the ratio base/this (> 1: this is faster).
#
# Usage: scripts/bench-drain.sh ROUNDS [BASE_NVWC]
#   (POLICIES default "write-back ordered journaled"; WORKLOADS "seq rand")
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
BASE=${2:-}
DELAY=${DELAY:-5ms}
CACHE=${CACHE:-128M}
SIZE=${SIZE:-32M}
POLICIES=${POLICIES:-"write-back ordered journaled"}
WORKLOADS=${WORKLOADS:-"seq rand"}
BENCH_DIR=${BENCH_DIR:-/dev/shm}
for t in nbdkit nbdcopy fio; do
  command -v "$t" >/dev/null || { echo "bench-drain: $t is missing (apt-get install nbdkit libnbd-bin fio)" >&2; exit 1; }
done
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
cargo build --release -q -p nvwc
THIS="$CARGO_TARGET_DIR/release/nvwc"
BINS=("$THIS")
[ -n "$BASE" ] && BINS+=("$BASE")
TMP=$(mktemp -d "$BENCH_DIR/nvwc-drain.XXXX")
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$TMP"' EXIT

wait_sock() { for _ in $(seq 100); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "bench-drain: $2 did not start" >&2; exit 1; }

# One cell: prints the drain time in seconds.
cell() {
  local bin=$1 pol=$2 wl=$3 r="$TMP/cell"
  rm -rf "$r"; mkdir -p "$r"
  truncate -s 1G "$r/backing.img"
  nbdkit -U "$r/d.sock" -f --exit-with-parent --filter=delay file "$r/backing.img" \
    rdelay="$DELAY" wdelay="$DELAY" >"$r/up.log" 2>&1 &
  local up=$!
  wait_sock "$r/d.sock" nbdkit
  "$bin" serve --backing "nbd+unix:///?socket=$r/d.sock" --cache "$r/cache.img" --cache-size "$CACHE" \
    --write-policy "$pol" --unix "$r/n.sock" --listen none --control "$r/c.sock" >"$r/srv.log" 2>&1 &
  local srv=$!
  wait_sock "$r/n.sock" "nvwc serve"
  local uri="nbd+unix:///?socket=$r/n.sock"
  case $wl in
    seq) head -c "$SIZE" /dev/urandom >"$r/data"; nbdcopy "$r/data" "$uri" ;;
    rand) fio --name=fill --ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --size=$((4 * $(numfmt --from=iec "$SIZE"))) \
            --io_size="$SIZE" --randseed=7 --norandommap --iodepth=16 >/dev/null ;;
  esac
  local t0 t1
  t0=$(date +%s.%N)
  "$bin" flush --control "$r/c.sock" >/dev/null
  t1=$(date +%s.%N)
  kill "$srv" 2>/dev/null; wait "$srv" 2>/dev/null || true
  kill "$up" 2>/dev/null; wait "$up" 2>/dev/null || true
  echo "$t1 - $t0" | bc
}

echo "# bench-drain: nbdkit file + delay ${DELAY} (reads and writes), cache $CACHE, $SIZE dirty, $ROUNDS interleaved rounds; $(date -u +%FT%TZ); binaries: ${BINS[*]}"
declare -A T
for round in $(seq "$ROUNDS"); do
  for pol in $POLICIES; do
    for wl in $WORKLOADS; do
      for i in "${!BINS[@]}"; do
        s=$(cell "${BINS[$i]}" "$pol" "$wl")
        T[$i,$pol,$wl]+="$s "
        echo "round $round  bin $i  $pol  $wl  drain_s=$s"
      done
    done
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
echo
echo "| policy | workload | drain s (this) |$([ -n "$BASE" ] && echo " drain s (base) | base / this |")"
echo "|---|---|---:|$([ -n "$BASE" ] && echo "---:|---:|")"
for pol in $POLICIES; do
  for wl in $WORKLOADS; do
    a=$(echo "${T[0,$pol,$wl]}" | median)
    if [ -n "$BASE" ]; then
      b=$(echo "${T[1,$pol,$wl]}" | median)
      echo "| $pol | $wl | $a | $b | $(echo "scale=2; $b / $a" | bc) |"
    else
      echo "| $pol | $wl | $a |"
    fi
  done
done
