#!/usr/bin/env bash
# The test command: installs what the tests need, builds, runs the VOPR and every test.
# Usage: scripts/test.sh          (CI calls it through .ci/run)
set -euo pipefail
cd "$(dirname "$0")/.."

# 1. Debian packages used by the integration tests (real NBD clients, fio, ext4
# tools, systemd-analyze for the unit file, python3-venv for the Ray sweep
# test). libssl-dev and pkg-config: the `tls` feature links the system
# OpenSSL; openssl: the TLS tests make their CA and certificates with its CLI.
pkgs="qemu-utils nbdkit libnbd-bin nbdfuse fio e2fsprogs fonts-dejavu-core systemd libssl-dev pkg-config openssl python3-venv"
missing=""
# nbdfuse is its own package on newer Debian, but only a name libnbd-bin
# provides on older ones (dpkg -s never finds it there): look for the program.
for p in $pkgs; do
  if [ "$p" = nbdfuse ]; then command -v nbdfuse >/dev/null && continue; fi
  dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "== installing:$missing"
  sudo_cmd=""
  [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq $missing
fi

# 2. A Rust toolchain.
if ! command -v cargo >/dev/null; then
  [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"
fi
command -v cargo >/dev/null || { echo "cargo not found: install Rust (rustup) first" >&2; exit 1; }

export NVWC_REQUIRE_TOOLS=1
export CARGO_TERM_COLOR=never
# Each step prints the seconds since the start, so a slow CI run shows where
# its time went.
step() { echo "== [${SECONDS} s] $*"; }
trap 'step "done (exit $?)"' EXIT

# 3. Build once in release; tests reuse the same artifacts.
step build
cargo build --release --workspace --all-targets --features nvwc/tls

# 4. Deterministic simulation testing (reduced; the acceptance run uses 20000 seeds).
step "vopr ${NVWC_VOPR_SEEDS:-3000} seeds"
"${CARGO_TARGET_DIR:-target}/release/nvwc" vopr --write-policy all --seeds "${NVWC_VOPR_SEEDS:-3000}"

# 4b. Short fuzz (cargo-fuzz installed if missing; NVWC_FUZZ_SECS=0 skips): the
# NBD handshake (with STARTTLS) and request parsers, and trace auto-detection (which reaches
# every reader). Every target's seeds and saved crashes are also replayed by
# `cargo test` (fuzz_regressions tests). Full runs: scripts/fuzz.sh 600.
if [ "${NVWC_FUZZ_SECS:-15}" != 0 ]; then
  step fuzz
  scripts/fuzz.sh "${NVWC_FUZZ_SECS:-15}" nbd_handshake nbd_starttls nbd_requests trace_detect
fi

# 4c. The Ray sweep driver against a local `nvwc sweep` (Ray from PyPI into
# target/ray-venv: ~285 MB and under a minute to install once, ~10 s to run;
# NVWC_RAY=0 skips).
step "ray sweep driver"
scripts/test-ray.sh

# 4d. Every paper reproduction builds, in quick mode (about 15 s; the full
# reports: scripts/repro-all.sh).
step "reports (quick)"
repro_out=$(mktemp -d)
scripts/repro-all.sh --quick --out "$repro_out"
# ... and each ends with its verdict table (the paper's number, ours, a verdict).
for r in admission write-policies non-blocking-writes stack-model; do
  grep -q '^| claim | paper | ours | verdict | cause |$' "$repro_out/$r.md" &&
    grep -Eq '^[0-9]+ claims: [0-9]+ reproduced, ' "$repro_out/$r.md" ||
    { echo "reports/$r.md: no verdict table" >&2; exit 1; }
done
# ... and the measured consistency grid has a row per policy, every promise kept.
[ "$(grep -c 'every promise held' "$repro_out/consistency-grid.md")" = 5 ] ||
  { cat "$repro_out/consistency-grid.md" >&2; echo "consistency grid: a promise failed" >&2; exit 1; }
rm -rf "$repro_out"
# ... and the mutation report's remap arithmetic (scripts/mutants-report.py).
python3 scripts/mutants-report.py selftest

# 5. Every test (last, so its summary closes the output).
step "cargo test"
cargo test --release --workspace --features nvwc/tls
