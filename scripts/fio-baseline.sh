#!/usr/bin/env bash
# The standard suite's six patterns issued by fio to FILE (io_uring,
# O_DIRECT), as an outside yardstick for the "raw" column of
# `nacre store bench`. Installs fio from Debian if missing.
# Usage: scripts/fio-baseline.sh FILE [SIZE=4G] [RUNTIME_S=10]
set -euo pipefail
file=${1:?usage: fio-baseline.sh FILE [SIZE] [RUNTIME_S]}
size=${2:-4G}
runtime=${3:-10}
command -v fio >/dev/null || { apt-get update -qq && apt-get install -y -qq fio >/dev/null; }
common=(--filename="$file" --size="$size" --ioengine=io_uring --direct=1 --time_based --runtime="$runtime"
        --group_reporting --output-format=json)
run() { # name, fio args...
    local name=$1; shift
    fio --name="$name" "${common[@]}" "$@" | python3 -c '
import json, sys
name = sys.argv[1]
j = json.load(sys.stdin)["jobs"][0]
side = j["write"] if j["write"]["io_bytes"] > 0 else j["read"]
# At QD1 the mean is runtime / ops (it then includes the fdatasync, which
# fio keeps out of its latencies); deeper queues use the total latency fio reports.
ops = side["total_ios"]
qd1 = name.endswith("qd1")
mean_us = (j["job_runtime"] * 1000.0 / ops if ops else 0) if qd1 else side["lat_ns"]["mean"] / 1000.0
pct = side["clat_ns"].get("percentile", {})
p = lambda k: pct.get(k, 0) / 1000.0
cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * j["job_runtime"] * 1000.0 / max(ops, 1)
iops, mbs = side["iops"], side["bw_bytes"] / 1e6
p50, p99, p999 = p("50.000000"), p("99.000000"), p("99.900000")
print(f"{name:<20} {iops:>10.0f} {mbs:>9.1f} {mean_us:>9.1f} {p50:>9.1f} {p99:>9.1f} {p999:>9.1f} {cpu:>9.2f}")
' "$name"
}
printf "%-20s %10s %9s %9s %9s %9s %9s %9s\n" test IOPS MB/s "avg µs" "p50 µs" "p99 µs" "p99.9 µs" "CPU µs/op"
# Allocate the file first so no test pays for it.
fio --name=prefill --filename="$file" --size="$size" --ioengine=io_uring --direct=1 --rw=write --bs=4M --iodepth=16 \
    --output-format=json >/dev/null
run randwrite-4k-qd1   --rw=randwrite --bs=4k --iodepth=1 --fdatasync=1
run randwrite-4k-qd128 --rw=randwrite --bs=4k --iodepth=128
run randread-4k-qd1    --rw=randread --bs=4k --iodepth=1
run randread-4k-qd128  --rw=randread --bs=4k --iodepth=128
run write-4m-qd16      --rw=write --bs=4M --iodepth=16
run read-4m-qd16       --rw=read --bs=4M --iodepth=16
echo "(QD1 avg µs = runtime / ops, so the durable write includes its fdatasync; percentiles are fio's completion latency, without it)"
