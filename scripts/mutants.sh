#!/usr/bin/env bash
# Mutation testing of the engine, the write policies and the on-disk layout
# (nvwc-core: src/engine.rs, src/engine/*.rs, src/write_policy/*.rs,
# src/layout.rs), with nvwc-core's tests and a short VOPR run of every policy
# (crates/nvwc-vopr/tests/smoke.rs) as the test command. Takes hours; not
# part of CI.
#
# Usage: scripts/mutants.sh [--shard K/N] [other cargo-mutants flags]
#   e.g. scripts/mutants.sh --shard 0/4   (a quarter of the mutants)
# Output: target/mutants/mutants.out/ (cargo-mutants' own), then
# reports/mutants.md (caught, missed, unviable, timeouts; every miss with its
# answer from reports/mutants-answers.md: the test that now catches it, or why
# it is equivalent).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-mutants >/dev/null || cargo install cargo-mutants --locked
out=${NVWC_MUTANTS_OUT:-target/mutants}
mkdir -p "$out"
status=0
cargo mutants \
  --profile mutants \
  -f 'crates/nvwc-core/src/engine.rs' \
  -f 'crates/nvwc-core/src/engine/*.rs' \
  -f 'crates/nvwc-core/src/write_policy/*.rs' \
  -f 'crates/nvwc-core/src/layout.rs' \
  --test-package nvwc-core --test-package nvwc-vopr \
  --timeout "${NVWC_MUTANTS_TIMEOUT:-300}" \
  --output "$out" \
  "$@" \
  -- -- --skip a_write_back_flush_contract_violation --skip a_request_never_answered \
  --skip a_log_record_accepted_without_its_data --skip an_in_place_rewrite_before_the_seal \
  || status=$?
# cargo-mutants exits 2 when mutants were missed, 3 on timeouts: the report says which.
python3 scripts/mutants-report.py "$out/mutants.out" reports/mutants-answers.md > reports/mutants.md
echo "reports/mutants.md written (cargo-mutants exit $status)"
