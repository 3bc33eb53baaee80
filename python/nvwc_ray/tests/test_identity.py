"""The Ray driver's per-cell files equal those of a local `nvwc sweep` of the
same spec, byte for byte except the wall-clock fields (wall_seconds,
replay_rate). Runs on a local single-node Ray runtime (ray.init()).

Environment: NVWC (the nvwc binary; default target/release/nvwc from the
repository root), NVWC_TRACES (default ../shared/traces beside the
repository). Without the traces the test skips, except under CI (CI=true or
NVWC_REQUIRE_TOOLS=1), where it fails.
"""

import json
import os
import subprocess
import tempfile
import unittest

from nvwc_ray import run_sweep

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
NVWC = os.environ.get("NVWC") or os.path.join(
    os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")), "release", "nvwc")
TRACES = os.environ.get("NVWC_TRACES") or os.path.join(ROOT, "..", "shared", "traces")
STRICT = os.environ.get("NVWC_REQUIRE_TOOLS") == "1" or os.environ.get("CI") in ("true", "1")
WALL = (b'"wall_seconds":', b'"replay_rate":')


def without_wall(data):
    return b"\n".join(l for l in data.split(b"\n") if not l.strip().startswith(WALL))


def cell_files(out):
    d = os.path.join(out, "cells")
    files = {}
    for n in sorted(os.listdir(d)):
        if n.endswith(".json") and not n.startswith("."):
            with open(os.path.join(d, n), "rb") as f:
                files[n] = f.read()
    return files


class RayMatchesLocal(unittest.TestCase):
    def test_same_cells_as_local_sweep(self):
        traces = [os.path.join(TRACES, n) for n in
                  ("cloudPhysicsIO.vscsi", "msr.cut.per_10k.rw_40_60.1370.trace",
                   "msr-cambridge1-sample.csv")]
        if not all(os.path.exists(t) for t in traces):
            if STRICT:
                self.fail("traces not found in %s (required under CI)" % TRACES)
            self.skipTest("traces not found in %s" % TRACES)
        self.assertTrue(os.path.exists(NVWC), NVWC)
        with tempfile.TemporaryDirectory(prefix="nvwc-ray-test-") as tmp:
            spec = os.path.join(tmp, "spec.json")
            with open(spec, "w") as f:
                json.dump({"traces": traces + [os.path.join(TRACES, "missing.trace")],
                           "write_policies": ["wt", "wb", "ordered", "journaled"],
                           "cache_sizes": ["256k", "4M"],
                           "limit": 2000}, f)
            local, ray_out = os.path.join(tmp, "local"), os.path.join(tmp, "ray")
            p = subprocess.run([NVWC, "sweep", "--quiet", "--spec", spec, "--out", local])
            # The missing trace's 8 cells fail in both runs: status 1.
            self.assertEqual(p.returncode, 1)
            failed = run_sweep(spec, ray_out, nvwc=NVWC, num_cpus=2, quiet=True)
            self.assertEqual(failed, 8)
            a, b = cell_files(local), cell_files(ray_out)
            self.assertEqual(len(a), 32)
            self.assertEqual(sorted(a), sorted(b))
            for n in a:
                self.assertEqual(without_wall(a[n]), without_wall(b[n]), n)
            ok = [n for n in a if json.loads(a[n])["status"] == "ok"]
            self.assertEqual(len(ok), 24)
            # Both wrote a summary; a second Ray run has nothing left but the failures.
            self.assertTrue(os.path.exists(os.path.join(ray_out, "summary.md")))
            before = cell_files(ray_out)
            self.assertEqual(run_sweep(spec, ray_out, nvwc=NVWC, num_cpus=2, quiet=True), 8)
            after = cell_files(ray_out)
            for n in ok:
                self.assertEqual(before[n], after[n], n)


if __name__ == "__main__":
    unittest.main()
