#!/bin/bash
# Profiles `nacre up` under fio through NBD: for each RW:BS:QD given (e.g.
# randwrite:4k:128), 25 s of fio with a system-wide `perf record` (499 Hz)
# over 15 s of it; prints IOPS and p50, leaves the top symbols and commands
# in /tmp/prof/top-*.txt and comm-*.txt.   B=target/release/nacre scripts/profile.sh randwrite:4k:128
set -e
B=${B:-target/release/nacre}; D=/tmp/prof
. "$(dirname "$0")/up-volume.sh"
for spec in "$@"; do
  IFS=: read RW BS QD <<< "$spec"
  fio --name=w --ioengine=nbd --uri="$URI" --rw=$RW --bs=$BS --iodepth=$QD --size=1G --runtime=25 --time_based --output-format=json > $D/fio-$RW-$BS-$QD.json &
  F=$!
  sleep 5
  perf record -a -F 499 -o $D/perf-$RW-$BS-$QD.data -- sleep 15 2> /dev/null
  wait $F
  python3 -c "
import json,sys; t=open('$D/fio-$RW-$BS-$QD.json').read(); j=json.loads(t[t.index('{'):])['jobs'][0]
k='write' if 'write' in '$RW' else 'read'; x=j[k]; print('$spec', round(x['iops']), 'IOPS, p50', x['clat_ns']['percentile']['50.000000']/1000, 'us')"
  perf report -i $D/perf-$RW-$BS-$QD.data --no-children --sort comm,symbol --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | head -40 > $D/top-$RW-$BS-$QD.txt
  perf report -i $D/perf-$RW-$BS-$QD.data --no-children --sort comm --stdio 2>/dev/null | grep -v "^#" | grep -v "^$" | head -12 > $D/comm-$RW-$BS-$QD.txt
done
