#!/usr/bin/env bash
# Load test of `nvwc serve`: 64 concurrent NBD clients with mixed request
# sizes (512 B .. 1 MiB; reads, writes with some FUA, flushes, trims), every
# read verified, for a bounded time; reports ops/s, p50/p99/p99.9 latency per
# operation, errors, and the server's RSS over time (first/mid/last/max).
# Usage: scripts/load-test.sh [DURATION] [WRITE_POLICY] [extra `nvwc loadtest` flags...]
#   DURATION: 300s (default), 20s, 5m ...   WRITE_POLICY: write-back (default),
#   ordered, journaled, journaled-hints, write-through.
# Env: NVWC_BIN (default: ${CARGO_TARGET_DIR:-target}/release/nvwc, built if missing),
#      LOAD_SIZE (backing size, default 2G), LOAD_CACHE (cache size, default 512M),
#      LOAD_CLIENTS (default 64), LOAD_SERVE_FLAGS (more `nvwc serve` flags),
#      STOP_TIMEOUT (seconds the server gets to exit after SIGTERM, default 60).
# The server listens on a unix socket in a temporary directory only; the
# directory is removed at the end. Exit status: that of `nvwc loadtest`
# (non-zero on any error or verification failure).
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-300s}"
policy="${2:-write-back}"
shift $(( $# < 2 ? $# : 2 ))
bin="${NVWC_BIN:-${CARGO_TARGET_DIR:-target}/release/nvwc}"
[ -x "$bin" ] || cargo build --release -p nvwc
bin="$(realpath "$bin")"
dir="$(mktemp -d "${TMPDIR:-/tmp}/nvwc-load.XXXXXX")"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
(cd "$dir" && exec "$bin" serve --listen none --size "${LOAD_SIZE:-2G}" \
  --cache-size "${LOAD_CACHE:-512M}" --write-policy "$policy" \
  --log-level warn ${LOAD_SERVE_FLAGS:-} >"$dir/server.log" 2>&1) &
server_pid=$!
for _ in $(seq 200); do [ -S "$dir/nvwc-data/nvwc.sock" ] && break; sleep 0.1; done
[ -S "$dir/nvwc-data/nvwc.sock" ] || { cat "$dir/server.log" >&2; echo "server did not start" >&2; exit 1; }
echo "== nvwc serve ($policy, pid $server_pid) under ${LOAD_CLIENTS:-64} clients for $duration"
rc=0
"$bin" loadtest --uri "nbd+unix:///?socket=$dir/nvwc-data/nvwc.sock" \
  --clients "${LOAD_CLIENTS:-64}" --duration "$duration" --server-pid "$server_pid" "$@" || rc=$?
kill -0 "$server_pid" 2>/dev/null || { echo "server died during the load test" >&2; cat "$dir/server.log" >&2; rc=1; }
# Graceful stop (SIGTERM: in-flight requests finish, metadata is committed),
# bounded: a server that does not exit in STOP_TIMEOUT seconds fails the test.
if kill -0 "$server_pid" 2>/dev/null; then
  kill -TERM "$server_pid"
  t0=$(date +%s)
  while kill -0 "$server_pid" 2>/dev/null && [ $(( $(date +%s) - t0 )) -lt "${STOP_TIMEOUT:-60}" ]; do sleep 0.2; done
  if kill -0 "$server_pid" 2>/dev/null; then
    echo "server did not exit within ${STOP_TIMEOUT:-60} s of SIGTERM: killed" >&2
    kill -KILL "$server_pid"; rc=1
  else
    echo "server stopped $(( $(date +%s) - t0 )) s after SIGTERM"
  fi
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
fi
if grep -iE "error|panic" "$dir/server.log" >&2; then echo "server logged errors" >&2; rc=1; fi
exit "$rc"
