#!/bin/bash
# Issue 11's back-to-back comparison: one `nacre up` cluster of six OSDs
# (files on one disk), a volume in its 3-copy pool `rbd` and one in a 4+2
# erasure-coded pool, each prefilled; then the six fio tests of the anchor
# suite (../shared/anchors: bench.py, its CPU accounting and quiet-machine
# checks) through NBD, each test on the replicated volume and then on the EC
# one, so that the machine's drift falls on both alike. Prints both tables
# (bench.py --table) and the EC ÷ replicated ratios.
#   NACRE=target/release/nacre scripts/ec-bench.sh
# Env: RUNTIME (s per test, default 20), SIZE (per volume, default 2G),
# OSD_SIZE (default 8G), RESDIR (default /tmp/nacre-ec-bench), ANCHORS
# (default ../shared/anchors beside the repo), DIR (scratch, default
# /var/lib/nacre-ec-bench; removed afterwards).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
NACRE=${NACRE:-$ROOT/target/release/nacre}
ANCHORS=${ANCHORS:-$ROOT/../shared/anchors}
BENCH=$ANCHORS/ceph/bench.py
RUNTIME=${RUNTIME:-20}
SIZE=${SIZE:-2G}
OSD_SIZE=${OSD_SIZE:-8G}
RESDIR=${RESDIR:-/tmp/nacre-ec-bench}
D=${DIR:-/var/lib/nacre-ec-bench}
export QUIET_MAX_WAIT=${QUIET_MAX_WAIT:-240} RETRIES=${RETRIES:-2} MAX_FOREIGN=${MAX_FOREIGN:-1.0}
log() { echo "[$(date +%T)] $*" >&2; }
[ -x "$NACRE" ] || { log "no nacre binary at $NACRE (cargo build --release -p nacre-cli)"; exit 1; }
[ -f "$BENCH" ] || { log "no $BENCH (set ANCHORS)"; exit 1; }
command -v fio >/dev/null || { log "fio is missing (apt-get install fio)"; exit 1; }
[ -e "$D" ] && { log "$D exists; remove it first"; exit 1; }
mkdir -p "$D/run" "$RESDIR"
"$NACRE" up --dir "$D/c" --osds 6 --osd-size "$OSD_SIZE" --nbd "unix:$D/nbd.sock" >"$D/up.log" 2>&1 &
PID=$!
echo $PID >"$D/run/nacre.pid"
trap 'kill $PID 2>/dev/null; wait $PID 2>/dev/null; rm -rf "$D"' EXIT
for _ in $(seq 60); do
    [ -S "$D/nbd.sock" ] && "$NACRE" status --dir "$D/c" >/dev/null 2>&1 && break
    sleep 1
done
"$NACRE" pool create ec --ec 4+2 --pgs 64 --dir "$D/c"
"$NACRE" volume create rep --size "$SIZE" --dir "$D/c" >/dev/null
"$NACRE" volume create ec --size "$SIZE" --pool ec --dir "$D/c" >/dev/null
uri() { echo "nbd+unix:///$1?socket=$D/nbd.sock"; }
for v in rep ec; do
    log "prefill $v with sequential 4M writes"
    fio --name=prefill --ioengine=nbd --uri="$(uri $v)" --rw=write --bs=4M --iodepth=16 \
        --size="$SIZE" --output="$D/prefill-$v.txt" >/dev/null
done
# Every OSD process and `nacre up` (gateway, meta store) count as the
# cluster's CPU.
pids() { for p in "$D"/c/osd.*.pid; do cp "$p" "$D/run/"; done; }
pids
t() {
    local label=$1
    shift
    for v in rep ec; do
        python3 "$BENCH" --resdir "$RESDIR/$v" --piddir "$D/run" --runtime "$RUNTIME" \
            --engine nbd --uri "$(uri $v)" --size "$SIZE" --label "$v $label" "$@"
    done
}
mkdir -p "$RESDIR/rep" "$RESDIR/ec"
rm -f "$RESDIR"/rep/results.jsonl "$RESDIR"/ec/results.jsonl
t "a) 4M write QD16" --rw write --bs 4M --qd 16
t "b) 4M read QD16" --rw read --bs 4M --qd 16
t "c) 4k randwrite QD1" --rw randwrite --bs 4k --qd 1
t "d) 4k randwrite QD128" --rw randwrite --bs 4k --qd 128
t "e) 4k randread QD1" --rw randread --bs 4k --qd 1
t "f) 4k randread QD128" --rw randread --bs 4k --qd 128
for v in rep ec; do
    echo "## $v"
    python3 "$BENCH" --resdir "$RESDIR/$v" --table
done
python3 - "$RESDIR/rep/results.jsonl" "$RESDIR/ec/results.jsonl" <<'EOF'
import json, sys
rep = {json.loads(l)["label"][4:]: json.loads(l) for l in open(sys.argv[1])}
ec = {json.loads(l)["label"][3:]: json.loads(l) for l in open(sys.argv[2])}
print("| test | replicated (3×) | EC 4+2 | EC ÷ replicated |")
print("| --- | ---: | ---: | ---: |")
for k, r in rep.items():
    e = ec.get(k)
    if not e:
        continue
    if "4M" in k:
        f = lambda x: x["bw_MiBs"]
        unit, ratio = "MiB/s", e["bw_MiBs"] / r["bw_MiBs"]
        print(f"| {k} ({unit}) | {f(r):.0f} | {f(e):.0f} | {ratio:.2f} |")
    elif "QD1" in k and "QD128" not in k:
        print(f"| {k} (µs per op) | {r['lat_avg_us']:.0f} | {e['lat_avg_us']:.0f} | {e['lat_avg_us'] / r['lat_avg_us']:.2f} |")
    else:
        print(f"| {k} (IOPS) | {r['iops']:.0f} | {e['iops']:.0f} | {e['iops'] / r['iops']:.2f} |")
EOF
