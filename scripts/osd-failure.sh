#!/usr/bin/env bash
# The longest client I/O pause when one OSD dies (issue 8's target: under
# 5 s at the default timeouts), through the real binaries: `nacre up` with 3
# OSDs and 3 replicas (min_size 2) on files in a temporary dir, a volume, and
# fio writing 4 KiB at random offsets at QD1 with FUA-equivalent syncs through
# NBD for RUNTIME seconds. Three runs back to back on the same cluster: one
# with no fault; one in which `kill -9` hits osd.0 a third of the way in (the
# cluster runs with --no-restart, so it stays down); one in which
# `nacre osd start 0` brings it back a third of the way in (it must catch
# up with the writes it missed: its PGs serve at once while it is recovered in
# the background, and the script says when every copy was complete again and
# how much it moved). fio's largest completion latency in a run is the longest
# pause a client saw; the last run's p50 and p99 are write latency while
# recovery runs.
#
#   NACRE=target/release/nacre scripts/osd-failure.sh [RUNTIME]   # default 30 s
#
# Needs fio with the nbd engine (Debian: fio) and python3. DIR (default a new
# temporary dir) must be on a real disk for the figures to mean anything;
# KEEP=1 keeps it (and nacre up's log, NACRE_LOG=info for more) afterwards.
set -euo pipefail
NACRE=${NACRE:?set NACRE to the nacre binary, e.g. target/release/nacre}
RUNTIME=${1:-30}
D=${DIR:-$(mktemp -d "${TMPDIR:-/var/tmp}/nacre-osd-failure.XXXXXX")}
mkdir -p "$D"
log() { echo "[$(date +%T)] $*" >&2; }

"$NACRE" up --dir "$D/c" --osds 3 --osd-size 4G --replicas 3 --no-restart >"$D/up.log" 2>&1 &
UP=$!
trap 'kill $UP 2>/dev/null; wait $UP 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$D"' EXIT
healthy() { "$NACRE" status --dir "$D/c" --format json 2>/dev/null | grep -q '"health": "HEALTH_OK"'; }
wait_healthy() {
    for _ in $(seq 120); do healthy && return 0; sleep 0.5; done
    log "the cluster did not become healthy; its log: $D/up.log"; exit 1
}
wait_healthy
"$NACRE" volume create bench --size 1G --dir "$D/c" >/dev/null
URI="nbd+unix:///bench?socket=$D/c/nbd.sock"
log "prefill the volume (so both runs overwrite, none allocates)"
fio --name=prefill --ioengine=nbd --uri="$URI" --rw=write --bs=4M --iodepth=16 --size=1G \
    --output=/dev/null

run() { # label, then what to do a third of the way in: none, kill, start
    local out="$D/$1.json"
    fio --name="$1" --ioengine=nbd --uri="$URI" --rw=randwrite --bs=4k --iodepth=1 \
        --fsync=1 --size=1G --time_based --runtime="$RUNTIME" --output-format=json \
        --output="$out" &
    local fio=$!
    case $2 in
    kill)
        sleep $((RUNTIME / 3))
        log "kill -9 osd.0 (pid $(cat "$D/c/osd.0.pid"))"
        kill -9 "$(cat "$D/c/osd.0.pid")" ;;
    start)
        sleep $((RUNTIME / 3))
        log "nacre osd start 0"
        local t0
        t0=$(date +%s.%N)
        "$NACRE" osd start 0 --dir "$D/c" >&2
        # How long until every copy is complete again, and what moved.
        (wait_healthy
         "$NACRE" status --dir "$D/c" --format json | python3 -c '
import json, sys, time
t0 = float(sys.argv[1]); took = time.time() - t0
st = json.load(sys.stdin)
osds = [o["stats"] or {} for o in st["osd"]]
n = sum(o.get("recovered_objects", 0) for o in osds)
b = sum(o.get("recovered_bytes", 0) for o in osds)
print(f"osd.0 back: clean {took:.1f} s after nacre osd start; {n} object copies "
      f"({b / 2**20:.0f} MiB) recovered, {b / 2**20 / took:.0f} MiB/s", file=sys.stderr)
' "$t0") &
        ;;
    esac
    wait $fio
    python3 - "$1" "$out" <<'EOF'
import json, sys
label, path = sys.argv[1], sys.argv[2]
j = json.load(open(path))["jobs"][0]
w, s = j["write"], j["sync"]
lat = w["clat_ns"]["percentile"]
print(f"| {label} | {w['iops']:.0f} | {lat['50.000000']/1e3:.0f} | {lat['99.000000']/1e3:.0f} "
      f"| {w['clat_ns']['max']/1e6:.0f} | {s['lat_ns']['max']/1e6:.0f} | {j['error']} |")
EOF
}

echo "| run | write IOPS (QD1, fsync each) | p50 µs | p99 µs | longest write ms | longest fsync ms | fio errors |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
run healthy none
wait_healthy
run osd.0-killed kill
run osd.0-back start
log "waiting for the PGs to be clean"
wait_healthy
log "done; nacre up's log was $D/up.log"
