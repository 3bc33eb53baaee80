#!/usr/bin/env python3
"""What one client FLUSH costs the cache file's file system, without nvwc.

The device-level model behind inline log records (`--log-inline-bytes`,
docs/ON-DISK-FORMAT.md): each cycle writes one random 4 KiB data page of a
zero-filled file, then makes it durable in one of three ways:

  a  fdatasync                                    (a plain file: nbdkit file)
  b  a 4 KiB log page, then fdatasync             (nvwc's log commit)
  c  an 8 KiB RWF_DSYNC write: record + the data  (nvwc's inline log commit)
  d  as c, the record in a separate log file, made durable by its fdatasync
  e  an 8 KiB record carrying the data in a separate log file, no data page
     (the data lives only in the log: the lower bound of any log)

In c and d the data pages stay dirty in the page cache; every `--checkpoint`
cycles (default 256) an fdatasync of the data file writes them, as a
checkpoint must, inside the timed cycles. An untimed round of every mode
comes first; then rounds interleave the modes, the data file synced
(untimed) after each run. Medians are printed. `--mmap` maps the file
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
ap.add_argument("--checkpoint", type=int, default=256)
ap.add_argument("--modes", default="abcde")
a = ap.parse_args()

path = os.path.join(a.dir, "bench-sync-model.tmp")
log_path = os.path.join(a.dir, "bench-sync-model-log.tmp")
size = 768 << 20
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
lfd = os.open(log_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
try:
    for off in range(0, 16 << 20, 4096):
        os.pwrite(lfd, b"\0" * 4096, off)
    os.fdatasync(lfd)
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
        for i in range(a.cycles):
            if mode != "e":
                os.pwrite(fd, page, DATA + random.randrange(0, 1 << 16) * 4096)
            if mode == "a":
                os.fdatasync(fd)
            elif mode == "b":
                os.pwrite(fd, page, LOG + lp)
                lp = (lp + 4096) % (16 << 20)
                os.fdatasync(fd)
            elif mode == "c":
                os.pwritev(fd, [rec], LOG + lp, os.RWF_DSYNC)
                lp = (lp + 8192) % (16 << 20)
            else:
                os.pwrite(lfd, rec, lp)
                os.fdatasync(lfd)
                lp = (lp + 8192) % (16 << 20)
            if mode in "cd" and (i + 1) % a.checkpoint == 0:
                os.fdatasync(fd)
        return a.cycles / (time.perf_counter() - t)

    res = {k: [] for k in a.modes}
    for k in a.modes:  # one untimed round: the first cycles after the fill run far slower
        run(k)
        os.fdatasync(fd)
    for _ in range(a.rounds):
        for k in a.modes:
            res[k].append(run(k))
            os.fdatasync(fd)
    names = {"a": "data + fdatasync", "b": "data + log page + fdatasync", "c": "data + 8 KiB RWF_DSYNC record",
             "d": "data + 8 KiB record, log file", "e": "8 KiB record only, log file"}
    print(f"# scripts/bench-sync-model.py{' --mmap' if a.mmap else ''} --checkpoint {a.checkpoint}: cycles/s, {a.rounds} interleaved rounds of {a.cycles}")
    for k in a.modes:
        r = res[k]
        print(f"{k}  {names[k]:<30} median {statistics.median(r):7.0f}   rounds {' '.join(f'{x:.0f}' for x in r)}")
    if "a" in res:
        print("   ".join(f"{k}/a {statistics.median(res[k]) / statistics.median(res['a']):.2f}" for k in a.modes if k != "a"))
finally:
    os.close(fd)
    os.close(lfd)
    os.unlink(path)
    os.unlink(log_path)
