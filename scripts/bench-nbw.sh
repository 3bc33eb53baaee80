#!/usr/bin/env bash
# Non-blocking writes benchmark (non-blocking-writes paper §4, §6.1;
# docs/ARCHITECTURE.md "Patches"), with the deferred work inside the timed
# window.
#
# Setup per cell, fresh every time: an nbdkit file backing store behind the
# delay filter, DELAY (default 1ms) on every backing READ *and* WRITE
# (nbdkit 1.32's delay filter has no delay-flush; the files live on tmpfs,
# BENCH_DIR default /dev/shm, so a backing FLUSH costs nothing); nvwc serve
# write-back over it with a CACHE (default 128M) cache of BLOCK (default 4k)
# blocks and PATCH_MEM (default the server's 64M) of patch memory; fio's
# nbd engine over RANGE (default 4x the cache), so most blocks are cold.
#
# Timed window: fio issues I/O for RUNTIME seconds with end_fsync=1 (a FLUSH
# after the last write); fio 3.33's job runtime runs until that FLUSH
# completes (checked: a lazy run with RUNTIME=20 reports 25.3 s). Then a
# clean stop of the server (SIGTERM: in-flight requests finish, patches are
# persisted or written back, metadata is committed) is timed too. Reported:
#   iops   = operations completed / (fio's job runtime + stop),
#   acked  = operations / RUNTIME (the rate the writer saw before the FLUSH),
#   p99    = fio's p99 completion latency of the writes (ms),
#   flush  = fio's job runtime - RUNTIME: the end FLUSH (and the last
#            requests in flight), seconds,
#   stop   = the clean stop, seconds.
# ratio = the mode's median iops / blocking's median iops in the same
# workload and queue depth.
#
# Modes: blocking (fetch-before-write, the baseline), async, async-bg, lazy,
# lazy+direct (lazy with --patch-direct: patched blocks go to the backing
# store as partial writes, no fetch).
# Workloads (WORKLOADS, the paper's Filebench personalities where a block
# device can express them), all at BS (default 2k, a partial write):
#   randwrite   random writes (random-write)
#   seqwrite    sequential writes (sequential-write; fio wraps at the range end)
#   randrw      random, half reads and half writes (random-readwrite)
#   fileserver  random, 1/3 reads, sizes 1k..64k (bssplit), a file-server-
#               like mix of partial and whole-block requests
# Rounds are interleaved (round r runs every cell once); figures are medians
# over REPS rounds. One progress line per cell on stderr.
#
# Usage: scripts/bench-nbw.sh [RUNTIME_SECONDS=6] [REPS=3]
# Env: MODES, QDS (default "1 16"), WORKLOADS (default "randwrite"), CACHE,
#      RANGE, BLOCK, BS, DELAY, PATCH_MEM, BACKING_THREADS (nbdkit --threads,
#      default 16), REPORT (default reports/bench-nbw.md; "-" for none),
#      NVWC_BIN (a built nvwc to measure instead of building this tree's),
#      BASE_BIN (another nvwc: each of BASE_MODES, default "lazy lazy+direct",
#      also runs with it as MODE@base, interleaved, for a before/after),
#      NVWC_LABEL, BASE_LABEL (what those binaries are, for the report),
#      STATS_DIR (save each cell's `nvwc status --json` after the FLUSH, its
#      fio JSON and the server's log there), LOG_LEVEL (the server's, default
#      info), BENCH_DIR.
# Default: 5 modes x 2 depths x 3 rounds of about 8 s each, about 4 minutes
# (with BASE_BIN, 6 minutes). Each workload adds as much.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${1:-6}
REPS=${2:-3}
MODES=${MODES:-blocking async async-bg lazy lazy+direct}
QDS=${QDS:-1 16}
WORKLOADS=${WORKLOADS:-randwrite}
CACHE=${CACHE:-128M}
BLOCK=${BLOCK:-4k}
BS=${BS:-2k}
DELAY=${DELAY:-1ms}
PATCH_MEM=${PATCH_MEM:-64M}
THREADS=${BACKING_THREADS:-16}
REPORT=${REPORT:-reports/bench-nbw.md}
for t in fio nbdkit python3; do command -v $t >/dev/null || { echo "missing $t (scripts/test.sh installs it)"; exit 2; }; done
bytes() { python3 -c "import sys; s=sys.argv[1].upper(); m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }
RANGE=${RANGE:-$(( 4 * $(bytes "$CACHE") ))}
RANGE_B=$(bytes "$RANGE")
if [ -n "${NVWC_BIN:-}" ]; then
  NVWC=$(realpath "$NVWC_BIN")
else
  nice cargo build --release -q -p nvwc
  NVWC=$(realpath "${CARGO_TARGET_DIR:-target}/release/nvwc")
fi
# Files on tmpfs: the delay filter is the backing store's whole cost, and
# the host's own disk (shared, and slow to fsync or delete hundreds of MB
# of scattered 2 KiB writes) plays no part.
DIR=${BENCH_DIR:-/dev/shm}
[ -d "$DIR" ] || DIR=${TMPDIR:-/tmp}
W=$(mktemp -d "$DIR/nvwc-nbw.XXXXXX")
PIDS=()
stop_all() { for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }
trap 'stop_all; rm -rf "$W"' EXIT
wait_sock() { for _ in $(seq 400); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }
now() { date +%s.%N; }

fio_args() { # workload -> fio options
  case "$1" in
    randwrite) echo "--rw=randwrite --bs=$BS" ;;
    seqwrite) echo "--rw=write --bs=$BS" ;;
    randrw) echo "--rw=randrw --rwmixread=50 --bs=$BS" ;;
    fileserver) echo "--rw=randrw --rwmixread=33 --bssplit=1k/20:2k/20:3k/10:4k/20:16k/15:64k/15" ;;
    *) echo "unknown workload $1" >&2; exit 2 ;;
  esac
}

