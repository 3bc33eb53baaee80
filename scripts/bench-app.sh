#!/usr/bin/env bash
# Real-application benchmark: PostgreSQL's pgbench on ext4, over nbdfuse and
# a loop device, on every export below. Each export is served on a unix socket:
#   nvwc-<policy>/<D>ms   nvwc serve --write-policy <policy> (write-back, ordered,
#                         journaled, write-through) with an upstream NBD backing
#                         store slowed by nbdkit's delay filter: rdelay=wdelay=<D>ms
#                         (reads, writes, zeroes and trims all cost D ms)
#   uncached/<D>ms        that delayed backing store itself, served directly
#   nbdkit-cache-filter/<D>ms   nbdkit --filter=cache --filter=delay file: the
#                         cache filter (write-back, its default) over the same delay
#   fast-local            nbdkit file on the local file system, no delay
# Every file (backing image, nvwc's cache, the cache filter's cache) is on the
# same local file system, under one temp dir.
#
# One run: fresh sparse image -> servers -> nbdfuse DIR/fuse (file DIR/fuse/nbd)
# -> losetup --direct-io=off -> mkfs.ext4 -> mount -> PostgreSQL (a data dir
# initdb'd once per invocation, copied in; started by this script as the
# postgres user, unix socket only, in a private dir) -> pgbench -i -s SCALE and
# CHECKPOINT (setup, not timed) -> timed: pgbench -c 8 -j 2 -T RUNTIME --log
# (tps from pgbench, latency avg/stddev/p50/p99 from its per-transaction log,
# every commit's WAL fsync inside the window) -> CHECKPOINT timed on its own
# (ckpt_s: the dirty buffers pgbench left, written and fsynced) -> pg_ctl
# stop, umount, losetup -d, unmount nbdfuse, stop the servers.
# Rounds are interleaved (round r runs every export once); figures are medians
# over the rounds. Ratios are printed with their targets (issue 17) and whether
# each is met; a missed target does not fail the script: this is a measurement.
#
# Usage: scripts/bench-app.sh            (needs root: loop devices, mount, FUSE)
#   RUNTIME=15       seconds of pgbench per run
#   REPS=3           interleaved rounds
#   DELAYS="5"       backing delays in ms, e.g. DELAYS="1 5"
#   BENCH_ONLY=...   space-separated globs over export names, e.g.
#                    BENCH_ONLY='fast-local uncached/* nvwc-write-back/*'
#   SCALE=10 CLIENTS=8 JOBS=2  pgbench scale, clients (-c) and threads (-j)
#   IMAGE_SIZE=2G    backing image; CACHE_SIZE=1G  nvwc's cache and the cache
#                    filter's cache-max-size
#   OUT=reports/bench-app   prefix of the .json and .md written
# Exit status: 0 when every run completed (missed targets included), 1 when
# a run failed (the reports are still written), 2 on a setup error.
#   LAYOUT=wal-split  pg_wal on its own ext4 in the export's first WAL_SIZE
#                    bytes (a second loop device), the data directory on
#                    another ext4 after it; ADMISSIONS="all sync wal" adds, per
#                    delay, nvwc-adm-<policy>/<D>ms: write-back with
#                    --admission <policy> --wal-range 0:WAL_SIZE
#                    (scripts/bench-admission-app.sh runs this)
# Smoke test (about 6 min):
#   RUNTIME=3 REPS=1 DELAYS=5 scripts/bench-app.sh
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-15}
REPS=${REPS:-3}
DELAYS=${DELAYS:-5}
ONLY=${BENCH_ONLY:-*}
SCALE=${SCALE:-10}
CLIENTS=${CLIENTS:-8}
JOBS=${JOBS:-2}
IMAGE_SIZE=${IMAGE_SIZE:-2G}
CACHE_SIZE=${CACHE_SIZE:-1G}
OUT=${OUT:-reports/bench-app}
LAYOUT=${LAYOUT:-single}
WAL_SIZE=${WAL_SIZE:-512M}
ADMISSIONS=${ADMISSIONS:-}
CMDLINE="RUNTIME=$RUNTIME REPS=$REPS DELAYS='$DELAYS' BENCH_ONLY='$ONLY' SCALE=$SCALE CLIENTS=$CLIENTS JOBS=$JOBS IMAGE_SIZE=$IMAGE_SIZE CACHE_SIZE=$CACHE_SIZE LAYOUT=$LAYOUT WAL_SIZE=$WAL_SIZE ADMISSIONS='$ADMISSIONS' ${SCRIPT_NAME:-scripts/bench-app.sh}"
case $LAYOUT in single|wal-split) ;; *) echo "bench-app: LAYOUT=$LAYOUT: single or wal-split" >&2; exit 2 ;; esac

