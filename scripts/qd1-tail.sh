#!/bin/bash
# The tail of QD1 replicated writes: a fresh `nacre up` (3 OSDs of 10 GiB, a
# 4 GiB volume written whole first, as the anchor suite does), then 4 KiB
# random writes at QD1 over the volume for SECONDS (default 20) with fio's
# per-op latency log; prints IOPS, p50/p99/p99.9, how many writes took over
# 10 ms, and the slowest.
#   B=target/release/nacre scripts/qd1-tail.sh [SECONDS]
set -euo pipefail
B=${B:-target/release/nacre}
SECS=${1:-20}
D=${D:-/var/tmp/nacre-qd1-tail}
export OSD_SIZE=${OSD_SIZE:-10G} VOL_SIZE=${VOL_SIZE:-4G} PREFILL=${PREFILL:-4G}
# shellcheck source=up-volume.sh
. "$(dirname "$0")/up-volume.sh"
fio --name=tail --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --iodepth=1 \
  --size="$VOL_SIZE" --time_based --runtime="$SECS" \
  --write_lat_log="$D/lat" --log_avg_msec=0 >/dev/null
python3 - "$D/lat_lat.1.log" "$SECS" <<'PY'
import sys
v = sorted(int(l.split(',')[1]) for l in open(sys.argv[1]))  # ns per write
n, secs = len(v), float(sys.argv[2])
q = lambda p: v[min(n - 1, int(n * p))] / 1000
print(f"{n / secs:.0f} IOPS  p50 {q(.5):.0f} us  p99 {q(.99):.0f} us  p99.9 {q(.999):.0f} us"
      f"  over 10 ms: {sum(x > 10e6 for x in v)} of {n}  slowest {v[-1] / 1e6:.1f} ms")
PY
