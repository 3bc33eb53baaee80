#!/usr/bin/env bash
# The Ray driver's test: a venv under target/ (Ray from PyPI, ~285 MB, ~1 min
# to install), the nvwc_ray package, then python/nvwc_ray/tests on a local
# single-node Ray runtime: the per-cell files of the Ray run must equal those
# of a local `nvwc sweep` of the same spec (except wall-clock fields).
# Usage: scripts/test-ray.sh   (needs target/release/nvwc; NVWC_RAY=0 skips)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${NVWC_RAY:-1}" = 0 ] && { echo "== NVWC_RAY=0: Ray driver test skipped"; exit 0; }
T="$(realpath -m "${CARGO_TARGET_DIR:-target}")"
VENV="$T/ray-venv"
RAY_VERSION="${NVWC_RAY_VERSION:-2.60.0}"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/python" -c "import ray, sys; sys.exit(ray.__version__ != '$RAY_VERSION')" 2>/dev/null \
  || "$VENV/bin/pip" install -q "ray==$RAY_VERSION"
"$VENV/bin/pip" install -q --no-deps --force-reinstall ./python/nvwc_ray
export NVWC="${NVWC:-$T/release/nvwc}"
# Run from a scratch directory so that `import nvwc_ray` is the installed package.
cd "$(mktemp -d)"
"$VENV/bin/python" -m unittest discover -s "$OLDPWD/python/nvwc_ray/tests" -v
