#!/usr/bin/env bash
# What a placement group costs on a cluster on etcd (issue 10's target:
# peering time and `nacre status` time with 1 000 PGs per OSD, RAM per PG
# per OSD), through the real binaries on this machine's loopback: a 3-member
# etcd and, for each PG count, a cluster of its own under its own prefix:
# two `nacre mon`, three `nacre osd run` on files (3 replicas, failure
# domain osd: every OSD holds every PG), one `nacre gateway nbd`, a 512 MiB
# volume written whole with fio (4 096 objects: every PG has objects and a
# log). Then
#   - `nacre status` run 5 times: its median wall time;
#   - each OSD's resident memory (VmRSS), averaged, and the leading mon's;
#   - `kill -9` of osd.0, and from its `nacre osd run` until every PG is
#     active+clean (boot, replay, the peering of every PG; nothing was
#     written while it was down);
#   - SIGTERM to every OSD and mon, and from starting them again until every
#     PG is active+clean (a mon elected, every OSD booted, every PG peered).
#
#   NACRE=target/release/nacre scripts/pg-cost-etcd.sh [PG counts]   # default 64 1024
#
# Needs etcd (Debian: etcd-server), fio with the nbd engine, python3.
set -euo pipefail
NACRE=${NACRE:?set NACRE to the nacre binary, e.g. target/release/nacre}
COUNTS=("${@:-64 1024}")
read -r -a COUNTS <<<"${COUNTS[*]}"
D=${DIR:-$(mktemp -d "${TMPDIR:-/var/tmp}/nacre-pg-cost-etcd.XXXXXX")}
. "$(dirname "$0")/etcd-lib.sh"
now() { date +%s.%N; }
since() { python3 -c "print(f'{$(now) - $1:.2f}')"; }
clean() {
    st | python3 2>/dev/null -c '
import json, sys
s = json.load(sys.stdin)
p = s["pgs"]
sys.exit(0 if s["osds"]["up"] == s["osds"]["total"] and p["active_clean"] == p["total"] else 1)'
}
wait_clean() {
    for _ in $(seq 2400); do clean && return 0; sleep 0.05; done
    log "the cluster did not become clean; logs in $D (KEEP=1 keeps them)"
    exit 1
}
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }

for i in 0 1 2; do start_etcd "$i"; done
rows=()
k=0
for pgs in "${COUNTS[@]}"; do
    PREFIX="/pgcost$pgs/"
    port=$((BASE + 40 + 10 * k))
    k=$((k + 1))
    for _ in $(seq 60); do nacre cluster init >/dev/null 2>&1 && break; sleep 0.5; done
    for i in 0 1 2; do
        nacre osd init --dev "$D/osd$pgs.$i.img" --size 2G --pg-logs "$pgs" \
            --addr "127.0.0.1:$((port + i))" --host "h$i" >/dev/null
    done
    nacre pool create rbd --pgs "$pgs" --failure-domain osd >/dev/null
    mons() { for m in 0 1; do start "mon$pgs.$m" mon --addr "127.0.0.1:$((port + 5 + m))"; done; }
    osds() { for i in "$@"; do start "osd$pgs.$i" osd run --dev "$D/osd$pgs.$i.img"; done; }
    mons
    osds 0 1 2
    start "gw$pgs" gateway nbd --listen "unix:$D/nbd$pgs.sock"
    wait_clean
    nacre volume create v --size 512M >/dev/null
    fio --name=fill --ioengine=nbd --uri="nbd+unix:///v?socket=$D/nbd$pgs.sock" --rw=write \
        --bs=4M --iodepth=16 --size=512M --output=/dev/null
    sleep 2
    times=()
    for _ in 1 2 3 4 5; do
        t0=$(now)
        nacre status >/dev/null
        times+=("$(since "$t0")")
    done
    t_status=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 3p)
    osd_rss=$(( ($(rss_kib "${PID[osd$pgs.0]}") + $(rss_kib "${PID[osd$pgs.1]}") + $(rss_kib "${PID[osd$pgs.2]}")) / 3 ))
    leader=$(st | field leader)
    m=0
    [[ $leader == *":$((port + 6))" ]] && m=1
    mon_rss=$(rss_kib "${PID[mon$pgs.$m]}")
    log "$pgs PGs: status ${t_status} s (median of ${times[*]}), OSD RSS $((osd_rss / 1024)) MiB, mon $((mon_rss / 1024)) MiB"
    kill -9 "${PID[osd$pgs.0]}"
    for _ in $(seq 600); do
        [ "$(st | python3 -c 'import json,sys; print(json.load(sys.stdin)["osds"]["up"])' 2>/dev/null)" = 2 ] && break
        sleep 0.05
    done
    t0=$(now)
    osds 0
    wait_clean
    t_osd=$(since "$t0")
    log "$pgs PGs: osd.0 killed and started again, clean after ${t_osd} s"
    for n in "mon$pgs.0" "mon$pgs.1" "osd$pgs.0" "osd$pgs.1" "osd$pgs.2"; do
        kill "${PID[$n]}"
    done
    for n in "mon$pgs.0" "mon$pgs.1" "osd$pgs.0" "osd$pgs.1" "osd$pgs.2"; do
        wait "${PID[$n]}" || true
        unset "PID[$n]"
    done
    t0=$(now)
    mons
    osds 0 1 2
    wait_clean
    t_all=$(since "$t0")
    log "$pgs PGs: mons and OSDs stopped and started again, clean after ${t_all} s"
    rows+=("$pgs $t_status $osd_rss $mon_rss $t_osd $t_all")
done

python3 - "${rows[@]}" <<'PY'
import sys
rows = [r.split() for r in sys.argv[1:]]
print("| PGs per OSD | `nacre status` (s) | OSD RSS (MiB) | mon RSS (MiB) | osd.0 restart → clean (s) | cluster restart → clean (s) |")
print("| ---: | ---: | ---: | ---: | ---: | ---: |")
for pgs, st, rss, mon, t_osd, t_all in rows:
    print(f"| {pgs} | {st} | {int(rss) / 1024:.1f} | {int(mon) / 1024:.1f} | {t_osd} | {t_all} |")
if len(rows) > 1:
    (p0, _, r0, m0, *_), (p1, _, r1, m1, *_) = rows[0], rows[-1]
    dp = int(p1) - int(p0)
    print(f"\nRSS per PG: OSD {(int(r1) - int(r0)) / dp:.1f} KiB, mon {(int(m1) - int(m0)) / dp:.1f} KiB "
          f"(slope from {p0} to {p1} PGs per OSD, 4 096 objects)")
PY