die() { echo "bench-app: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || die "needs root (loop devices, mount, FUSE)"
[ -e /dev/fuse ] || die "no /dev/fuse (FUSE kernel module; try modprobe fuse)"
need() { command -v "$1" >/dev/null || die "missing $1 (Debian package: $2; apt-get install -y $2)"; }
need nbdkit nbdkit; need nbdfuse nbdfuse; need losetup mount; need mkfs.ext4 e2fsprogs
need runuser util-linux; need python3 python3; need cargo cargo
PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[ -n "$PGBIN" ] && [ -x "$PGBIN/initdb" ] && [ -x "$PGBIN/pgbench" ] ||
  die "missing PostgreSQL (Debian package: postgresql; apt-get update && apt-get install -y postgresql)"
id postgres >/dev/null 2>&1 || die "no postgres user (Debian package postgresql creates it)"
nbdkit --dump-plugin file >/dev/null 2>&1 || die "nbdkit has no file plugin (Debian package: nbdkit)"
nbdkit --filter=delay null --dump-plugin >/dev/null 2>&1 || die "nbdkit has no delay filter (Debian package: nbdkit)"

cargo build --release -q -p nvwc
NVWC=$(realpath "${CARGO_TARGET_DIR:-target}/release/nvwc")

W=$(mktemp -d /tmp/nvwc-bench-app.XXXXXX)
chmod 755 "$W"   # the postgres user walks into it
cleanup_all() {
  # A run cleans up after itself (its own trap); this catches anything left.
  for m in $(awk -v w="$W" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r); do umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true; done
  for l in $(losetup -n -O NAME,BACK-FILE 2>/dev/null | awk -v w="$W" 'index($2, w) == 1 {print $1}'); do losetup -d "$l" 2>/dev/null || true; done
  rm -rf "$W"
}
trap cleanup_all EXIT
trap 'echo "bench-app: interrupted" >&2; exit 130' INT TERM

# A PostgreSQL data dir made once and copied into every file system.
PGPORT=${PGPORT:-54329}
mkdir "$W/pgtemplate"; chown postgres "$W/pgtemplate"
runuser -u postgres -- "$PGBIN/initdb" -D "$W/pgtemplate" -A trust -U postgres -N >"$W/initdb.log" 2>&1 ||
  { cat "$W/initdb.log" >&2; die "initdb failed"; }

# Exports: name -> delay (ms, empty for none) and kind.
NAMES=()
declare -A KIND DELAY
add() { # name kind delay; kept if a BENCH_ONLY glob matches the name
  local pat; set -f; for pat in $ONLY; do [[ $1 == $pat ]] && { NAMES+=("$1"); KIND[$1]=$2; DELAY[$1]=$3; break; }; done; set +f
}
add fast-local fast-local ""
for d in $DELAYS; do
  add "uncached/${d}ms" uncached "$d"
  add "nbdkit-cache-filter/${d}ms" cache-filter "$d"
  for pol in write-back ordered journaled write-through; do add "nvwc-$pol/${d}ms" "nvwc-$pol" "$d"; done
  for adm in $ADMISSIONS; do add "nvwc-adm-$adm/${d}ms" "nvwc-adm-$adm" "$d"; done
done
[ ${#NAMES[@]} -gt 0 ] || die "BENCH_ONLY='$ONLY' selects no export"

wait_for() { # path what timeout_s
  local i; for i in $(seq $(( ${3:-20} * 20 ))); do [ -e "$1" ] && return 0; sleep 0.05; done
  echo "timed out waiting for $2 ($1)" >&2; return 1
}

# One run, in a subshell with its own cleanup (globals here are the
# subshell's); prints one line of "key=value" results on fd 3.
one_run() { # name
  local name=$1 kind=${KIND[$1]} d=${DELAY[$1]}
  R=$W/run
  rm -rf "$R"; mkdir -p "$R/fuse" "$R/mnt" "$R/sock" "$R/log"
  chown postgres "$R/sock" "$R/log"
  pids=() loop="" walloop="" fusepid="" pgup=""
  run_cleanup() {
    set +e
    if [ -n "$pgup" ]; then timeout 60 runuser -u postgres -- "$PGBIN/pg_ctl" -D "$R/mnt/pgdata" -m immediate stop >/dev/null 2>&1; fi
    if mountpoint -q "$R/mnt"; then timeout 120 umount "$R/mnt" 2>/dev/null || umount -l "$R/mnt"; fi
    if mountpoint -q "$R/wal" 2>/dev/null; then timeout 120 umount "$R/wal" 2>/dev/null || umount -l "$R/wal"; fi
    [ -n "$loop" ] && losetup -d "$loop" 2>/dev/null
    [ -n "$walloop" ] && losetup -d "$walloop" 2>/dev/null
    if mountpoint -q "$R/fuse"; then
      { command -v fusermount3 >/dev/null && fusermount3 -u "$R/fuse"; } 2>/dev/null || timeout 60 umount "$R/fuse" 2>/dev/null || umount -l "$R/fuse"
    fi
    if [ -n "$fusepid" ]; then
      for _ in $(seq 100); do kill -0 "$fusepid" 2>/dev/null || break; sleep 0.05; done
      kill "$fusepid" 2>/dev/null
    fi
    local p; for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
  }
  trap 'run_cleanup >/dev/null 2>>"$W/run.err"' EXIT
  trap 'exit 130' INT TERM
  truncate -s "$IMAGE_SIZE" "$R/backing.img"
  local rd="rdelay=${d}ms wdelay=${d}ms"
  local sock="$R/e.sock"
  case $kind in
    fast-local)   (cd "$R" && exec nbdkit -U "$sock" -f --exit-with-parent file backing.img >server.log 2>&1) & pids+=($!) ;;
    uncached)     (cd "$R" && exec nbdkit -U "$sock" -f --exit-with-parent --filter=delay file backing.img $rd >server.log 2>&1) & pids+=($!) ;;
    # The cache filter keeps its cache in $TMPDIR: the same file system;
    # cache-max-size is nvwc's cache size. Its block size stays at its default
    # (64 KiB): at 4 KiB (nvwc's), its FLUSH, which writes the dirty blocks
    # back one at a time through the delay, made mkfs alone take over 5 min.
    cache-filter) (cd "$R" && TMPDIR=$R exec nbdkit -U "$sock" -f --exit-with-parent --filter=cache --filter=delay file backing.img $rd \
                     cache=writeback cache-max-size="$CACHE_SIZE" >server.log 2>&1) & pids+=($!) ;;
    nvwc-*)       (cd "$R" && exec nbdkit -U d.sock -f --exit-with-parent --filter=delay file backing.img $rd >upstream.log 2>&1) & pids+=($!)
                  wait_for "$R/d.sock" "the delayed upstream"
                  local policy=(--write-policy "${kind#nvwc-}")
                  [[ $kind == nvwc-adm-* ]] && policy=(--write-policy write-back --admission "${kind#nvwc-adm-}" --wal-range "0:$WAL_SIZE")
                  (cd "$R" && exec "$NVWC" serve --backing "nbd+unix:///?socket=$R/d.sock" --cache cache.img --cache-size "$CACHE_SIZE" \
                     --listen none --unix "$sock" --control n.ctl "${policy[@]}" >server.log 2>&1) & pids+=($!) ;;
  esac
  wait_for "$sock" "$name"
  nbdfuse "$R/fuse" --unix "$sock" >"$R/nbdfuse.log" 2>&1 & fusepid=$!
  wait_for "$R/fuse/nbd" nbdfuse
  # Inode tables and journal written now, not by ext4lazyinit during the run.
  local mkfs=(mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0)
  if [ "$LAYOUT" = wal-split ]; then
    # pg_wal's file system first (the --wal-range), the data's after it.
    walloop=$(losetup -f --show --direct-io=off --sizelimit "$WAL_SIZE" "$R/fuse/nbd")
    loop=$(losetup -f --show --direct-io=off --offset "$WAL_SIZE" "$R/fuse/nbd")
    "${mkfs[@]}" "$walloop"; "${mkfs[@]}" "$loop"
    mount -t ext4 "$loop" "$R/mnt"
    mkdir -p "$R/wal"; mount -t ext4 "$walloop" "$R/wal"
    cp -a "$W/pgtemplate" "$R/mnt/pgdata"
    mv "$R/mnt/pgdata/pg_wal" "$R/wal/pg_wal"; ln -s "$R/wal/pg_wal" "$R/mnt/pgdata/pg_wal"
    chown -R postgres "$R/wal/pg_wal"; chmod 700 "$R/wal/pg_wal"
  else
    loop=$(losetup -f --show --direct-io=off "$R/fuse/nbd")
    "${mkfs[@]}" "$loop"
    mount -t ext4 "$loop" "$R/mnt"
    cp -a "$W/pgtemplate" "$R/mnt/pgdata"
  fi
  chown -R postgres "$R/mnt/pgdata"; chmod 700 "$R/mnt/pgdata"
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$R/mnt/pgdata" -l "$R/log/postgres.log" -w -t 120 \
    -o "-c listen_addresses='' -c unix_socket_directories='$R/sock' -p $PGPORT" start >/dev/null
  pgup=1
  local PG=(-h "$R/sock" -p "$PGPORT" -U postgres)
  local t0 t1 t2 t3
  t0=$(date +%s.%N)
  timeout 1800 "$PGBIN/pgbench" "${PG[@]}" -i -s "$SCALE" -q postgres >"$R/log/init.log" 2>&1 || { cat "$R/log/init.log" >&2; return 1; }
  timeout 600 "$PGBIN/psql" "${PG[@]}" -qAtc CHECKPOINT postgres
  t1=$(date +%s.%N)
  # nvwc's counters before and after the timed run (`nvwc status`): the
  # result line gets the timed run's block waits (pieces that waited for a
  # write in flight on their block) and backing FLUSHes.
  local st0="{}" st1="{}"
  [[ $kind == nvwc-* ]] && st0=$("$NVWC" status --control "$R/n.ctl" --json 2>/dev/null || echo "{}")
  (cd "$R/log" && timeout $((RUNTIME * 4 + 120)) "$PGBIN/pgbench" "${PG[@]}" -c "$CLIENTS" -j "$JOBS" -T "$RUNTIME" \
     --log --log-prefix=tx postgres >"$R/log/run.log" 2>&1) || { cat "$R/log/run.log" >&2; return 1; }
  t2=$(date +%s.%N)
  [[ $kind == nvwc-* ]] && st1=$("$NVWC" status --control "$R/n.ctl" --json 2>/dev/null || echo "{}")
  printf '%s\n%s\n' "$st0" "$st1" >"$R/log/status.json"
  timeout 600 "$PGBIN/psql" "${PG[@]}" -qAtc CHECKPOINT postgres
  t3=$(date +%s.%N)
  runuser -u postgres -- "$PGBIN/pg_ctl" -D "$R/mnt/pgdata" -m fast -w -t 120 stop >/dev/null; pgup=""
  umount "$R/mnt"
  if [ "$LAYOUT" = wal-split ]; then umount "$R/wal"; fi
  python3 - "$R/log" "$t0" "$t1" "$t2" "$t3" >&3 <<'PY'
