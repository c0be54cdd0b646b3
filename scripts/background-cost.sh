#!/usr/bin/env bash
# What background work costs the clients, and how fast it goes (issue 10's
# targets): `nacre up` with 4 OSDs and 3 replicas on files in a temporary
# dir, a 2 GiB volume filled with data, and fio through NBD doing 4 KiB
# random writes at QD1 with an fsync each for RUNTIME seconds, four times
# back to back:
#
#   healthy     nothing else running
#   rebalance   `nacre osd out 3` a fifth of the way in: a quarter of the
#               PG copies move to the other three OSDs (every copy kept
#               meanwhile); then `nacre osd in 3`, and they move back
#   recovery    osd.0 killed at the start, brought back a fifth of the way
#               in: its copies of the objects written meanwhile are recovered
#   deep scrub  `nacre pg scrub --all --deep` a fifth of the way in
#
# For each: fio's IOPS, p50/p99/max write latency, and how long the
# background work took and how many bytes it moved or read (MiB/s: per
# cluster, and per OSD doing it).
#
#   NACRE=target/release/nacre scripts/background-cost.sh [RUNTIME] [RATE]
#
# RUNTIME defaults to 40 s; RATE (the OSDs' --recovery-rate and
# --scrub-rate) to 100M. Needs fio with the nbd engine (Debian: fio) and
# python3. DIR (default a new temporary dir) must be on a real disk for the
# figures to mean anything; KEEP=1 keeps it (and nacre up's log).
set -euo pipefail
NACRE=${NACRE:?set NACRE to the nacre binary, e.g. target/release/nacre}
RUNTIME=${1:-40}
RATE=${2:-100M}
D=${DIR:-$(mktemp -d "${TMPDIR:-/var/tmp}/nacre-background.XXXXXX")}
mkdir -p "$D"
log() { echo "[$(date +%T)] $*" >&2; }

"$NACRE" up --dir "$D/c" --osds 4 --osd-size 4G --replicas 3 --no-restart \
    --recovery-rate "$RATE" --scrub-rate "$RATE" --scrub-interval 0 --deep-scrub-interval 0 \
    >"$D/up.log" 2>&1 &
UP=$!
trap 'kill $UP 2>/dev/null; wait $UP 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$D"' EXIT
status() { "$NACRE" status --dir "$D/c" --format json 2>/dev/null; }
healthy() { status | grep -q '"health": "HEALTH_OK"'; }
wait_healthy() {
    for _ in $(seq 1200); do healthy && return 0; sleep 0.5; done
    log "the cluster did not become healthy; its log: $D/up.log"; exit 1
}
# Object copies recovered so far, and their bytes, over every OSD.
recovered() {
    status | python3 -c '
import json, sys
st = json.load(sys.stdin)
o = [x["stats"] or {} for x in st["osd"]]
print(sum(x.get("recovered_objects", 0) for x in o), sum(x.get("recovered_bytes", 0) for x in o))'
}
wait_healthy
"$NACRE" volume create bench --size 2G --dir "$D/c" >/dev/null
URI="nbd+unix:///bench?socket=$D/c/nbd.sock"
log "fill the volume (2 GiB)"
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=4M --iodepth=16 --size=2G \
    --output=/dev/null

# Runs the background work of $1 and prints what it took: label, seconds,
# bytes, OSDs doing it.
work() {
    local t0 b0 o0 took b
    t0=$(date +%s.%N)
    read -r o0 b0 < <(recovered)
    case $1 in
    rebalance)
        "$NACRE" osd out 3 --dir "$D/c" >&2
        sleep 2; wait_healthy
        "$NACRE" osd in 3 --dir "$D/c" >&2
        sleep 2; wait_healthy ;;
    recovery)
        "$NACRE" osd start 0 --dir "$D/c" >&2
        sleep 2; wait_healthy ;;
    scrub)
        "$NACRE" pg scrub --all --deep --dir "$D/c" --format json >"$D/scrub.json" ;;
    esac
    took=$(python3 -c "import time; print(time.time() - $t0)")
    if [ "$1" = scrub ]; then
        b=$(python3 -c 'import json,sys; print(sum(r["bytes"] for r in json.load(open(sys.argv[1]))))' "$D/scrub.json")
    else
        read -r _ b < <(recovered)
        b=$((b - b0))
    fi
    echo "$took $b"
}

run() { # label, background work (none, rebalance, recovery, scrub)
    local out="$D/$1.json"
    fio --name="$1" --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --iodepth=1 \
        --fsync=1 --size=2G --time_based --runtime="$RUNTIME" --output-format=json \
        --output="$out" &
    local fio=$! bg=""
    if [ "$2" != none ]; then
        sleep $((RUNTIME / 5))
        log "$1: start"
        bg=$(work "$2")
        log "$1: done ($bg)"
    fi
    wait $fio
    python3 - "$1" "$out" "$bg" <<'EOF'
import json, sys
label, path, bg = sys.argv[1], sys.argv[2], sys.argv[3].split()
j = json.load(open(path))["jobs"][0]
w = j["write"]
lat = w["clat_ns"]["percentile"]
work = "—"
if bg:
    took, b = float(bg[0]), int(bg[1])
    work = f"{took:.1f} s, {b / 2**20:.0f} MiB, {b / 2**20 / took:.0f} MiB/s"
print(f"| {label} | {w['iops']:.0f} | {lat['50.000000']/1e3:.0f} | {lat['99.000000']/1e3:.0f} "
      f"| {w['clat_ns']['max']/1e6:.0f} | {work} | {j['error']} |")
EOF
}

echo "| run | write IOPS (QD1, fsync each) | p50 µs | p99 µs | max ms | background work: time, bytes, rate | fio errors |"
echo "| --- | ---: | ---: | ---: | ---: | --- | ---: |"
run healthy none
run rebalance rebalance
log "kill -9 osd.0; writes go on at two copies"
kill -9 "$(cat "$D/c/osd.0.pid")"
for _ in $(seq 60); do status | grep -q '"up": 3' && break; sleep 0.5; done
fio --name=missed --ioengine=nbd --uri="$URI" --rw=randwrite --bs=128k --iodepth=8 --size=2G \
    --io_size=512M --output=/dev/null
run recovery recovery
run deep-scrub scrub
log "done; nacre up's log was $D/up.log"
