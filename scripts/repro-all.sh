#!/usr/bin/env bash
# Regenerate every paper reproduction under reports/ (each report's prose is
# its template in reports/templates/, filled from the runs), and the measured
# consistency grid (reports/consistency-grid.md).
# Usage: scripts/repro-all.sh [--quick] [--out DIR]
#   --quick   smaller runs (what CI checks: every report builds)
#   --out DIR write the reports there instead of reports/
# Traces: $NVWC_TRACES, else ../shared/traces (see nvwc repro --help).
set -euo pipefail
cd "$(dirname "$0")/.."
args=()
out=reports
grid_trials=10
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) args+=(--quick); grid_trials=1; shift ;;
    --out) args+=(--out "$2"); out=$2; shift 2 ;;
    *) echo "unknown argument $1 (--quick, --out DIR)" >&2; exit 2 ;;
  esac
done
[ -n "${NVWC_TRACES:-}" ] && args+=(--traces "$NVWC_TRACES")
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
cargo build --release -q -p nvwc
NVWC="$CARGO_TARGET_DIR/release/nvwc"
start=$(date +%s)
run() { echo "== nvwc repro $*"; "$NVWC" repro "$@" "${args[@]}"; }
run stack-model
run write-policies
run non-blocking-writes
# Admission: the postgres run first; the redis run adds Figure 9 and Table 4
# and rewrites reports/admission.md from both apps' kept results.
run admission --app postgres
run admission --app redis
# The consistency grid (the write-policy paper's Figure 10): the live server,
# crashed and checked, per write policy and failure mode.
echo "== nvwc grid --trials $grid_trials"
"$NVWC" grid --trials "$grid_trials" --markdown "$out/consistency-grid.md"
echo "== every report regenerated in $(( $(date +%s) - start )) s"
