#!/usr/bin/env bash
# Bit-identity check of the simulator: runs a fixed set of `nvwc sim`
# configurations (every write policy, several replacement policies, fetch
# modes, device models, open and closed loop, interval snapshots) over the
# real traces in ../shared/traces and writes each run's JSON with the
# wall-clock fields (wall_seconds, replay_rate) removed, one file per
# configuration, into OUT. Compare two binaries with `diff -r OUT1 OUT2`.
# Usage: scripts/sim-identity.sh OUT [NVWC] [TRACES]
set -euo pipefail
OUT="$1"
NVWC="${2:-target/release/nvwc}"
T="${3:-${NVWC_TRACES:-../shared/traces}}"
mkdir -p "$OUT"
strip() { python3 - "$1" "$2" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d:
    r.pop("wall_seconds", None); r.pop("replay_rate", None)
json.dump(d, open(sys.argv[2], "w"), indent=1, sort_keys=True)
PY
}
run() {
  local name="$1"; shift
  "$NVWC" sim --quiet --json "$OUT/$name.raw.json" "$@"
  strip "$OUT/$name.raw.json" "$OUT/$name.json"
  rm -f "$OUT/$name.raw.json"
}
INSTANT='{"type":"solid-state","name":"instant","capacity_bytes":1099511627776,"parallel_units":1024,"chunk_bytes":0,"read_ns":0,"write_ns":0,"link_read_bytes_per_sec":0,"link_write_bytes_per_sec":0,"link_full_duplex":true,"flush_ns":0,"trim_ns":0}'
run vscsi-policies --trace "$T/cloudPhysicsIO.vscsi" --write-policy wt,wb,ordered,journaled --replacement lru --cache-size 64M
run vscsi-stack-hdd --trace "$T/cloudPhysicsIO.vscsi" --write-policy wb --replacement stack --cache-size 8M --backing hdd-hp97560
run vscsi-instant --trace "$T/cloudPhysicsIO.vscsi" --write-policy wb --replacement lru --cache-size 64M --qd 32 --backing "$INSTANT" --cache-device "$INSTANT" --backing-qd 1024
run vscsi-small-arc --trace "$T/cloudPhysicsIO.vscsi" --limit 40000 --write-policy all --replacement arc,lst --cache-size 1M --interval 0.5
run msrcut-fetch --trace "$T/msr.cut.per_10k.rw_40_60.1370.trace" --write-policy wb,journaled --replacement lru,arc --cache-size 256k,16M --fetch blocking,async,async-bg,lazy --patch-mem 1M
run msrcut-ssd --trace "$T/msr.cut.per_10k.rw_40_60.1370.trace" --write-policy all --replacement lru --cache-size 2M --backing ssd --cache-device pmem --qd 8
run msr-open --trace "$T/msr-cambridge1-sample.csv" --mode open --speedup 10 --write-policy wt,wb,ordered,journaled --cache-size 512k,8M --interval 0.01
run tencent-dev --trace "$T/cloud_storage-sample.bz2" --client-key dev --qd 4 --write-policy journaled,ordered --group-end write-flush --cache-size 4M --txn-blocks 64
run systor --trace "$T/systor17-traces-sample.csv.gz" --write-policy all --cache-size 1M,32M --backing hdd
echo "wrote $(ls "$OUT" | wc -l) result files to $OUT"
