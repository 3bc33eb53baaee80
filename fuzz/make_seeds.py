#!/usr/bin/env python3
"""Writes the hand-made seed inputs of the fuzz targets to fuzz/seeds/<target>/.

Trace seeds: the reader test fixtures (good and bad) and small vSCSI v1/v2
and compact traces, each prefixed with the option-selector byte that
fuzz/src/trace.rs reads first. NBD seeds: valid handshakes (nbd_handshake)
request sequences after a selector byte (nbd_requests), and STARTTLS
sessions after a server selector byte (nbd_starttls), laid out as in the NBD
spec. Run from anywhere: python3 fuzz/make_seeds.py
"""
import gzip
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(HERE, "..", "crates", "nvwc-trace", "tests", "fixtures")
OUT = os.path.join(HERE, "seeds")


def put(target, name, data):
    d = os.path.join(OUT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def trace_seeds():
    files = {
        "msr": ["msr.csv", "msr_bad.csv"],
        "spc": ["spc.spc", "spc_bad.spc"],
        "blkparse": ["blkparse.txt", "blkparse_bad.txt"],
        "cloudphysics": ["cloudphysics.csv", "cloudphysics_bad.csv"],
        "tencent": ["tencent.csv", "tencent_bad.csv"],
        "systor17": ["systor17.csv", "systor17_bad.csv"],
        "heimdall": ["heimdall.trace", "heimdall_bad.trace"],
        "mobigen": ["mobigen.out.sample", "mobigen_bad.out"],
    }
    reqs = [(0x28, 4096, 100, 10), (0x2A, 8192, 200, 20), (0x35, 0, 0, 30),
            (0x12, 36, 0, 40), (0x2A, 512, 1 << 40, 35)]
    v1 = b"".join(struct.pack("<IIIHHQQ", i, l, 1, c, 0x0100, lbn, ts)
                  for i, (c, l, lbn, ts) in enumerate(reqs))
    v2 = b"".join(struct.pack("<HHIIIQQQ", c, 0x0200, i, l, 1, lbn, ts, 5)
                  for i, (c, l, lbn, ts) in enumerate(reqs))
    hdr = bytes([0x89]) + b"NVWC\r\n\x1a" + struct.pack("<HHHH", 1, 32, 32, 4) + bytes(16)
    recs = [(0, 0, 4096, 0, 0, 0, 1), (10, 4096, 8192, 1, 1, 2, 3),
            (20, 0, 0, 2, 0, 0, 0), (30, 1 << 20, 1 << 33, 3, 0, 1, 1)]
    compact = hdr + b"".join(
        struct.pack("<QQIBBHII", ts, off, ln & 0xFFFFFFFF, op, fl, ln >> 32, dev, st)
        for ts, off, ln, op, fl, dev, st in recs)
    every = {}
    for fmt, names in files.items():
        for n in names:
            with open(os.path.join(FIX, n), "rb") as f:
                every[(fmt, n)] = f.read()
    every[("vscsi1", "v1")] = v1
    every[("vscsi2", "v2")] = v2
    every[("compact", "compact")] = compact
    for (fmt, n), data in every.items():
        for sel in (0, 1, 6):  # selector: default, blkparse C, reorder window 16
            put("trace_" + fmt, f"{n}-{sel}", bytes([sel]) + data)
            put("trace_detect", f"{n}-{sel}", bytes([sel]) + data)
    put("trace_detect", "msr.csv.gz-0", b"\0" + gzip.compress(every[("msr", "msr.csv")]))


IHAVEOPT = 0x49484156454F5054
REQUEST_MAGIC = 0x25609513


def opt(code, data=b""):
    return struct.pack(">QII", IHAVEOPT, code, len(data)) + data


def go(name, code=7, infos=()):
    n = name.encode()
    return opt(code, struct.pack(">I", len(n)) + n + struct.pack(">H", len(infos))
               + b"".join(struct.pack(">H", i) for i in infos))


def meta(code, name, queries):
    n = name.encode()
    return opt(code, struct.pack(">I", len(n)) + n + struct.pack(">I", len(queries))
               + b"".join(struct.pack(">I", len(q)) + q.encode() for q in queries))


def req(cmd, off, ln, flags=0, cookie=1, payload=b""):
    return struct.pack(">IHHQQI", REQUEST_MAGIC, flags, cmd, cookie, off, ln) + payload


def nbd_seeds():
    flags = struct.pack(">I", 3)  # FIXED_NEWSTYLE | NO_ZEROES
    hs = {
        "go_rw": flags + go("rw", infos=(0, 1, 2, 3)),
        "list_info_go": flags + opt(3) + go("ro", 6, (3,)) + opt(8) + go("plain"),
        "meta": flags + opt(8) + meta(9, "rw", ["base:", "base:allocation"])
        + meta(10, "rw", ["base:allocation"]) + go("rw"),
        "export_name": flags + opt(1, b"rw"),
        "export_name_zeroes": struct.pack(">I", 1) + opt(1, b""),
        "abort": flags + opt(2),
        "unknown_then_go": flags + opt(99, b"xx") + opt(11) + opt(5) + go(""),
    }
    for k, v in hs.items():
        put("nbd_handshake", k, v)
    seqs = {
        "rw": req(1, 0, 4096, 0, 1, b"a" * 4096) + req(0, 0, 4096, 0, 2)
        + req(1, 8192, 512, 1, 3, b"b" * 512) + req(3, 0, 0, 0, 4) + req(4, 0, 4096, 0, 5)
        + req(6, 4096, 4096, 2, 6) + req(5, 0, 4096, 0, 7) + req(2, 0, 0, 0, 8),
        "block_status": req(7, 0, 65536, 0, 1) + req(7, 0, 4096, 1, 2)
        + req(0, 0, 8192, 4, 3) + req(2, 0, 0),
        "bad": req(0, 1 << 40, 4096) + req(9, 0, 0) + req(0, 0, 1 << 20)
        + req(1, 0, 1 << 20, 0, 2) + struct.pack(">I", 0xDEADBEEF),
    }
    # Selector: bit 0 structured, bit 1 meta context, bits 2-3 export.
    for k, v in seqs.items():
        for sel in (0, 1, 3, 7, 11, 15):
            put("nbd_requests", f"{k}-{sel}", bytes([sel]) + v)


def starttls_seeds():
    """nbd_starttls: a selector byte (bit 0 require, else on; bit 1 the TLS
    handshake fails), then the client side as for nbd_handshake."""
    flags = struct.pack(">I", 3)
    tls = opt(5)
    seqs = {
        "starttls_go": flags + tls + opt(8) + go("rw", infos=(0, 1, 2, 3)),
        "options_first": flags + opt(3) + go("ro", 6) + opt(8) + opt(99, b"x") + go("")
        + tls + opt(8) + opt(3) + tls + go("plain"),
        "export_name_before_tls": flags + opt(1, b"rw"),
        "export_name_after_tls": flags + tls + opt(1, b"rw"),
        "starttls_with_data": flags + opt(5, b"junk") + opt(2),
        "structured_then_tls": flags + opt(8) + meta(10, "rw", ["base:allocation"]) + tls
        + meta(10, "rw", ["base:allocation"]) + go("rw"),
        "abort_before_tls": flags + opt(2),
        "old_client_flags": struct.pack(">I", 2) + tls + go(""),
    }
    for k, v in seqs.items():
        for sel in (0, 1, 3):
            put("nbd_starttls", f"{k}-{sel}", bytes([sel]) + v)


if __name__ == "__main__":
    trace_seeds()
    nbd_seeds()
    starttls_seeds()