import glob, math, re, statistics as st, sys
d = sys.argv[1]; t0, t1, t2, t3 = map(float, sys.argv[2:6])
out = open(d + "/run.log").read()
tps = float(re.search(r"tps = ([0-9.]+)", out).group(1))
failed = re.search(r"number of failed transactions: (\d+)", out)
lat = []
for f in glob.glob(d + "/tx.*"):
    for line in open(f):
        p = line.split()
        if len(p) >= 6 and p[2].isdigit():
            lat.append(int(p[2]) / 1000.0)  # µs -> ms
lat.sort()
pct = lambda q: lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))] if lat else float("nan")
import json
def counters(line):
    try:
        return json.loads(line)["exports"][0]["stats"]
    except (ValueError, KeyError, IndexError):
        return {}
s0, s1 = (counters(l) for l in (open(d + "/status.json").read().splitlines() + ["{}", "{}"])[:2])
delta = lambda k: s1.get(k, 0) - s0.get(k, 0)
extra = (f" block_waits={delta('block_waits')} block_wait_ms={delta('block_wait_ns') / 1e6:.1f}"
         f" backing_flushes={delta('backing_flushes')} commits={delta('commits')}"
         f" cache_write_mb={delta('cache_write_bytes') / 1e6:.1f} bypassed_mb={delta('bypassed_bytes') / 1e6:.1f}") if s1 else ""