# One cell: prints "iops acked p99_ms flush_s stop_s".
cell() { # mode qd workload
  local mode=$1 qd=$2 wl=$3 bin=$NVWC extra=()
  if [[ $mode == *@base ]]; then bin=$BASE; mode=${mode%@base}; fi
  local fetch=${mode%+direct}
  [ "$mode" = lazy+direct ] && extra=(--patch-direct)
  rm -rf "$W"/*.img "$W"/*.sock "$W"/*.ctl "$W"/*.json "$W"/nvwc-data
  truncate -s $((RANGE_B + (1 << 30))) "$W/backing.img"
  nbdkit -U "$W/d.sock" -f --exit-with-parent --threads "$THREADS" --filter=delay file "$W/backing.img" \
      delay-read="$DELAY" delay-write="$DELAY" & PIDS+=($!); wait_sock "$W/d.sock"
  (cd "$W" && exec "$bin" serve --backing "nbd+unix:///?socket=$W/d.sock" --cache cache.img --cache-size "$CACHE" \
      --block-size "$BLOCK" --write-policy write-back --fetch "$fetch" "${extra[@]}" --patch-mem "$PATCH_MEM" \
      --listen none --unix n.sock --control n.ctl --log-level "${LOG_LEVEL:-info}" >"$W/srv.log" 2>&1) & local srv=$!; PIDS+=($srv); wait_sock "$W/n.sock"
  local t0 t1 t2
  # shellcheck disable=SC2046
  t0=$(now)
  fio --name=b --ioengine=nbd --uri="nbd+unix:///?socket=$W/n.sock" $(fio_args "$wl") --iodepth="$qd" \
      --size="$RANGE_B" --randrepeat=0 --norandommap --time_based --runtime="$RUNTIME" --end_fsync=1 \
      --output-format=json --output="$W/fio.json" >/dev/null 2>&1
  t1=$(now)
  [ -n "${STATS_DIR:-}" ] && mkdir -p "$STATS_DIR" && "$NVWC" status --control "$W/n.ctl" --json > "$STATS_DIR/$wl-qd$qd-$mode.json" 2>/dev/null || true
  kill -TERM "$srv"; wait "$srv" || true
  t2=$(now)
  [ -n "${STATS_DIR:-}" ] && cp "$W/srv.log" "$STATS_DIR/$wl-qd$qd-$mode.log" && cp "$W/fio.json" "$STATS_DIR/$wl-qd$qd-$mode.fio.json"
  stop_all
  python3 - "$W/fio.json" "$t0" "$t1" "$t2" "$RUNTIME" <<'EOF'
import json, sys
t = open(sys.argv[1]).read()
j = json.loads(t[t.index("{"):])["jobs"][0]
t0, t1, t2, runtime = map(float, sys.argv[2:6])
ops = j["read"]["total_ios"] + j["write"]["total_ios"]
w = j["write"]["clat_ns"]
p99 = w.get("percentile", {}).get("99.000000", 0) / 1e6
# fio's job runtime runs from the first I/O to the end of end_fsync's FLUSH
# (fio 3.33), so it holds the FLUSH; fio's wall time adds only its start-up.
run = j["job_runtime"] / 1e3
flush = max(0.0, run - runtime)
stop = t2 - t1
print("%.0f %.0f %.2f %.2f %.2f" % (ops / (run + stop), ops / runtime, p99, flush, stop))
EOF
}


declare -A RES
CELLS=()
[ -n "${BASE_BIN:-}" ] && BASE=$(realpath "$BASE_BIN")
for wl in $WORKLOADS; do for qd in $QDS; do for mode in $MODES; do
  CELLS+=("$wl $qd $mode")
  if [ -n "${BASE_BIN:-}" ] && [[ " ${BASE_MODES:-lazy lazy+direct} " == *" $mode "* ]]; then CELLS+=("$wl $qd $mode@base"); fi
done; done; done
SIZES=""
[[ " $WORKLOADS " == *" fileserver "* ]] && SIZES=" (fileserver: 1k-64k)"
HEAD="fio ${BS}${SIZES} over $(numfmt --to=iec "$RANGE_B"), nvwc write-back, ${CACHE} cache of ${BLOCK} blocks, patch memory ${PATCH_MEM}; nbdkit file + delay filter: read ${DELAY}, write ${DELAY}, ${THREADS} threads; ${RUNTIME}s + end_fsync FLUSH + clean stop timed; ${REPS} interleaved rounds, medians"
echo "== non-blocking writes: $HEAD" >&2
START=$(now)
for r in $(seq "$REPS"); do
  for c in "${CELLS[@]}"; do
    read -r wl qd mode <<<"$c"
    c0=$(now)
    v=$(cell "$mode" "$qd" "$wl")
    RES["$c"]+="$v;"
    read -r i a p f s <<<"$v"
    printf '[%4.0fs] round %d/%d %-10s QD%-2s %-11s iops=%-7s acked=%-7s p99_ms=%-7s flush_s=%-6s stop_s=%-5s cell_s=%.0f\n' \
      "$(python3 -c "print($(now) - $START)")" "$r" "$REPS" "$wl" "$qd" "$mode" "$i" "$a" "$p" "$f" "$s" \
      "$(python3 -c "print($(now) - $c0)")" >&2
  done
done

# Medians, ratios and the table.
TABLE=$(for c in "${CELLS[@]}"; do echo "$c|${RES[$c]}"; done | python3 -c '
import sys, statistics as st
rows = [l.rstrip("\n").split("|") for l in sys.stdin if l.strip()]
med = {}
for key, vals in rows:
    runs = [list(map(float, v.split())) for v in vals.split(";") if v]
    med[key] = [st.median(col) for col in zip(*runs)]
print("| workload | QD | mode | IOPS (timed) | acked IOPS | p99 write ms | flush s | stop s | × blocking |")
print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
for key, _ in rows:
    wl, qd, mode = key.split()
    i, a, p, f, s = med[key]
    base = med.get("%s %s blocking" % (wl, qd))
    ratio = "%.2f" % (i / max(base[0], 1)) if base else "-"
    print("| %s | %s | %s | %.0f | %.0f | %.2f | %.2f | %.2f | %s |" % (wl, qd, mode, i, a, p, f, s, ratio))
')
echo "$TABLE"
if [ "$REPORT" != "-" ]; then
  {
    echo "# bench-nbw: non-blocking writes over a slow backing store, deferred work timed"
    echo
    echo "Generated by \`scripts/bench-nbw.sh $RUNTIME $REPS\` (MODES=\"$MODES\" QDS=\"$QDS\" WORKLOADS=\"$WORKLOADS\"), $(date -u +%Y-%m-%dT%H:%MZ), ${NVWC_BIN:+nvwc binary $NVWC_BIN${NVWC_LABEL:+ ($NVWC_LABEL)}, }${BASE_BIN:+MODE@base rows run $BASE_BIN${BASE_LABEL:+ ($BASE_LABEL)}, }tree at commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)'), $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end."
    echo
    echo "$HEAD."
    echo
    echo "**IOPS (timed)** = operations / (fio's job runtime, which ends when end_fsync's FLUSH completes, + the server's clean stop). **acked IOPS** = operations / the ${RUNTIME} s of issuing (before the FLUSH). **flush s** = fio's job runtime − ${RUNTIME} s: the end FLUSH. **stop s** = SIGTERM to exit. **× blocking** = timed IOPS / blocking's, same workload and queue depth. Medians over the rounds; the header of \`scripts/bench-nbw.sh\` describes the setup."
    echo
    echo "$TABLE"
  } > "$REPORT"
  echo "wrote $REPORT" >&2
fi
