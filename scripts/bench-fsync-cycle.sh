#!/usr/bin/env bash
# What one client FLUSH costs at the device: fio 4 KiB randwrite QD1
# --fsync=1 for 8 s against nbdkit file and nvwc write-back (inline log
# records off, and on at 64 KiB), each on a fresh 1 GiB backing file whose
# first 256 MiB are written (as scripts/bench-nbd.sh's fsync rows). During
# seconds 3-5 `perf record -e block:block_rq_issue -a` counts the requests
# the block layer issues (per device FLUSH: data writes WS, file-system
# metadata WSM), and `perf trace` times the server's pwrite64, pread64,
# pwritev2 and fdatasync calls (per fdatasync, with their medians).
# Needs root, perf (Debian: linux-perf), fio, nbdkit. Run on a quiet
# machine; ROUNDS="1 2" (default) interleaves the servers.
# Usage: scripts/bench-fsync-cycle.sh      (output: one block per server and round)
set -uo pipefail
cd "$(dirname "$0")/.."
for t in perf fio nbdkit python3; do command -v $t >/dev/null || { echo "missing $t" >&2; exit 2; }; done
cargo build --release -q -p nvwc
N=$(realpath "${CARGO_TARGET_DIR:-target}/release/nvwc")
D=$(mktemp -d /tmp/nvwc-fsync-cycle.XXXXXX)
trap 'rm -rf "$D"' EXIT
one() { # name cmd...
  rm -rf $D/run; mkdir -p $D/run; cd $D/run
  truncate -s 1G backing.img; dd if=/dev/zero of=backing.img bs=1M count=256 conv=notrunc,fsync status=none
  python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' backing.img
  local name=$1; shift
  "$@" > srv.log 2>&1 &
  local SP=$!
  for i in $(seq 100); do [ -S n.sock ] && break; sleep 0.1; done
  sleep 1; sync
  fio --name=b --ioengine=nbd --uri="nbd+unix:///?socket=$D/run/n.sock" --size=256M --rw=randwrite --bs=4k --iodepth=1 --fsync=1 --time_based --runtime=8 --output-format=json > fio.json 2>/dev/null &
  local FP=$!
  sleep 3
  perf record -e block:block_rq_issue -a -o $D/$name.blk -- sleep 2 > /dev/null 2>&1
  timeout 2 perf trace -p $SP -e pwrite64,pread64,fdatasync,pwritev2 -o $D/$name.trace > /dev/null 2>&1
  wait $FP
  kill $SP; wait 2>/dev/null
  python3 - $name $D <<'PY'
import json,re,sys,collections
name,D=sys.argv[1],sys.argv[2]
t=open(f'{D}/run/fio.json').read(); j=json.loads(t[t.index('{'):])['jobs'][0]
iops=j['write']['iops']
import subprocess
out=subprocess.run(['perf','script','-i',f'{D}/{name}.blk'],capture_output=True,text=True).stdout
c=collections.Counter(); by=collections.Counter()
for l in out.splitlines():
    m=re.match(r'\s*(\S.*?)\s+\d+\s+\[\d+\]\s+[0-9.]+:\s+block:block_rq_issue: \S+ (\S+) (\d+)',l)
    if not m: continue
    comm,rwbs,size=m.groups()
    c[rwbs]+=1; by[(comm.split('/')[0][:12],rwbs)]+=1
fl=c.get('FF',0) or 1
print(f"{name:12s} iops {iops:7.0f} | per FF: " + ' '.join(f"{k}={v/fl:.2f}" for k,v in sorted(c.items())))
print('   by issuer: ' + ', '.join(f"{a}:{b}={v}" for (a,b),v in by.most_common(8)))
d=collections.defaultdict(list)
for l in open(f'{D}/{name}.trace'):
    m=re.search(r'\(\s*([0-9.]+) ms\):\s*\S+\s+(\w+)\((.*)\)\s*=',l)
    if not m: continue
    dur,call,args=float(m.group(1)),m.group(2),m.group(3)
    cnt=re.search(r'count: (\d+)',args)
    d[call+(' '+cnt.group(1) if cnt else '')].append(dur*1000)
fs=len(d.get('fdatasync',[])) or 1
print('   syscalls: ' + ', '.join(f"{k} {len(v)/fs:.2f}/sync p50 {sorted(v)[len(v)//2]:.0f}us" for k,v in sorted(d.items())))
PY
}
for r in ${ROUNDS:-1 2}; do
  echo "# round $r"
  one nbdkit nbdkit -U n.sock -f file backing.img
  one nvwc-off $N serve --cache cache.img --cache-size 768M --listen none --unix n.sock --backing backing.img --write-policy write-back
  one nvwc-inline $N serve --cache cache.img --cache-size 768M --listen none --unix n.sock --backing backing.img --write-policy write-back --log-inline-bytes 65536
done
