#!/usr/bin/env bash
# Cross-check nvwc's LRU hit ratio against libCacheSim's LRU, and compare
# their replay speed on the same trace in the same run.
#
# Usage: scripts/crosscheck-libcachesim.sh CACHESIM [TRACE...]
#   CACHESIM: libCacheSim's `cachesim` binary (or its build directory, which
#             holds bin/cachesim). libCacheSim is not part of nvwc: fetch and
#             build it yourself, outside this repository.
#   TRACE:    traces to check (default: the vSCSI and MSR traces in ../shared/traces).
# Env: SIZES (default 4M,16M,64M,256M), REPS (speed runs per tool, default 5),
#      REPEAT (speed trace = the trace this many times in a row, default 10),
#      TOL_PP (allowed hit-ratio gap in percentage points, default 0.1).
#
# Hit ratios: each trace is converted with `nvwc trace convert --to
# oracle-general` (one record per 4 KiB block a read or write touches), and
# libCacheSim's LRU runs on that file; `nvwc sim --model hit-ratio` runs the
# engine's LRU (nvwc-replacement) on the original trace with read and write
# allocation, counting block accesses. Exit 1 if any size differs by more
# than TOL_PP.
#
# Speed: both tools replay the trace repeated REPEAT times (same footprint,
# longer run) at 64 MiB, REPS times each, alternating; the script prints the
# median wall-clock time of each whole process (trace reading included; nvwc's
# also includes its address-map scan) and block accesses per second (a
# libCacheSim request is one block access here).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n 2,25p "$0"; exit 2; }
lcs="$1"; shift
[ -d "$lcs" ] && lcs="$lcs/bin/cachesim"
[ -x "$lcs" ] || { echo "not an executable: $lcs" >&2; exit 2; }
traces=("$@")
[ ${#traces[@]} -gt 0 ] || traces=(../shared/traces/cloudPhysicsIO.vscsi ../shared/traces/msr.cut.per_10k.rw_40_60.1370.trace)
SIZES="${SIZES:-4M,16M,64M,256M}"
REPS="${REPS:-5}"
REPEAT="${REPEAT:-10}"
TOL_PP="${TOL_PP:-0.1}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
cargo build --release -q -p nvwc
nvwc="$(realpath "$CARGO_TARGET_DIR/release/nvwc")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

fail=0
for t in "${traces[@]}"; do
  name="$(basename "$t")"
  echo "== hit ratio, LRU, 4 KiB blocks: $name"
  "$nvwc" trace convert --to oracle-general "$t" "$tmp/$name.oracle" | sed 's/^/   /'
  "$nvwc" sim --model hit-ratio --trace "$t" --replacement lru --cache-size "$SIZES" \
    --threads 1 --quiet --json "$tmp/$name.json"
  (cd "$tmp" && "$lcs" "$name.oracle" oracleGeneral lru "$SIZES" --num-thread 1 -v 0 \
    >"$tmp/$name.lcs" 2>&1)
  python3 - "$tmp/$name.json" "$tmp/$name.lcs" "$TOL_PP" "$SIZES" <<'EOF' || fail=1
import json, re, sys
ours = {r["cache_size_bytes"]: r for r in json.load(open(sys.argv[1]))}
tol = float(sys.argv[3])
units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}
theirs = {}
for line in open(sys.argv[2]):
    m = re.search(r"cache size\s+(\d+)(KiB|MiB|GiB|B),\s+(\d+) req, miss ratio ([0-9.]+)", line)
    if m:
        theirs[int(m.group(1)) * units[m.group(2)]] = (int(m.group(3)), float(m.group(4)))
bad = 0
print("   %10s %14s %14s %10s %9s" % ("cache", "nvwc hit %", "libCacheSim %", "gap pp", "verdict"))
for size in sorted(ours):
    r = ours[size]
    if size not in theirs:
        print("   %10d: no libCacheSim result" % size); bad += 1; continue
    n, miss = theirs[size]
    if n != r["block_accesses"]:
        print("   %10d: libCacheSim saw %d requests, nvwc %d block accesses" % (size, n, r["block_accesses"])); bad += 1
    a = 100.0 * r["hit_ratio"]; b = 100.0 * (1.0 - miss)
    # libCacheSim prints the miss ratio to 4 decimals (0.005 pp of rounding).
    ok = abs(a - b) <= tol + 0.005
    bad += not ok
    print("   %10s %14.4f %14.2f %10.4f %9s" % ("%dM" % (size >> 20), a, b, a - b, "ok" if ok else "MISMATCH"))
sys.exit(1 if bad or len(ours) < 3 else 0)
EOF
done

t="${traces[0]}"
name="$(basename "$t")"
echo "== speed: $name x$REPEAT, LRU, 64 MiB, one thread, $REPS runs each (medians)"
"$nvwc" trace convert --repeat "$REPEAT" "$t" "$tmp/long.nvwc" | sed 's/^/   /'
"$nvwc" trace convert --repeat "$REPEAT" --to oracle-general "$t" "$tmp/long.oracle" | sed 's/^/   /'
for i in $(seq "$REPS"); do
  s=$(date +%s.%N)
  (cd "$tmp" && "$lcs" long.oracle oracleGeneral lru 64M --num-thread 1 -v 0 >"$tmp/lcs.out" 2>&1)
  e=$(date +%s.%N)
  echo "lcs $(echo "$e - $s" | bc) $(grep -o '[0-9.]* MQPS' "$tmp/lcs.out" | head -1 | cut -d' ' -f1)" >>"$tmp/times"
  s=$(date +%s.%N)
  "$nvwc" sim --model hit-ratio --trace "$tmp/long.nvwc" --replacement lru --cache-size 64M \
    --threads 1 --quiet --json "$tmp/speed.json"
  e=$(date +%s.%N)
  echo "nvwc $(echo "$e - $s" | bc) $(python3 -c "import json; print(json.load(open('$tmp/speed.json'))[0]['accesses_per_sec']/1e6)")" >>"$tmp/times"
done
python3 - "$tmp/times" "$tmp/speed.json" <<'EOF'
import json, statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
acc = json.load(open(sys.argv[2]))[0]["block_accesses"]
def med(tool, i):
    return statistics.median(float(r[i]) for r in rows if r[0] == tool and len(r) > i)
lw, nw = med("lcs", 1), med("nvwc", 1)
print("   %d block accesses per run" % acc)
print("   libCacheSim LRU: median %.3f s wall, %.2f M accesses/s end to end (its own figure: %.2f MQPS)" % (lw, acc / lw / 1e6, med("lcs", 2)))
print("   nvwc hit-ratio : median %.3f s wall, %.2f M accesses/s end to end (replay loop alone: %.2f M/s)" % (nw, acc / nw / 1e6, med("nvwc", 2)))
print("   ratio nvwc / libCacheSim (end to end): %.2fx" % (lw / nw))
EOF
exit $fail
