#!/usr/bin/env bash
# Engine benchmark: ops/s and RAM per cached block per write policy, and the
# ordered policy's dependency-graph edge counts with and without dummy nodes.
# Usage: scripts/bench-engine.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo bench -p nvwc-core --bench engine -- "$@"
