#!/usr/bin/env bash
# What a placement group costs (issue 8's target: RAM per PG per OSD, and
# peering time for 1 000 PGs per OSD after an OSD restart), through the real
# binaries. For each PG count: `nacre up` with 3 OSDs and 3 replicas (so
# every OSD holds every PG) in a temporary dir, a 512 MiB volume written
# whole with fio (4 096 objects: every PG has objects and a log), then
#   - each OSD process's resident memory (VmRSS), averaged;
#   - `kill -9` of osd.0, and from `nacre osd start 0` until every PG is
#     active+clean again (its boot, replay and the peering of every PG;
#     nothing was written while it was down);
#   - from a fresh `nacre up` of the whole stopped cluster until every PG is
#     active+clean.
# RSS per PG is the slope between the smallest and the largest count.
#
#   NACRE=target/release/nacre scripts/pg-cost.sh [PG counts]   # default 64 256 1024
#
# Needs fio with the nbd engine (Debian: fio) and python3.
set -euo pipefail
NACRE=${NACRE:?set NACRE to the nacre binary, e.g. target/release/nacre}
COUNTS=("${@:-64 256 1024}")
read -r -a COUNTS <<<"${COUNTS[*]}"
D=$(mktemp -d "${TMPDIR:-/var/tmp}/nacre-pg-cost.XXXXXX")
UP=
cleanup() {
    [ -n "$UP" ] && kill "$UP" 2>/dev/null && wait "$UP" 2>/dev/null
    [ -n "${KEEP:-}" ] || rm -rf "$D"
}
trap cleanup EXIT
log() { echo "[$(date +%T)] $*" >&2; }
now() { date +%s.%N; }
clean() {
    "$NACRE" status --dir "$1" --format json 2>/dev/null | python3 2>/dev/null -c '
import json, sys
s = json.load(sys.stdin)
p = s["pgs"]
sys.exit(0 if s["osds"]["up"] == s["osds"]["total"] and p["active_clean"] == p["total"] else 1)'
}
wait_clean() {
    for _ in $(seq 1200); do clean "$1" && return 0; sleep 0.05; done
    log "the cluster did not become clean; its log: $1/../up.log"; exit 1
}
rss_kib() {
    local total=0 n=0 pid
    for f in "$1"/osd.*.pid; do
        pid=$(cat "$f")
        total=$((total + $(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")))
        n=$((n + 1))
    done
    echo $((total / n))
}

rows=()
for pgs in "${COUNTS[@]}"; do
    C="$D/c$pgs"
    "$NACRE" up --dir "$C" --osds 3 --osd-size 2G --pgs "$pgs" --no-restart >"$D/up$pgs.log" 2>&1 &
    UP=$!
    wait_clean "$C"
    "$NACRE" volume create v --size 512M --dir "$C" >/dev/null
    fio --name=fill --ioengine=nbd --uri="nbd+unix:///v?socket=$C/nbd.sock" --rw=write --bs=4M \
        --iodepth=16 --size=512M --output-format=terse >/dev/null
    sleep 2
    rss=$(rss_kib "$C")
    log "$pgs PGs: OSD RSS $((rss / 1024)) MiB"
    kill -9 "$(cat "$C/osd.0.pid")"
    for _ in $(seq 200); do
        "$NACRE" status --dir "$C" --format json | grep -q '"up": 2' && break
        sleep 0.05
    done
    t0=$(now)
    "$NACRE" osd start 0 --dir "$C" >/dev/null
    wait_clean "$C"
    t_osd=$(python3 -c "print(f'{$(now) - $t0:.2f}')")
    log "$pgs PGs: osd.0 restarted, clean after ${t_osd} s"
    kill "$UP"
    wait "$UP" || true
    t0=$(now)
    "$NACRE" up --dir "$C" --no-restart >>"$D/up$pgs.log" 2>&1 &
    UP=$!
    wait_clean "$C"
    t_all=$(python3 -c "print(f'{$(now) - $t0:.2f}')")
    log "$pgs PGs: whole cluster restarted, clean after ${t_all} s"
    kill "$UP"
    wait "$UP" || true
    UP=
    rows+=("$pgs $rss $t_osd $t_all")
done

python3 - "${rows[@]}" <<'EOF'
import sys
rows = [r.split() for r in sys.argv[1:]]
print("| PGs per OSD | OSD RSS (MiB) | osd.0 restart → clean (s) | cluster restart → clean (s) |")
print("| ---: | ---: | ---: | ---: |")
for pgs, rss, t_osd, t_all in rows:
    print(f"| {pgs} | {int(rss) / 1024:.1f} | {t_osd} | {t_all} |")
if len(rows) > 1:
    (p0, r0, *_), (p1, r1, *_) = rows[0], rows[-1]
    per = (int(r1) - int(r0)) / (int(p1) - int(p0))
    print(f"\nRSS per PG per OSD: {per:.1f} KiB (slope from {p0} to {p1} PGs, with 4 096 objects)")
EOF
