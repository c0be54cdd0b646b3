#!/bin/bash
# One binary: 4 KiB random writes at QD128, reads at QD128, writes at QD1
# through NBD on a fresh `nacre up` (3 OSDs, a 2 GiB volume, 1 GiB
# prefilled), RUNTIME s each (default 15): IOPS, p50 and the CPU of every
# Nacre process per op.   scripts/ab-4k.sh target/release/nacre
# SPECS replaces the tests (RW:QD pairs, e.g. "randread:128 randread:1").
# WS sets the range the tests cover (default 1G); with up-volume.sh's
# OSD_SIZE, VOL_SIZE, PREFILL, the anchor suite's shape is
#   OSD_SIZE=10G VOL_SIZE=4G PREFILL=4G WS=4G scripts/ab-4k.sh BINARY
# SPLIT=1 adds, per test, each process's user and system CPU per op
# (`nacre up` — the gateway and meta store — and each OSD).
set -e
B=${1:?usage: scripts/ab-4k.sh NACRE_BINARY}; D=/tmp/ab
. "$(dirname "$0")/up-volume.sh"
# Each process's pid:user:system ticks.
ticks() { for p in $UP $(pgrep -P $UP); do awk -v p=$p '{printf "%s:%s:%s ", p, $14, $15}' /proc/$p/stat; done; }
for spec in ${SPECS:-randwrite:128 randread:128 randwrite:1}; do
  IFS=: read RW QD <<< "$spec"
  c0=$(ticks)
  fio --name=w --ioengine=nbd --uri="$URI" --rw=$RW --bs=4k --iodepth=$QD --size="${WS:-1G}" --runtime=${RUNTIME:-15} --time_based --output-format=json > $D/fio.json
  c1=$(ticks)
  python3 - "$c0" "$c1" $D/fio.json $RW $QD "${SPLIT:-}" $UP <<'PY'
import json,sys,os
def snap(s): return {p: (int(u), int(k)) for p, u, k in (x.split(':') for x in s.split())}
c0,c1=snap(sys.argv[1]),snap(sys.argv[2]); t=open(sys.argv[3]).read(); j=json.loads(t[t.index('{'):])['jobs'][0]
k='write' if 'write' in sys.argv[4] else 'read'; x=j[k]
hz=os.sysconf('SC_CLK_TCK'); ops=x['total_ios']
used={p: (c1[p][0]-c0[p][0], c1[p][1]-c0[p][1]) for p in c1 if p in c0}
cpu=sum(u+s for u,s in used.values())/hz
print(f"  {sys.argv[4]:9} QD{sys.argv[5]:<3} {x['iops']:8.0f} IOPS  p50 {x['clat_ns']['percentile']['50.000000']/1000:7.1f} us  nacre CPU {cpu/ops*1e6:6.1f} us/op")
if sys.argv[6]:
    for p,(u,s) in used.items():
        who='nacre up' if p==sys.argv[7] else f'osd pid {p}'
        print(f"    {who:14} user {u/hz/ops*1e6:6.1f} us/op  sys {s/hz/ops*1e6:6.1f} us/op")
PY
done
