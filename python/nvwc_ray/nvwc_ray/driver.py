"""Ray driver for ``nvwc sweep``.

The sweep spec is expanded into cells by the ``nvwc`` binary itself
(``nvwc sweep --list``), so cell ids and configurations are exactly those of
a local ``nvwc sweep``. Each cell not yet complete becomes one Ray task
(``num_cpus=1``) that runs ``nvwc sweep --cell ID --threads 1`` in a private
temporary directory on the worker and returns the bytes of the cell's result
file through the object store. The driver writes them to ``OUT/cells/ID.json``
(temporary file, then rename: the same resumable layout as ``nvwc sweep``),
then runs ``nvwc sweep --summarize`` for the table and plots.

What workers need: the ``nvwc`` binary (``--nvwc``, same path on every node)
and the traces at the paths the spec names (relative paths resolve against
``--workdir``, default the driver's working directory), e.g. on shared
storage. The spec itself travels with each task.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time


def _nvwc_default():
    here = os.path.abspath(os.getcwd())
    for c in (os.path.join(here, "target", "release", "nvwc"), shutil.which("nvwc")):
        if c and os.path.exists(c):
            return c
    return "nvwc"


def list_cells(nvwc, spec, out):
    """The sweep's cells: dicts with ``id``, ``config`` and ``done``."""
    p = subprocess.run(
        [nvwc, "sweep", "--spec", spec, "--out", out, "--list"],
        check=True,
        capture_output=True,
        text=True,
    )
    return [json.loads(line) for line in p.stdout.splitlines() if line.strip()]


def run_cell(nvwc, spec_name, spec_text, cell_id, workdir):
    """Runs one cell with the nvwc binary; returns (id, file bytes or None, stderr)."""
    with tempfile.TemporaryDirectory(prefix="nvwc-ray-") as tmp:
        spec = os.path.join(tmp, spec_name)
        with open(spec, "w") as f:
            f.write(spec_text)
        out = os.path.join(tmp, "out")
        p = subprocess.run(
            [nvwc, "sweep", "--spec", spec, "--out", out, "--cell", cell_id,
             "--threads", "1", "--quiet"],
            cwd=workdir,
            capture_output=True,
            text=True,
        )
        path = os.path.join(out, "cells", cell_id + ".json")
        data = None
        if os.path.exists(path):
            with open(path, "rb") as f:
                data = f.read()
        return cell_id, data, p.stderr


def _write_atomic(path, data):
    tmp = "%s.%d.tmp" % (os.path.join(os.path.dirname(path), "." + os.path.basename(path)), os.getpid())
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def run_sweep(spec, out, nvwc=None, address=None, force=False, workdir=None,
              num_cpus=None, quiet=False):
    """Runs every incomplete cell of ``spec`` as a Ray task; returns the number
    of failed cells. ``address``: None starts a local Ray runtime
    (``ray.init()``), ``"auto"`` or ``"ray://host:10001"`` joins a cluster."""
    import ray

    nvwc = os.path.abspath(nvwc) if nvwc and os.path.sep in nvwc else (nvwc or _nvwc_default())
    workdir = os.path.abspath(workdir or os.getcwd())
    spec = os.path.abspath(spec)
    out = os.path.abspath(out)
    cells = list_cells(nvwc, spec, out)
    todo = [c for c in cells if force or not c["done"]]
    os.makedirs(os.path.join(out, "cells"), exist_ok=True)
    with open(spec) as f:
        spec_text = f.read()
    spec_name = os.path.basename(spec)
    if not quiet:
        print("nvwc-ray: %d cells, %d already complete, running %d"
              % (len(cells), len(cells) - len(todo), len(todo)), file=sys.stderr)
    if todo:
        if not ray.is_initialized():
            kw = {"address": address} if address else {}
            if num_cpus is not None and not address:
                kw["num_cpus"] = num_cpus
            ray.init(log_to_driver=False, **kw)
        task = ray.remote(num_cpus=1)(run_cell)
        pending = [task.remote(nvwc, spec_name, spec_text, c["id"], workdir) for c in todo]
        done = 0
        start = time.time()
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            cell_id, data, err = ray.get(ready[0])
            done += 1
            if data is None:
                # The binary could not even write a failed-cell file (e.g. it
                # is missing on the worker): record the failure like nvwc does.
                cfg = next(c["config"] for c in todo if c["id"] == cell_id)
                data = (json.dumps({"id": cell_id, "config": cfg, "status": "failed",
                                    "error": "ray task: " + err.strip()}, indent=2) + "\n").encode()
            _write_atomic(os.path.join(out, "cells", cell_id + ".json"), data)
            if not quiet:
                print("nvwc-ray: [%d/%d %.0fs] %s" % (done, len(todo), time.time() - start, cell_id),
                      file=sys.stderr)
    args = [nvwc, "sweep", "--spec", spec, "--out", out, "--summarize"]
    if quiet:
        args.append("--quiet")
    p = subprocess.run(args, cwd=workdir)
    failed = sum(1 for c in list_cells(nvwc, spec, out) if not c["done"])
    if p.returncode not in (0, 1):
        raise RuntimeError("nvwc sweep --summarize failed with status %d" % p.returncode)
    return failed


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="nvwc-ray",
        description="Run an nvwc sweep spec on Ray: one task per cell, the same OUT/cells/<id>.json files as `nvwc sweep`.")
    ap.add_argument("--spec", required=True, help="sweep spec (.toml or .json), as for `nvwc sweep --spec`")
    ap.add_argument("--out", required=True, help="output directory (resumable)")
    ap.add_argument("--nvwc", help="nvwc binary, same path on every worker (default: ./target/release/nvwc or PATH)")
    ap.add_argument("--address", help="Ray cluster address (auto, ray://head:10001); default: a local runtime")
    ap.add_argument("--workdir", help="working directory of the nvwc runs (relative trace paths); default: here")
    ap.add_argument("--num-cpus", type=int, help="CPUs of the local runtime (ignored with --address)")
    ap.add_argument("--force", action="store_true", help="re-run complete cells")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    failed = run_sweep(a.spec, a.out, nvwc=a.nvwc, address=a.address, force=a.force,
                       workdir=a.workdir, num_cpus=a.num_cpus, quiet=a.quiet)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
