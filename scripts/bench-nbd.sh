#!/usr/bin/env bash
# NBD benchmark through fio's nbd engine, everything in one run on the same
# machine and files. Prints IOPS, p50/p99 completion latency, the server's
# CPU time per request, and ratios.
#   fast path (cache hits, write-back: default, and --rewrite-in-place=false)
#   vs nbdkit file, nbdkit --filter=cache file, qemu-nbd, and nbdkit memory
#   (the transport ceiling);
#   slow backing (nbdkit delay filter, 1 ms per write) as nvwc's upstream for
#   write-back, ordered, journaled and write-through, and under nbdkit's cache
#   filter.
#   fsync-bound (issue 17): fio 4 KiB randwrite QD1 --fsync=1 (a FLUSH after
#   every write) against nvwc write-back, journaled, ordered and write-through
#   on a fast local backing file vs nbdkit file on the same file; and 8 jobs x
#   QD1 --fsync=1 (8 connections) with nvwc write-back, journaled and
#   write-through over a delayed backing (nbdkit delay filter,
#   rdelay=wdelay=DELAY_MS, default 5 ms) vs that delayed backing uncached;
#   first touch / full cache: 4 KiB randwrite QD16 over a range 4x the cache
#   (nvwc --cache-size FULL_CACHE_MB, default 64 MiB, so 256 MiB), fast local
#   backing, nvwc write-back vs nbdkit file; fio's end_fsync=1 ends every run
#   with a FLUSH inside the timed window (fio counts it in its runtime, so the
#   IOPS pay for it). Also with Zipf-distributed offsets (zipf:1.1), with
#   nvwc's cleaner at full speed (--full-clean-secs 0) beside the default
#   pacing, and both over a 1 ms backing (nbdkit delay filter, rdelay=wdelay).
# The machine is noisy (its speed drifts by tens of percent over minutes), so
# the repetitions are interleaved: round r runs every server once, and each
# figure is the median over the rounds. Every server starts fresh in every
# round. The fast-path and 1 ms rows get the same 2 s warm-up (64 KiB writes
# over the range) first; the fsync and full-cache rows get none (a fresh,
# empty cache: the full-cache row is first touch by design, and the fsync
# rows measure the durable-write path with no destage competing), and their
# backing file's first 256 MiB (FULL: 4x the cache) are written with zeros
# first, so that nbdkit file, like nvwc's destage, overwrites allocated
# blocks instead of filling holes.
# Usage: scripts/bench-nbd.sh [RUNTIME_SECONDS=5] [REPS=3]
#   BENCH_ONLY selects groups (space, comma or | separated): fast, slow,
#   fsync (both fsync-bound rows), fsync1 (QD1 only), fsync8 (8 jobs only),
#   full. Default: all. Ratios needing a group that did not run are skipped.
#   DELAY_MS=5 (fsync8 rows), FULL_CACHE_MB=64 (full-cache row),
#   BACKING_PAGES=cold (default: the backing file's pages are dropped after
#   preallocation, see `prealloc`) or kept.
#   NVWC_BASE=PATH also runs the default nvwc server of each selected group
#   (fast, fsync1, fsync8, full; slow: ordered and journaled) with the nvwc binary at PATH, named NAME@base, in
#   the same interleaved rounds, and prints each NAME / NAME@base ratio: an
#   A/B of two builds (before and after a change) under the same conditions,
#   with a 90 % bootstrap band of each ratio and the median of the same-round
#   ratios: on a shared machine single rounds swing by 15 % or more, so a
#   ratio means a regression only when its band lies below 1.
# Even rounds run the servers in reverse order (no server always first).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${1:-5}
REPS=${2:-3}
DELAY_MS=${DELAY_MS:-5}
FULL_CACHE_MB=${FULL_CACHE_MB:-64}
ONLY=${BENCH_ONLY:-all}
ONLY=" ${ONLY//[,|]/ } "
sel() { [ "$ONLY" = " all " ] || [[ $ONLY == *" $1 "* ]] || { [[ $1 == fsync? ]] && [[ $ONLY == *" fsync "* ]]; }; }
for t in fio nbdkit qemu-nbd python3; do command -v $t >/dev/null || { echo "missing $t (scripts/test.sh installs it)"; exit 2; }; done
cargo build --release -q -p nvwc
NVWC=$(realpath "${CARGO_TARGET_DIR:-target}/release/nvwc")
BASE=${NVWC_BASE:+$(realpath "$NVWC_BASE")}
W=$(mktemp -d /tmp/nvwc-bench.XXXXXX)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT

