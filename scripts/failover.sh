#!/usr/bin/env bash
# The longest client I/O pause when a daemon of a cluster on etcd dies
# (issue 10's target: under 5 s at the default settings), through the real
# binaries, all on this machine's loopback: a 3-member etcd, two `nacre mon`,
# three `nacre osd run` on files (3 replicas, min_size 2, failure domain
# osd), one `nacre gateway nbd`, a volume, and fio writing 4 KiB at random
# offsets at QD1 with an fsync after each write through NBD for RUNTIME
# seconds, then the same reading. For each: one run with no fault, then one
# per fault, each hitting a third of the way in: `kill -9` of the leading
# monitor, of the etcd leader member, of one OSD. The victim is started
# again after its run. fio's largest completion latency in a run is the
# longest pause a client saw.
#
#   NACRE=target/release/nacre scripts/failover.sh [RUNTIME]   # default 30 s
#
# Needs etcd (Debian: etcd-server), fio with the nbd engine, curl, python3.
# DIR (default a new temporary dir) should be on a real disk; KEEP=1 keeps it
# and every daemon's log.
set -euo pipefail
NACRE=${NACRE:?set NACRE to the nacre binary, e.g. target/release/nacre}
RUNTIME=${1:-30}
D=${DIR:-$(mktemp -d "${TMPDIR:-/var/tmp}/nacre-failover.XXXXXX")}
. "$(dirname "$0")/etcd-lib.sh"

for i in 0 1 2; do start_etcd "$i"; done
for _ in $(seq 60); do nacre cluster init >/dev/null 2>&1 && break; sleep 0.5; done
for i in 0 1 2; do
    nacre osd init --dev "$D/osd$i.img" --size 4G \
        --addr "127.0.0.1:$((BASE + 20 + i))" --host "h$i" >/dev/null
done
nacre pool create rbd --pgs 128 --failure-domain osd >/dev/null
for m in 0 1; do start "mon$m" mon --addr "127.0.0.1:$((BASE + 30 + m))"; done
for i in 0 1 2; do start "osd$i" osd run --dev "$D/osd$i.img"; done
start gw gateway nbd --listen "unix:$D/nbd.sock"
wait_healthy
nacre volume create bench --size 1G >/dev/null
URI="nbd+unix:///bench?socket=$D/nbd.sock"
log "prefill the volume (so every run overwrites, none allocates)"
fio --name=prefill --ioengine=nbd --uri="$URI" --rw=write --bs=4M --iodepth=16 --size=1G \
    --output=/dev/null

etcd_leader() {
    for i in 0 1 2; do
        local v
        v=$(curl -s -m 2 -X POST "http://127.0.0.1:$((BASE + i))/v3/maintenance/status" -d '{}' || true)
        if python3 -c "import json,sys; v=json.loads(sys.argv[1]); sys.exit(0 if v['header']['member_id']==v['leader'] else 1)" "$v" 2>/dev/null; then
            echo "$i"
            return
        fi
    done
}
mon_leader() {
    local a
    a=$(st | field leader)
    for m in 0 1; do [[ $a == *":$((BASE + 30 + m))" ]] && echo "$m" && return; done
}

run() { # label, the fault a third of the way in (none, mon, etcd, osd), read|write
    local out="$D/$1.json" victim="" rw=(--rw=randwrite --fsync=1)
    [ "$3" = read ] && rw=(--rw=randread)
    fio --name="$1" --ioengine=nbd --uri="$URI" "${rw[@]}" --bs=4k --iodepth=1 \
        --size=1G --time_based --runtime="$RUNTIME" --output-format=json \
        --output="$out" &
    local fio=$!
    sleep $((RUNTIME / 3))
    case $2 in
    mon) victim=mon$(mon_leader) ;;
    etcd) victim=etcd$(etcd_leader) ;;
    osd) victim=osd1 ;;
    esac
    if [ -n "$victim" ]; then
        log "kill -9 $victim"
        kill -9 "${PID[$victim]}"
    fi
    wait $fio
    case $victim in
    mon*) start "$victim" mon --addr "127.0.0.1:$((BASE + 30 + ${victim#mon}))" ;;
    etcd*) start_etcd "${victim#etcd}" ;;
    osd*) start "$victim" osd run --dev "$D/${victim}.img" ;;
    esac
    [ -n "$victim" ] && wait_healthy
    python3 - "$out" "$1" "$3" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0][sys.argv[3]]
c = j["clat_ns"]
p = c.get("percentile", {})
print(f"{sys.argv[2]:<24} {j['iops']:>8.0f} {p.get('50.000000', 0)/1e3:>9.0f} "
      f"{p.get('99.000000', 0)/1e3:>9.0f} {c['max']/1e6:>11.1f}")
EOF
}

# In this shell, not a pipeline's subshell: the daemons `run` starts again
# must be in PID for the cleanup.
{
    echo "4 KiB QD1 (writes fsync'd)    IOPS   p50 µs    p99 µs  longest ms"
    for rw in write read; do
        run "$rw, no fault" none $rw
        run "$rw, mon leader killed" mon $rw
        run "$rw, etcd leader killed" etcd $rw
        run "$rw, osd killed" osd $rw
    done
} >"$D/table.txt"
cat "$D/table.txt"
