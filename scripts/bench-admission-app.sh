#!/usr/bin/env bash
# Live admission benchmark with a real database (the request-oriented
# admission paper's setting): PostgreSQL with pg_wal on its own ext4 inside
# ONE nvwc export (its first WAL_SIZE bytes, covered by --wal-range), the
# data directory on a second ext4 after it, a small cache, and an upstream
# slowed by nbdkit's delay filter. Per admission policy (all, sync, wal) the
# export is nvwc write-back with --admission <policy>; the uncached delayed
# backing runs beside them. Reports tps, p99 and p99.9 latency, and the
# megabytes written to the cache and bypassed, medians of interleaved rounds:
# reports/bench-admission-app.{md,json}.
#
# It is scripts/bench-app.sh with LAYOUT=wal-split; every knob of that
# script applies (RUNTIME, REPS, DELAYS, SCALE, CLIENTS, JOBS, IMAGE_SIZE).
# Usage: scripts/bench-admission-app.sh          (root: loop devices, mount, FUSE)
#   CACHE_SIZE=64M   the cache (small, so admission matters)
#   WAL_SIZE=512M    pg_wal's file system at the start of the export
#   ADMISSIONS="all sync wal"
# Smoke test (about 5 min): RUNTIME=3 REPS=1 scripts/bench-admission-app.sh
set -euo pipefail
cd "$(dirname "$0")/.."
export LAYOUT=wal-split
export CACHE_SIZE=${CACHE_SIZE:-64M}
export WAL_SIZE=${WAL_SIZE:-512M}
export ADMISSIONS=${ADMISSIONS:-all sync wal}
export BENCH_ONLY=${BENCH_ONLY:-uncached/* nvwc-adm-*}
export OUT=${OUT:-reports/bench-admission-app}
export SCRIPT_NAME=scripts/bench-admission-app.sh
exec scripts/bench-app.sh
