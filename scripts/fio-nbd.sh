#!/usr/bin/env bash
# The standard suite issued by fio's nbd engine to an NBD export, for side
# by side runs with ../shared/anchors/ceph (which runs the same patterns
# through fio's rbd engine). CPU per op counts fio and, if PID is given,
# that process too (the `nacre up` serving the export).
# Usage: scripts/fio-nbd.sh URI [SIZE=1G] [RUNTIME_S=10] [PID]
set -euo pipefail
uri=${1:?usage: fio-nbd.sh URI [SIZE] [RUNTIME_S] [PID]}
size=${2:-1G}
runtime=${3:-10}
pid=${4:-}
command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio >/dev/null; }
cpu_s() { # user+system seconds of $pid, 0 without one
    [ -n "$pid" ] || { echo 0; return; }
    awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$pid/stat"
}
run() { # name, fio args...
    local name=$1; shift
    local c0 c1
    c0=$(cpu_s)
    fio --name="$name" --ioengine=nbd --uri="$uri" --size="$size" --time_based --runtime="$runtime" \
        --output-format=json "$@" | sed -n "/^{/,\$p" > /tmp/fio-nbd.$$.json
    c1=$(cpu_s)
    python3 - "$name" "$c0" "$c1" /tmp/fio-nbd.$$.json <<'PY'
import json, sys
name, c0, c1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
j = json.load(open(sys.argv[4]))["jobs"][0]
side = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
ops = max(side["total_ios"], 1)
# At QD1 with fsync the time per op is runtime / ops (fio keeps the flush
# out of its latencies); otherwise fio's total latency.
qd1w = name == "randwrite-4k-qd1"
mean_us = j["job_runtime"] * 1000.0 / ops if qd1w else side["lat_ns"]["mean"] / 1000.0
pct = side["clat_ns"].get("percentile", {})
p = lambda k: pct.get(k, 0) / 1000.0
fio_cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * j["job_runtime"] / 1000.0
cpu = (fio_cpu + (c1 - c0)) * 1e6 / ops
iops = ops / (j["job_runtime"] / 1000.0)
print(f"{name:<20} {iops:>10.0f} {side['bw_bytes'] / 2**20:>9.1f} {mean_us:>9.1f} {p('50.000000'):>9.1f} "
      f"{p('99.000000'):>9.1f} {p('99.900000'):>9.1f} {cpu:>9.1f}")
PY
}
printf "%-20s %10s %9s %9s %9s %9s %9s %9s\n" test IOPS MiB/s "avg µs" "p50 µs" "p99 µs" "p99.9 µs" "CPU µs/op"
fio --name=prefill --ioengine=nbd --uri="$uri" --size="$size" --rw=write --bs=4M --iodepth=16 --output-format=json >/dev/null
run write-4m-qd16      --rw=write --bs=4M --iodepth=16
run read-4m-qd16       --rw=read --bs=4M --iodepth=16
run randwrite-4k-qd1   --rw=randwrite --bs=4k --iodepth=1 --fsync=1
run randwrite-4k-qd128 --rw=randwrite --bs=4k --iodepth=128
run randread-4k-qd1    --rw=randread --bs=4k --iodepth=1
run randread-4k-qd128  --rw=randread --bs=4k --iodepth=128
rm -f /tmp/fio-nbd.$$.json
