#!/bin/bash
# CPU per replicated 4 KiB random write at QD128 through NBD, counting every
# Nacre process (the `nacre up` process and its OSD children; fio excluded):
# a 3-OSD cluster in /tmp/cpu, a 2 GiB volume, 1 GiB prefilled, RUNTIME s
# (default 20) of fio, CPU from /proc/PID/stat before and after.
#   B=target/release/nacre scripts/cpu-per-write.sh
set -e
B=${B:-target/release/nacre}; D=/tmp/cpu; rm -rf $D; mkdir -p $D
$B up --dir $D/c --osd-size 4G --nbd unix:$D/nbd.sock > $D/up.log 2>&1 &
UP=$!
for i in $(seq 60); do [ -S $D/nbd.sock ] && $B status --dir $D/c >/dev/null 2>&1 && break; sleep 1; done
$B volume create v --size 2G --dir $D/c >/dev/null
URI="nbd+unix:///v?socket=$D/nbd.sock"
fio --name=pre --ioengine=nbd --uri="$URI" --rw=write --bs=4M --iodepth=8 --size=1G >/dev/null
ticks() { local t=0; for p in $UP $(pgrep -P $UP); do s=$(awk '{print $14+$15}' /proc/$p/stat); t=$((t+s)); done; echo $t; }
c0=$(ticks)
fio --name=w --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --iodepth=128 --size=1G --runtime=${RUNTIME:-20} --time_based --output-format=json > $D/fio.json
c1=$(ticks)
python3 - $c0 $c1 $D/fio.json <<'PY'
import json,sys,os
c0,c1=int(sys.argv[1]),int(sys.argv[2]); t=open(sys.argv[3]).read(); j=json.loads(t[t.index('{'):])['jobs'][0]['write']
hz=os.sysconf('SC_CLK_TCK'); ops=j['total_ios']; cpu=(c1-c0)/hz
print(f"{ops} writes, {j['iops']:.0f} IOPS, nacre CPU {cpu:.1f} s: {cpu/ops*1e6:.1f} us per write")
PY
kill $UP; wait $UP 2>/dev/null || true