wait_sock() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.05; done; echo "no socket $1" >&2; exit 1; }
stop_all() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; PIDS=(); }
fresh() { rm -f "$W"/*.img "$W"/*.sock "$W"/*.nvwc-redo; rm -rf "$W/nvwc-data"; truncate -s 1G "$W/backing.img"; }
# Preallocate, then drop the file's pages: written in 1 MiB chunks they sit in
# the page cache as large folios, which on this kernel (6.18, ext4) make each
# later 4 KiB write into them cost ~25 us more; every server starts from a
# cold page cache instead (nvwc does the same to its cache file, `small_pages`).
# BACKING_PAGES=kept skips the drop (the page cache as the preallocation left it).
prealloc() { dd if=/dev/zero of="$W/backing.img" bs=1M count="$1" conv=notrunc,fsync status=none
  [ "${BACKING_PAGES:-cold}" = kept ] || python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$W/backing.img"; } # MiB
# utime + stime of a process and all its threads, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
TICK_US=$((1000000 / $(getconf CLK_TCK)))

# fio JSON -> "iops p50_us p99_us cpu_us_per_request flush_p99_us" (CPU of
# process $2; p50/p99: write completion latency; flush_p99: fio's fsync
# latency, "-" when the workload sends none). Several jobs are reported as one
# group. A run that cannot finish its in-flight requests within 3x its
# runtime + 20 s (a server stalled on a full cache) is cut off and reported as
# "0 stalled stalled stalled stalled".
run_fio() { # uri pid runtime fio-args...
  local out c0 c1 uri=$1 pid=$2 rt=$3; shift 3
  c0=$(cpu_ticks "$pid")
  out=$(timeout -k 5 $((RUNTIME * 3 + 20)) fio --name=b --ioengine=nbd --uri="$uri" --size=256M "$@" --group_reporting \
      --time_based --runtime="$rt" --output-format=json 2>/dev/null) || { echo "0 stalled stalled stalled stalled"; return; }
  c1=$(cpu_ticks "$pid")
  printf '%s' "$out" |
  python3 -c 'import json,sys; t=sys.stdin.read(); J=json.loads(t[t.index("{"):])["jobs"][0]; j=J["write"]; p=j["clat_ns"]["percentile"]; n=max(j["total_ios"],1); s=J.get("sync",{}); sp=(s.get("lat_ns") or {}).get("percentile") if s.get("total_ios") else None
print("%.0f %.1f %.1f %.2f %s" % (j["iops"], p["50.000000"]/1e3, p["99.000000"]/1e3, (int(sys.argv[1])*int(sys.argv[2]))/n, "%.1f" % (sp["99.000000"]/1e3) if sp else "-"))' "$((c1 - c0))" "$TICK_US"
}
# Workloads: key -> fio arguments.
declare -A FIO=(
  [randwrite-4k]="--rw=randwrite --bs=4k --iodepth=16"
  [write-64k]="--rw=write --bs=64k --iodepth=16"
  [fsync-qd1]="--rw=randwrite --bs=4k --iodepth=1 --fsync=1"
  [fsync-8jobs]="--rw=randwrite --bs=4k --iodepth=1 --fsync=1 --numjobs=8"
  [full-qd16]="--rw=randwrite --bs=4k --iodepth=16 --size=$((FULL_CACHE_MB * 4))M --end_fsync=1"
  [full-zipf]="--rw=randwrite --bs=4k --iodepth=16 --size=$((FULL_CACHE_MB * 4))M --random_distribution=zipf:1.1 --end_fsync=1"
)

# Servers: name -> start command (run in $W, must exec the server so that $!
# is its PID), socket, workloads, upstream (an nbdkit to start first on
# d.sock, or empty), warm-up (1/0) and MiB of the backing file to write first.
NAMES=()
declare -A START SOCK WLS UP WARM PRE
add() { NAMES+=("$1"); START["$1"]="$2"; SOCK["$1"]="$3"; WLS["$1"]=${4:-"randwrite-4k write-64k"}; UP["$1"]=${5:-}; WARM["$1"]=${6:-1}; PRE["$1"]=${7:-0}; }
NV="exec $NVWC serve --cache cache.img --cache-size 768M --listen none --unix n.sock"
SLOWUP="exec nbdkit -U d.sock -f --exit-with-parent --filter=delay file backing.img delay-write=1ms"
DELAYUP="exec nbdkit -U d.sock -f --exit-with-parent --filter=delay file backing.img rdelay=${DELAY_MS}ms wdelay=${DELAY_MS}ms"
if sel fast; then
  add nbdkit-memory "exec nbdkit -U k.sock -f --exit-with-parent memory 1G" k.sock
  add nbdkit-file "exec nbdkit -U k.sock -f --exit-with-parent file backing.img" k.sock
  add nbdkit-cache-filter "exec nbdkit -U k.sock -f --exit-with-parent --filter=cache file backing.img" k.sock
  add qemu-nbd "exec qemu-nbd -t -k $W/q.sock -f raw --cache=writeback backing.img" q.sock
  add nvwc-write-back "$NV --backing backing.img --write-policy write-back" n.sock
  # The opt-out: every rewrite to a fresh slot (a cache-device write that
  # fails part-way cannot damage a flushed block; costs slot churn and commits).
  add nvwc-write-back+fresh-slots "$NV --backing backing.img --write-policy write-back --rewrite-in-place=false" n.sock
  [ -z "$BASE" ] || add nvwc-write-back@base "${NV/$NVWC/$BASE} --backing backing.img --write-policy write-back" n.sock
fi
if sel slow; then
  for pol in write-back write-back+fresh-slots ordered journaled write-through; do
    flags="--write-policy ${pol%%+*}"; [ "$pol" = "${pol%%+*}" ] || flags="$flags --rewrite-in-place=false"
    add "nvwc-$pol/slow" "$NV --backing 'nbd+unix:///?socket=$W/d.sock' $flags" n.sock "" "$SLOWUP"
  done
  # The policies that destage while the client writes (ordered's waves,
  # journaled's checkpoints), with the NVWC_BASE build.
  if [ -n "$BASE" ]; then
    for pol in ordered journaled; do
      add "nvwc-$pol/slow@base" "${NV/$NVWC/$BASE} --backing 'nbd+unix:///?socket=$W/d.sock' --write-policy $pol" n.sock "" "$SLOWUP"
    done
  fi
  add nbdkit-cache-filter/slow "exec nbdkit -U c.sock -f --exit-with-parent --filter=cache --filter=delay file backing.img delay-write=1ms" c.sock
fi
if sel fsync1; then  # QD1 --fsync=1, fast local backing file
  add nbdkit-file/fsync "exec nbdkit -U k.sock -f --exit-with-parent file backing.img" k.sock fsync-qd1 "" 0 256
  for pol in write-back journaled ordered write-through; do
    add "nvwc-$pol/fsync" "$NV --backing backing.img --write-policy $pol" n.sock fsync-qd1 "" 0 256
  done
  [ -z "$BASE" ] || add "nvwc-write-back/fsync@base" "${NV/$NVWC/$BASE} --backing backing.img --write-policy write-back" n.sock fsync-qd1 "" 0 256
fi
if sel fsync8; then  # 8 jobs x QD1 --fsync=1 over the delayed backing
  add "uncached/${DELAY_MS}ms" "exec nbdkit -U k.sock -f --exit-with-parent --filter=delay file backing.img rdelay=${DELAY_MS}ms wdelay=${DELAY_MS}ms" k.sock fsync-8jobs "" 0 256
  for pol in write-back journaled write-through; do
    add "nvwc-$pol/${DELAY_MS}ms" "$NV --backing 'nbd+unix:///?socket=$W/d.sock' --write-policy $pol" n.sock fsync-8jobs "$DELAYUP" 0 256
  done
  [ -z "$BASE" ] || add "nvwc-write-back/${DELAY_MS}ms@base" "${NV/$NVWC/$BASE} --backing 'nbd+unix:///?socket=$W/d.sock' --write-policy write-back" n.sock fsync-8jobs "$DELAYUP" 0 256
fi
if sel full; then  # first touch over 4x the cache, fast local backing, no warm-up
  # Paced cleaning while writes go around the full cache (the default,
  # --full-clean-secs 40) and at full speed (0); a skewed workload (Zipf)
  # beside the uniform one the pacing was measured on; and the same pair
  # over a 1 ms backing, where a write sent around costs what the backing does.
  FULLUP="exec nbdkit -U d.sock -f --exit-with-parent --filter=delay file backing.img rdelay=1ms wdelay=1ms"
  FULLNV="exec $NVWC serve --cache cache.img --cache-size ${FULL_CACHE_MB}M --listen none --unix n.sock --write-policy write-back"
  add nbdkit-file/full "exec nbdkit -U k.sock -f --exit-with-parent file backing.img" k.sock "full-qd16 full-zipf" "" 0 $((FULL_CACHE_MB * 4))
  add nvwc-write-back/full "$FULLNV --backing backing.img" n.sock "full-qd16 full-zipf" "" 0 $((FULL_CACHE_MB * 4))
  [ -z "$BASE" ] || add nvwc-write-back/full@base "${FULLNV/$NVWC/$BASE} --backing backing.img" n.sock "full-qd16 full-zipf" "" 0 $((FULL_CACHE_MB * 4))
  add nvwc-write-back/full-unpaced "$FULLNV --backing backing.img --full-clean-secs 0" n.sock "full-qd16 full-zipf" "" 0 $((FULL_CACHE_MB * 4))
  add nvwc-write-back/full-1ms "$FULLNV --backing 'nbd+unix:///?socket=$W/d.sock'" n.sock "full-qd16" "$FULLUP" 0 $((FULL_CACHE_MB * 4))
  add nvwc-write-back/full-1ms-unpaced "$FULLNV --backing 'nbd+unix:///?socket=$W/d.sock' --full-clean-secs 0" n.sock "full-qd16" "$FULLUP" 0 $((FULL_CACHE_MB * 4))
fi
[ ${#NAMES[@]} -gt 0 ] || { echo "BENCH_ONLY=${BENCH_ONLY:-} selects nothing (groups: fast slow fsync fsync1 fsync8 full)"; exit 2; }

declare -A VALS
echo "== ${#NAMES[@]} servers (groups:${ONLY% }), fio nbd engine, ${RUNTIME}s per workload, ${REPS} interleaved rounds"
for r in $(seq "$REPS"); do
  # Even rounds run the servers in reverse order, so no server always runs
  # first (after a cold start of the machine's caches) or right after the
  # same neighbour: a position effect cancels out of the medians.
  ROUND=("${NAMES[@]}")
  if [ $((r % 2)) = 0 ]; then ROUND=(); for ((i = ${#NAMES[@]} - 1; i >= 0; i--)); do ROUND+=("${NAMES[i]}"); done; fi
  for name in "${ROUND[@]}"; do
    fresh
    [ "${PRE[$name]}" = 0 ] || prealloc "${PRE[$name]}"
    if [ -n "${UP[$name]}" ]; then
      (cd "$W" && eval "${UP[$name]}" >/dev/null 2>&1) & PIDS+=($!); wait_sock "$W/d.sock"
    fi
    (cd "$W" && eval "${START[$name]}" >/dev/null 2>&1) & pid=$!; PIDS+=($pid); wait_sock "$W/${SOCK[$name]}"
    uri="nbd+unix:///?socket=$W/${SOCK[$name]}"
    [ "${WARM[$name]}" = 0 ] || run_fio "$uri" "$pid" 2 --rw=write --bs=64k --iodepth=16 >/dev/null
    for wl in ${WLS[$name]}; do
      v=$(run_fio "$uri" "$pid" "$RUNTIME" ${FIO[$wl]})
      VALS["$name $wl"]+="$v;"
      printf 'round %d  %-34s %-13s iops=%-8s p50_us=%-8s p99_us=%-8s cpu_us/req=%-6s flush_p99_us=%s\n' "$r" "$name" "$wl" $v
    done
    stop_all
  done
done

echo "== medians over ${REPS} rounds (by IOPS; CPU per request: its own median)"
python3 - "$(declare -p VALS)" "${NAMES[@]}" <<'PY'
import sys, re, statistics as st
d = dict(re.findall(r'\["([^"]+)"\]="([^"]*)"', sys.argv[1]))
order = {n: i for i, n in enumerate(sys.argv[2:])}
iops, cpu, p99 = {}, {}, {}
for k, v in sorted(d.items(), key=lambda kv: (order.get(kv[0].rsplit(" ", 1)[0], 99), kv[0])):
    runs = [r.split() for r in v.split(";") if r]
    runs.sort(key=lambda r: float(r[0]))
    med = runs[(len(runs) - 1) // 2]
    iops[k] = float(med[0])
    p99[k] = float(med[2]) if med[2] != "stalled" else float("nan")
    c = [float(r[3]) for r in runs if r[3] != "stalled"]
    cpu[k] = st.median(c) if c else float("nan")
    fl = f" flush_p99_us={med[4]:<8}" if len(med) > 4 and med[4] != "-" else ""
    print(f"{k:<48} iops={med[0]:<8} p50_us={med[1]:<8} p99_us={med[2]:<8} cpu_us/req={cpu[k]:.2f}{fl}  (iops: {' '.join(r[0] for r in runs)})")
print("== ratios (IOPS)")
for wl in ["randwrite-4k", "write-64k"]:
  for v in ["nvwc-write-back", "nvwc-write-back+fresh-slots"]:
    if f"{v} {wl}" in iops:
      n = iops[f"{v} {wl}"]
      best = max(iops[f"nbdkit-file {wl}"], iops[f"qemu-nbd {wl}"])
      print(f"{wl}: {v} / best(nbdkit-file, qemu-nbd) = {n/best:.2f}  (target >= 1.0)")
      print(f"{wl}: {v} / nbdkit-memory               = {n/iops[f'nbdkit-memory {wl}']:.2f}  (target >= 0.8)")
      print(f"{wl}: {v} / nbdkit-cache-filter         = {n/iops[f'nbdkit-cache-filter {wl}']:.2f}")
  if f"nvwc-write-back/slow {wl}" in iops:
    wt = iops[f"nvwc-write-through/slow {wl}"]
    for v in ["write-back", "write-back+fresh-slots"]:
      wb = iops[f"nvwc-{v}/slow {wl}"]
      print(f"{wl}: slow backing: {v} / write-through = {wb/wt:.1f}  (target >= 10)")
    wb = iops[f"nvwc-write-back/slow {wl}"]
    print(f"{wl}: slow backing: ordered / write-through    = {iops[f'nvwc-ordered/slow {wl}']/wt:.1f}")
    print(f"{wl}: slow backing: journaled / write-through  = {iops[f'nvwc-journaled/slow {wl}']/wt:.1f}")
    print(f"{wl}: slow backing: nvwc write-back / nbdkit cache filter = {wb/iops[f'nbdkit-cache-filter/slow {wl}']:.2f}")
def ratio(a, b, target, what, p=False):
    d = p99 if p else iops
    if a in d and b in d and d[b] > 0:
        v = d[a] / d[b]
        t = "" if target is None else (f"  (target {target}: " + ("met" if eval(f"{v} {target}") else "MISSED") + ")")
        print(f"{what:<62} = {v:.2f}{t}")
for pol in ["write-back", "journaled", "ordered", "write-through"]:
    ratio(f"nvwc-{pol}/fsync fsync-qd1", "nbdkit-file/fsync fsync-qd1", None if pol == "write-through" else ">= 1.0",
          f"fsync QD1: nvwc {pol} / nbdkit file")
dl = [k.split()[0].split("/")[1] for k in iops if k.startswith("uncached/")]
for dly in dl[:1]:
    for pol in ["write-back", "journaled", "write-through"]:
        ratio(f"nvwc-{pol}/{dly} fsync-8jobs", f"uncached/{dly} fsync-8jobs", None if pol == "write-through" else ">= 6",
              f"8 jobs x QD1 fsync, {dly} backing: nvwc {pol} / uncached")
ratio("nvwc-write-back/full full-qd16", "nbdkit-file/full full-qd16", ">= 0.7", "full cache (4x range, first touch): write-back / nbdkit file, IOPS")
ratio("nvwc-write-back/full full-qd16", "nbdkit-file/full full-qd16", "<= 2", "full cache (4x range, first touch): write-back / nbdkit file, p99", p=True)
ratio("nvwc-write-back/full-unpaced full-qd16", "nbdkit-file/full full-qd16", None, "full cache: write-back cleaning at full speed / nbdkit file, IOPS")
ratio("nvwc-write-back/full full-zipf", "nbdkit-file/full full-zipf", None, "full cache, Zipf 1.1: write-back / nbdkit file, IOPS")
ratio("nvwc-write-back/full full-zipf", "nbdkit-file/full full-zipf", None, "full cache, Zipf 1.1: write-back / nbdkit file, p99", p=True)
ratio("nvwc-write-back/full full-zipf", "nvwc-write-back/full-unpaced full-zipf", None, "full cache, Zipf 1.1: paced / full-speed cleaning, IOPS")
ratio("nvwc-write-back/full-1ms full-qd16", "nvwc-write-back/full-1ms-unpaced full-qd16", None, "full cache, 1 ms backing: paced / full-speed cleaning, IOPS")
ratio("nvwc-write-back/full-1ms full-qd16", "nvwc-write-back/full-1ms-unpaced full-qd16", None, "full cache, 1 ms backing: paced / full-speed cleaning, p99", p=True)
bases = sorted({k.split()[0] for k in iops if k.split()[0].endswith("@base")})
if bases:
    print("== this build / the NVWC_BASE build, same rounds (IOPS; server CPU per request)")
import random
def rounds(k):  # IOPS per round, in round order (a stalled run counts 0)
    return [float(r.split()[0]) for r in d[k].split(";") if r]
for b in bases:
    for k in sorted(k for k in iops if k.split()[0] == b):
        a = k.replace("@base", "", 1)
        if a in iops and iops[k] > 0:
            x, y = rounds(a), rounds(k)
            # Noise band: a bootstrap of the ratio of medians (90 %), and the
            # median of the same-round ratios.
            rng = random.Random(1)
            bs = sorted(st.median(rng.choices(x, k=len(x))) / max(st.median(rng.choices(y, k=len(y))), 1e-9) for _ in range(4000))
            paired = st.median(u / v for u, v in zip(x, y) if v > 0)
            print(f"{a:<44} IOPS {iops[a] / iops[k]:.2f}x (90% band {bs[200]:.2f}-{bs[3800]:.2f}, same-round median {paired:.2f}x)   CPU/req {cpu[a] / cpu[k]:.2f}x")
print("== server CPU per request (µs, lower is better; steadier than IOPS on a noisy machine)")
for wl in ["randwrite-4k", "write-64k"]:
  row = [f"{n}={cpu[f'{n} {wl}']:.2f}" for n in ["nvwc-write-back", "nbdkit-file", "qemu-nbd", "nbdkit-memory"] if f"{n} {wl}" in cpu]
  if row: print(f"{wl}: " + "  ".join(row))
PY

# The full-cache row over time (issue 17: stalls, destage rate and p99 over
# time): one more nvwc write-back run over 4x the cache, twice as long, with
# `nvwc status` sampled every second and fio's per-write latency log.
if sel full; then
  TL=$((RUNTIME * 2))
  echo "== full cache over time: nvwc write-back, ${FULL_CACHE_MB}M cache, 4 KiB QD16 over $((FULL_CACHE_MB * 4))M, ${TL}s, fast local backing"
  fresh; prealloc $((FULL_CACHE_MB * 4))
  (cd "$W" && exec $NVWC serve --cache cache.img --cache-size ${FULL_CACHE_MB}M --listen none --unix n.sock --control "$W/ctl" \
      --backing backing.img --write-policy write-back >/dev/null 2>&1) & PIDS+=($!); wait_sock "$W/n.sock"
  ( for _ in $(seq $((TL + 3))); do
      printf '%s ' "$(date +%s.%N)"; "$NVWC" status --control "$W/ctl" --json 2>/dev/null | tr -d '\n'; echo
      sleep 1
    done ) > "$W/status.log" & sampler=$!
  (cd "$W" && timeout -k 5 $((TL * 3 + 20)) fio --name=tl --ioengine=nbd --uri="nbd+unix:///?socket=$W/n.sock" \
      ${FIO[full-qd16]} --time_based --runtime="$TL" --write_lat_log="$W/lat" --log_unix_epoch=1 --output-format=json >/dev/null 2>&1) || echo "(fio failed)"
  kill $sampler 2>/dev/null || true; wait $sampler 2>/dev/null || true
  python3 - "$W/status.log" "$W"/lat_lat.1.log <<'PY'
import json, sys, collections
lat = collections.defaultdict(list)          # second -> write latencies (us)
t0 = None
for line in open(sys.argv[2]):
    f = line.split(",")
    if len(f) < 3 or f[2].strip() != "1":
        continue
    ms = int(f[0]); t0 = ms if t0 is None else min(t0, ms)
    lat[ms // 1000].append(int(f[1]) / 1000)
samples = []
for line in open(sys.argv[1]):
    ts, _, js = line.partition(" ")
    try:
        s = json.loads(js)["exports"][0]["stats"]
    except Exception:
        continue
    samples.append((float(ts), s))
print(f"{'s':>3} {'IOPS':>7} {'p99_ms':>7} {'stalls/s':>9} {'destaged/s':>11} {'bypassed/s':>11} {'dirty':>7} {'free':>6}")
secs = sorted(lat)
for (ta, a), (tb, b) in zip(samples, samples[1:]):
    dt = tb - ta
    sec = int(tb)
    l = sorted(lat.get(sec, []))
    p99 = l[int(len(l) * 0.99)] / 1000 if l else float("nan")
    rate = lambda k: (b.get(k, 0) - a.get(k, 0)) / dt
    if not l and b.get("writes", 0) == a.get("writes", 0):
        continue
    print(f"{sec - secs[0] if secs else 0:>3} {len(l):>7} {p99:>7.2f} {rate('stalled_writes'):>9.0f} {rate('destaged_blocks'):>11.0f} "
          f"{rate('full_bypassed_writes'):>11.0f} {b.get('dirty_blocks', 0):>7} {b.get('free_slots', 0):>6}")
PY
  stop_all
fi
