#!/usr/bin/env bash
# Runs nvwc's cargo-fuzz targets (fuzz/), each for a bounded time.
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#   default: 20 s for every target listed by `cargo fuzz list`:
#   nbd_handshake, nbd_requests, trace_<format> for every trace format, and
#   trace_detect (format auto-detection, reaching every reader).
# Needs cargo-fuzz (installed from crates.io if missing) and libFuzzer's
# nightly flags, enabled on a stable toolchain with RUSTC_BOOTSTRAP=1.
# Builds with AddressSanitizer unless FUZZ_SANITIZER=none. Seeds: fuzz/corpus/<target>
# (grows while fuzzing, not committed) and fuzz/regressions/<target> (saved
# crashes, committed; also replayed by `cargo test`). A crash stops the run
# with exit 1 and leaves the input in fuzz/artifacts/<target>/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-20}"
shift || true
export RUSTC_BOOTSTRAP=1
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
san=(--sanitizer "${FUZZ_SANITIZER:-address}")
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo fuzz list)
# Default cargo-fuzz profile: optimised, with debug assertions and overflow checks.
if [ $# -gt 0 ]; then
  for t in "${targets[@]}"; do cargo fuzz build "${san[@]}" "$t"; done
else
  cargo fuzz build "${san[@]}"
fi
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  seeds=()
  for s in seeds regressions; do [ -d "$s/$t" ] && seeds+=("$s/$t"); done
  echo "== fuzz $t for ${secs}s"
  rc=0
  cargo fuzz run "${san[@]}" "$t" "corpus/$t" "${seeds[@]}" -- \
    -max_total_time="$secs" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1 || rc=$?
  grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|Done)' "$log" || true
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz target $t FAILED (exit $rc)" >&2
    exit 1
  fi
done
