#!/usr/bin/env bash
# Mutation testing of the engine, the write policies and the on-disk layout
# (nvwc-core: src/engine.rs, src/engine/*.rs, src/write_policy/*.rs,
# src/layout.rs), with nvwc-core's tests and a short VOPR run of every policy
# (crates/nvwc-vopr/tests/smoke.rs) as the test command. Takes hours; not
# part of CI. The VOPR's planted-mutation tests (tests/mutation.rs, every
# name ending `_fails_the_run`) are skipped: they check that the VOPR
# catches mutations of their own, and a source mutant changes nothing they
# test but their time.
#
# Usage: scripts/mutants.sh [--shard K/N] [other cargo-mutants flags]
#   e.g. scripts/mutants.sh --shard 0/4   (a quarter of the mutants)
#   or   scripts/mutants.sh -F 'Layout::' --iterate   (names matching a regex;
#        --iterate skips mutants caught by an earlier run into the same output)
# Output: $NVWC_MUTANTS_OUT/mutants.out/ (cargo-mutants' own, default
# target/mutants), recorded as reports/mutants-data/$NVWC_MUTANTS_NAME.tsv
# (default full-<date>; the raw output is lost with the machine, the record
# is committed), then reports/mutants.md from every record (caught, missed,
# unviable, timeouts, untested per file; every miss with its answer from
# reports/mutants-answers.md: the test that now catches it, or why it is
# equivalent). reports/mutants-data/list.txt is refreshed first (every
# mutant of these files, for the untested counts), and a remap record
# carries earlier outcomes through functions that have not changed.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
out=${NVWC_MUTANTS_OUT:-target/mutants}
mkdir -p "$out"
status=0
files=(
  -f 'crates/nvwc-core/src/engine.rs'
  -f 'crates/nvwc-core/src/engine/*.rs'
  -f 'crates/nvwc-core/src/write_policy/*.rs'
  -f 'crates/nvwc-core/src/layout.rs'
)
mkdir -p reports/mutants-data
cargo mutants --list --json "${files[@]}" > "$out/list.json"
python3 -c 'import json, sys; print("\n".join(m["name"] for m in json.load(open(sys.argv[1]))))' \
  "$out/list.json" > reports/mutants-data/list.txt
# Outcomes of recorded mutants whose lines moved, in functions unchanged since
# their run, carry over to their names now (see mutants-report.py remap).
python3 scripts/mutants-report.py remap "remap-$(git rev-parse --short HEAD)" "$out/list.json"
cargo mutants \
  --profile mutants \
  "${files[@]}" \
  --test-package nvwc-core --test-package nvwc-vopr \
  --timeout "${NVWC_MUTANTS_TIMEOUT:-300}" \
  --output "$out" \
  "$@" \
  -- -- --skip _fails_the_run \
  || status=$?
# cargo-mutants exits 2 when mutants were missed, 3 on timeouts: the report says which.
python3 scripts/mutants-report.py record "${NVWC_MUTANTS_NAME:-full-$(date -u +%Y%m%d-%H%M)}" "$out/mutants.out" \
  --note "scripts/mutants.sh $*"
python3 scripts/mutants-report.py reports/mutants-answers.md > reports/mutants.md
echo "reports/mutants.md written (cargo-mutants exit $status)"