print(f"tps={tps:.1f} lat_avg_ms={st.mean(lat) if lat else float('nan'):.3f} lat_std_ms={st.pstdev(lat) if lat else float('nan'):.3f} "
      f"lat_p50_ms={pct(0.50):.3f} lat_p99_ms={pct(0.99):.3f} lat_p999_ms={pct(0.999):.3f} txns={len(lat)} failed={failed.group(1) if failed else 0} "
      f"wall_s={t2 - t1:.2f} init_s={t1 - t0:.2f} ckpt_s={t3 - t2:.2f}{extra}")
PY
}

RAW="$W/raw.txt"; : >"$RAW"
START_DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
echo "== pgbench -c $CLIENTS -j $JOBS -T $RUNTIME (scale $SCALE) on ext4 over nbdfuse+loop; ${#NAMES[@]} exports x $REPS interleaved rounds; cache $CACHE_SIZE, image $IMAGE_SIZE" >&2
for r in $(seq "$REPS"); do
  for name in "${NAMES[@]}"; do
    t=$(date +%s)
    set +e   # (errexit is ignored inside an `if` condition, so test $? after)
    res=$(set -euo pipefail; one_run "$name" 3>&1 >"$W/run.out" 2>"$W/run.err")
    rc=$?
    set -e
    if [ $rc = 0 ] && [ -n "$res" ]; then
      echo "$r|$name|ok|$res" >>"$RAW"
      echo "round $r/$REPS  $(printf '%-28s' "$name") $res  ($(( $(date +%s) - t )) s)" >&2
    else
      msg=$(tail -n 3 "$W/run.err" | tr '\n|' '  ')
      echo "$r|$name|failed|rc=$rc $msg" >>"$RAW"
      echo "round $r/$REPS  $(printf '%-28s' "$name") FAILED (rc=$rc): $msg" >&2
    fi
  done
