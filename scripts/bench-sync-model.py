#!/usr/bin/env python3
"""What one client FLUSH costs the cache file's file system, without nvwc.

The device-level model behind inline log records (`--log-inline-bytes`,
docs/ON-DISK-FORMAT.md): each cycle writes one random 4 KiB data page of a
zero-filled file, then makes it durable in one of three ways:

  a  fdatasync                                    (a plain file: nbdkit file)
  b  a 4 KiB log page, then fdatasync             (nvwc's log commit)
  c  an 8 KiB RWF_DSYNC write: record + the data  (nvwc's inline log commit)

Rounds interleave a, b, c; medians are printed. `--mmap` maps the file
shared first, as nvwc maps its cache file. Usage:
  scripts/bench-sync-model.py [--mmap] [--dir DIR] [--rounds N] [--cycles N]
DIR must be on the file system under test (default: the current directory).
"""
import argparse, mmap, os, random, statistics, time

ap = argparse.ArgumentParser()
ap.add_argument("--mmap", action="store_true")
ap.add_argument("--dir", default=".")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--cycles", type=int, default=800)
a = ap.parse_args()

path = os.path.join(a.dir, "bench-sync-model.tmp")
size = 768 << 20
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
try:
    zero = b"\0" * 4096
    for off in range(0, size, 4096):  # plain blocks, written once, 4 KiB at a time
        os.pwrite(fd, zero, off)
    os.fdatasync(fd)
    m = None
    if a.mmap:
        m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        m.madvise(mmap.MADV_RANDOM)
    page, rec = os.urandom(4096), os.urandom(8192)
    LOG, DATA = 32 << 20, 64 << 20

    def run(mode):
        t, lp = time.perf_counter(), 0
        for _ in range(a.cycles):
            os.pwrite(fd, page, DATA + random.randrange(0, 1 << 16) * 4096)
            if mode == "a":
                os.fdatasync(fd)
            elif mode == "b":
                os.pwrite(fd, page, LOG + lp)
                lp = (lp + 4096) % (16 << 20)
                os.fdatasync(fd)
            else:
                os.pwritev(fd, [rec], LOG + lp, os.RWF_DSYNC)
                lp = (lp + 8192) % (16 << 20)
        return a.cycles / (time.perf_counter() - t)

    res = {k: [] for k in "abc"}
    for _ in range(a.rounds):
        for k in "abc":
            res[k].append(run(k))
    names = {"a": "data + fdatasync", "b": "data + log page + fdatasync", "c": "data + 8 KiB RWF_DSYNC record"}
    print(f"# scripts/bench-sync-model.py{' --mmap' if a.mmap else ''}: cycles/s, {a.rounds} interleaved rounds of {a.cycles}")
    for k in "abc":
        r = res[k]
        print(f"{k}  {names[k]:<30} median {statistics.median(r):7.0f}   rounds {' '.join(f'{x:.0f}' for x in r)}")
    print(f"b/a {statistics.median(res['b']) / statistics.median(res['a']):.2f}   c/a {statistics.median(res['c']) / statistics.median(res['a']):.2f}   c/b {statistics.median(res['c']) / statistics.median(res['b']):.2f}")
finally:
    os.close(fd)
    os.unlink(path)
