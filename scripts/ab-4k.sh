#!/bin/bash
# One binary: 4 KiB random writes at QD128, reads at QD128, writes at QD1
# through NBD on a fresh `nacre up` (3 OSDs, a 2 GiB volume, 1 GiB
# prefilled), RUNTIME s each (default 15): IOPS, p50 and the CPU of every
# Nacre process per op.   scripts/ab-4k.sh target/release/nacre
# SPECS replaces the tests (RW:QD pairs, e.g. "randread:128 randread:1").
# WS sets the range the tests cover (default 1G); with up-volume.sh's
# OSD_SIZE, VOL_SIZE, PREFILL, the anchor suite's shape is
#   OSD_SIZE=10G VOL_SIZE=4G PREFILL=4G WS=4G scripts/ab-4k.sh BINARY
set -e
B=${1:?usage: scripts/ab-4k.sh NACRE_BINARY}; D=/tmp/ab
. "$(dirname "$0")/up-volume.sh"
ticks() { local t=0; for p in $UP $(pgrep -P $UP); do s=$(awk '{print $14+$15}' /proc/$p/stat); t=$((t+s)); done; echo $t; }
for spec in ${SPECS:-randwrite:128 randread:128 randwrite:1}; do
  IFS=: read RW QD <<< "$spec"
  c0=$(ticks)
  fio --name=w --ioengine=nbd --uri="$URI" --rw=$RW --bs=4k --iodepth=$QD --size="${WS:-1G}" --runtime=${RUNTIME:-15} --time_based --output-format=json > $D/fio.json
  c1=$(ticks)
  python3 - $c0 $c1 $D/fio.json $RW $QD <<'PY'
import json,sys,os
c0,c1=int(sys.argv[1]),int(sys.argv[2]); t=open(sys.argv[3]).read(); j=json.loads(t[t.index('{'):])['jobs'][0]
k='write' if 'write' in sys.argv[4] else 'read'; x=j[k]
hz=os.sysconf('SC_CLK_TCK'); ops=x['total_ios']; cpu=(c1-c0)/hz
print(f"  {sys.argv[4]:9} QD{sys.argv[5]:<3} {x['iops']:8.0f} IOPS  p50 {x['clat_ns']['percentile']['50.000000']/1000:7.1f} us  nacre CPU {cpu/ops*1e6:6.1f} us/op")
PY
done