done

mkdir -p "$(dirname "$OUT")"
(python3 - "$RAW" "$OUT" "$CMDLINE" "$START_DATE" "$LOAD0" "$(nproc)" "$(uname -r)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')" "$("$PGBIN/postgres" --version)" "$(nbdkit --version)" \
  "$CACHE_SIZE" "$IMAGE_SIZE" "$DELAYS" "$LAYOUT" "$WAL_SIZE" "${NAMES[@]}" <<'PY'
import json, statistics as st, sys
raw, out, cmd, date, load0, ncpu, kernel, cpu, pgver, nbdkitver, cache, image, delays, layout, walsize = sys.argv[1:16]
names = sys.argv[16:]
runs = []
for line in open(raw):
    r, name, status, rest = line.rstrip("\n").split("|", 3)
    run = {"round": int(r), "export": name, "status": status}
    if status == "ok":
        for kv in rest.split():
            k, v = kv.split("=", 1)
            run[k] = float(v)
    else:
        run["error"] = rest
    runs.append(run)
med = {}
for n in names:
    ok = [x for x in runs if x["export"] == n and x["status"] == "ok"]
    if not ok:
        continue
    m = {k: st.median(x[k] for x in ok) for k in ok[0] if isinstance(ok[0][k], float)}
    m["tps_runs"] = [x["tps"] for x in ok]
    m["failed_runs"] = sum(1 for x in runs if x["export"] == n and x["status"] != "ok")
    med[n] = m
ratios = []
def ratio(a, b, target, what):
    if a in med and b in med and med[b]["tps"] > 0:
        v = med[a]["tps"] / med[b]["tps"]
        ratios.append({"what": what, "num": a, "den": b, "ratio": round(v, 3), "target": target,
                       "met": None if target is None else v >= target})
for d in delays.split():
    s = f"/{d}ms"
    for p in ["write-back", "journaled"]:
        ratio(f"nvwc-{p}{s}", "fast-local", 0.8, f"{p} ({d} ms) / fast local")
        ratio(f"nvwc-{p}{s}", f"uncached{s}", 3.0, f"{p} ({d} ms) / uncached")
    ratio(f"nvwc-ordered{s}", "fast-local", 0.6, f"ordered ({d} ms) / fast local")
    ratio(f"nvwc-write-through{s}", f"uncached{s}", 0.9, f"write-through ({d} ms) / uncached")
    ratio(f"nvwc-write-back{s}", f"nbdkit-cache-filter{s}", None, f"write-back ({d} ms) / nbdkit cache filter")
    ratio(f"nbdkit-cache-filter{s}", f"uncached{s}", None, f"nbdkit cache filter ({d} ms) / uncached")
    # Admission (LAYOUT=wal-split): the paper's claim is that caching only
    # what requests wait on loses nothing against caching everything.
    for a in ["sync", "wal", "critical"]:
        ratio(f"nvwc-adm-{a}{s}", f"nvwc-adm-all{s}", 1.0, f"admission {a} ({d} ms) / all")
    ratio(f"nvwc-adm-all{s}", f"uncached{s}", None, f"admission all ({d} ms) / uncached")
machine = f"{ncpu} CPUs ({cpu}), Linux {kernel}, load average at start {load0}; {pgver}; {nbdkitver}"
json.dump({"command": cmd, "date": date, "machine": machine, "cache_size": cache, "image_size": image,
           "runs": runs, "medians": med, "ratios": ratios}, open(out + ".json", "w"), indent=1)

def fmt(v, n=1):
    return "—" if v is None else f"{v:.{n}f}"
lines = []
P = lambda s="": lines.append(s)
print("== medians over rounds (tps: pgbench's; latency in ms from its per-transaction log; ckpt_s: the CHECKPOINT after the run)")
for n in names:
    if n not in med:
        print(f"{n:<30} no successful run")
        continue
    m = med[n]
    cachecol = f" cache_write_mb={m['cache_write_mb']:.0f} bypassed_mb={m['bypassed_mb']:.0f}" if "cache_write_mb" in m else ""
    print(f"{n:<30} tps={m['tps']:<8.1f} lat_avg={m['lat_avg_ms']:<7.2f} lat_std={m['lat_std_ms']:<7.2f} p50={m['lat_p50_ms']:<7.2f} p99={m['lat_p99_ms']:<8.2f} p99.9={m['lat_p999_ms']:<8.2f} ckpt_s={m['ckpt_s']:<6.2f} init_s={m['init_s']:<6.1f}{cachecol} (tps: {' '.join(f'{t:.0f}' for t in m['tps_runs'])})")
print("== ratios (tps medians, this run; a missed target is reported, not an error)")
for x in ratios:
    t = "" if x["target"] is None else f"  target >= {x['target']}: {'met' if x['met'] else 'MISSED'}"
    print(f"{x['what']:<44} {x['ratio']:6.2f}{t}")
failed = [x for x in runs if x["status"] != "ok"]
for x in failed:
    print(f"FAILED: round {x['round']} {x['export']}: {x['error']}")

P(f"# pgbench over nvwc and its peers (generated by `{cmd.split()[-1]}`)")
P()
P(f"Command: `{cmd}`  ")
P(f"Date: {date}  ")
P(f"Machine: {machine}. The machine is shared (other builds may run at the same time): the numbers are indicative; ratios come from one run with interleaved rounds.")
P()
if layout == "wal-split":
    P(f"Layout: pg_wal on its own ext4 in the export's first {walsize} (the `--wal-range` of the nvwc-adm-* exports), the data directory on a second ext4 after it; nvwc-adm-<policy> is write-back with `--admission <policy>`. "
      "The critical policies need requests marked critical; through one nbdfuse connection the live server can mark only a whole export, which makes them `all`, so they are not run. "
      "MB written to the cache and MB bypassed are nvwc's counters over the timed run.")
    P()
P(f"PostgreSQL on ext4 on a loop device over nbdfuse over each export (unix sockets). Backing image {image} (sparse, fresh every run), "
  f"nvwc cache and the nbdkit cache filter's cache-max-size {cache} (nvwc: 4 KiB cache blocks; the cache filter: its default 64 KiB); delayed backing = nbdkit delay filter with rdelay=wdelay=D ms. "
  "tps is pgbench's; latency (ms) comes from its per-transaction log; ckpt_s is a CHECKPOINT right after the run (not in tps). "
  "The cache filter's cache is a temporary file: its FLUSH writes every dirty block through to the delayed backing, so what a FLUSH covers is as durable there as in nvwc.")
P()
P("| export | tps | lat avg | lat stddev | p50 | p99 | p99.9 | ckpt_s | init_s | MB written to the cache | MB bypassed | runs (tps) | failed runs |")
P("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
for n in names:
    if n not in med:
        P(f"| {n} | — | — | — | — | — | — | — | — | — | — | — | all |")
        continue
    m = med[n]
    mb = lambda k: f"{m[k]:.0f}" if k in m else "—"
    P(f"| {n} | {m['tps']:.1f} | {m['lat_avg_ms']:.2f} | {m['lat_std_ms']:.2f} | {m['lat_p50_ms']:.2f} | {m['lat_p99_ms']:.2f} | {m['lat_p999_ms']:.2f} | {m['ckpt_s']:.2f} | {m['init_s']:.1f} | {mb('cache_write_mb')} | {mb('bypassed_mb')} | {' '.join(f'{t:.0f}' for t in m['tps_runs'])} | {m['failed_runs']} |")
P()
P("| ratio (tps) | value | target | met |")
P("|---|---:|---:|---|")
for x in ratios:
    P(f"| {x['what']} | {x['ratio']:.2f} | {'' if x['target'] is None else '≥ ' + str(x['target'])} | {'' if x['met'] is None else ('yes' if x['met'] else 'no')} |")
if failed:
    P()
    for x in failed:
        P(f"- failed: round {x['round']} `{x['export']}`: {x['error']}")
open(out + ".md", "w").write("\n".join(lines) + "\n")
print(f"wrote {out}.json and {out}.md")
sys.exit(3 if failed else 0)
PY
) || { [ $? = 3 ] && { echo "bench-app: some runs failed (listed above; reports written)" >&2; exit 1; }; exit 2; }
