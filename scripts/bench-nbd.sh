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
# The machine is noisy (its speed drifts by tens of percent over minutes), so
# the repetitions are interleaved: round r runs every server once, and each
# figure is the median over the rounds. Every server starts fresh in every
# round and gets the same 2 s warm-up (64 KiB writes over the range) first.
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
fresh() { rm -f "$W"/*.img "$W"/*.sock "$W"/*.nvwc-redo; rm -rf "$W/nvwc-data"; truncate -s 1G "$W/backing.img"; }
# utime + stime of a process and all its threads, in clock ticks.
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
TICK_US=$((1000000 / $(getconf CLK_TCK)))

# fio JSON -> "iops p50_us p99_us cpu_us_per_request" (CPU of process $4).
# A run that cannot finish its in-flight requests within 3x its runtime + 20 s
# (a server stalled on a full cache) is cut off and reported as "0 stalled stalled stalled".
run_fio() { # uri rw bs pid [runtime]
  local out c0 c1
  c0=$(cpu_ticks "$4")
  out=$(timeout -k 5 $((RUNTIME * 3 + 20)) fio --name=b --ioengine=nbd --uri="$1" --rw="$2" --bs="$3" --iodepth=16 --size=256M \
      --time_based --runtime="${5:-$RUNTIME}" --output-format=json 2>/dev/null) || { echo "0 stalled stalled stalled"; return; }
  c1=$(cpu_ticks "$4")
  printf '%s' "$out" |
  python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]["write"]; p=j["clat_ns"]["percentile"]; n=max(j["total_ios"],1); print("%.0f %.1f %.1f %.2f" % (j["iops"], p["50.000000"]/1e3, p["99.000000"]/1e3, (int(sys.argv[1])*int(sys.argv[2]))/n))' "$((c1 - c0))" "$TICK_US"
}

# Servers: name -> start command (run in $W, must exec the server so that $!
# is its PID) and socket.
NAMES=()
declare -A START SOCK
add() { NAMES+=("$1"); START["$1"]="$2"; SOCK["$1"]="$3"; }
ONLY=${BENCH_ONLY:-all}
NV="exec $NVWC serve --cache cache.img --cache-size 768M --listen none --unix n.sock"
if [ "$ONLY" != slow ]; then
  add nbdkit-memory "exec nbdkit -U k.sock -f --exit-with-parent memory 1G" k.sock
  add nbdkit-file "exec nbdkit -U k.sock -f --exit-with-parent file backing.img" k.sock
  add nbdkit-cache-filter "exec nbdkit -U k.sock -f --exit-with-parent --filter=cache file backing.img" k.sock
  add qemu-nbd "exec qemu-nbd -t -k $W/q.sock -f raw --cache=writeback backing.img" q.sock
  add nvwc-write-back "$NV --backing backing.img --write-policy write-back" n.sock
  # The opt-out: every rewrite to a fresh slot (a cache-device write that
  # fails part-way cannot damage a flushed block; costs slot churn and commits).
  add nvwc-write-back+fresh-slots "$NV --backing backing.img --write-policy write-back --rewrite-in-place=false" n.sock
fi
SLOW=()
if [ "$ONLY" != fast ]; then
  for pol in write-back write-back+fresh-slots ordered journaled write-through; do
    flags="--write-policy ${pol%%+*}"; [ "$pol" = "${pol%%+*}" ] || flags="$flags --rewrite-in-place=false"
    add "nvwc-$pol/slow" "$NV --backing 'nbd+unix:///?socket=$W/d.sock' $flags" n.sock
    SLOW+=("nvwc-$pol/slow")
  done
  add nbdkit-cache-filter/slow "exec nbdkit -U c.sock -f --exit-with-parent --filter=cache --filter=delay file backing.img delay-write=1ms" c.sock
fi

declare -A VALS
echo "== ${#NAMES[@]} servers x {4k randwrite, 64k seqwrite}, fio nbd engine QD16, ${RUNTIME}s, ${REPS} interleaved rounds"
for r in $(seq "$REPS"); do
  for name in "${NAMES[@]}"; do
    fresh
    if [[ " ${SLOW[*]} " == *" $name "* ]]; then
      (cd "$W" && exec nbdkit -U d.sock -f --exit-with-parent --filter=delay file backing.img delay-write=1ms) & PIDS+=($!); wait_sock "$W/d.sock"
    fi
    (cd "$W" && eval "${START[$name]}" >/dev/null 2>&1) & pid=$!; PIDS+=($pid); wait_sock "$W/${SOCK[$name]}"
    uri="nbd+unix:///?socket=$W/${SOCK[$name]}"
    run_fio "$uri" write 64k "$pid" 2 >/dev/null
    for wl in "randwrite 4k" "write 64k"; do
      set -- $wl
      v=$(run_fio "$uri" "$1" "$2" "$pid")
      VALS["$name $1-$2"]+="$v;"
      printf 'round %d  %-34s %-13s iops=%-8s p50_us=%-8s p99_us=%-8s cpu_us/req=%s\n' "$r" "$name" "$1 $2" $v
    done
    stop_all
  done
done

echo "== medians over ${REPS} rounds (by IOPS; CPU per request: its own median)"
python3 - "$(declare -p VALS)" "${NAMES[@]}" <<'PY'
import sys, re, statistics as st
d = dict(re.findall(r'\["([^"]+)"\]="([^"]*)"', sys.argv[1]))
order = {n: i for i, n in enumerate(sys.argv[2:])}
iops, cpu = {}, {}
for k, v in sorted(d.items(), key=lambda kv: (order.get(kv[0].rsplit(" ", 1)[0], 99), kv[0])):
    runs = [r.split() for r in v.split(";") if r]
    runs.sort(key=lambda r: float(r[0]))
    med = runs[(len(runs) - 1) // 2]
    iops[k] = float(med[0])
    c = [float(r[3]) for r in runs if r[3] != "stalled"]
    cpu[k] = st.median(c) if c else float("nan")
    print(f"{k:<48} iops={med[0]:<8} p50_us={med[1]:<8} p99_us={med[2]:<8} cpu_us/req={cpu[k]:.2f}  (iops: {' '.join(r[0] for r in runs)})")
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
print("== server CPU per request (µs, lower is better; steadier than IOPS on a noisy machine)")
for wl in ["randwrite-4k", "write-64k"]:
  row = [f"{n}={cpu[f'{n} {wl}']:.2f}" for n in ["nvwc-write-back", "nbdkit-file", "qemu-nbd", "nbdkit-memory"] if f"{n} {wl}" in cpu]
  if row: print(f"{wl}: " + "  ".join(row))
PY
