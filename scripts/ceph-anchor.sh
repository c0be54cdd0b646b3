#!/bin/bash
# Nacre's copy of ../shared/anchors/ceph/run.sh (the team's Ceph anchor), with
# one more mode for issue 11: `./ceph-anchor.sh ec` stands up six OSDs, a
# 3-replica RBD image and one whose data lives in an erasure-coded 4+2 pool
# (`allow_ec_overwrites`, the way RBD runs on EC), and runs the six tests on
# each, back to back per test, as scripts/ec-bench.sh does for Nacre. The
# other modes are the anchor's, unchanged. bench.py (the CPU accounting and
# quiet-machine checks) is the anchor's own: ANCHORS (default
# ../shared/anchors beside the repo). Ceph: apt-get install ceph.
#
# Minimal single-host Ceph (Pacific 16.2.x, Debian bookworm packages) + fio baseline.
#
#   ./run.sh            # = all: setup, rbd suite, local-file suite, size=1 extra, teardown, table
#   ./run.sh setup      # build + start the cluster only
#   ./run.sh suite      # rbd suite (needs running cluster)
#   ./run.sh local      # libaio suite against a plain 4 GiB file
#   ./run.sh size1      # pool size=1 variant of tests c) and e)
#   ./run.sh spin       # optional: c)/e) with SCHED_IDLE spinners (VM idle-wakeup experiment)
#   ./run.sh calib      # host CPU speed probe (the VM's vCPU speed drifts; see RESULTS.md)
#   ./run.sh table      # print results table from $RESDIR
#   ./run.sh teardown   # stop the daemons we started (by PID) and delete $D
#   ./ceph-anchor.sh ec # six OSDs: 3-replica image vs EC 4+2 data pool, then teardown, table
#
# Env knobs: CEPHBENCH_DIR (default /var/lib/cephbench), RUNTIME (default 20),
#            RESDIR (default <script dir>/results), KEEP_DATA=1 (teardown keeps $D),
#            QUIET_MAX_WAIT / RETRIES / MAX_FOREIGN (contention guard, see below).
# Only loopback (127.0.0.1) is used. Daemons run as root, no systemd.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
HERE=${ANCHORS:-$ROOT/../shared/anchors}/ceph
D=${CEPHBENCH_DIR:-/var/lib/cephbench}
CONF=$D/ceph.conf
export CEPH_CONF=$CONF            # librados (fio rbd engine, rbd CLI) picks this up
RUNTIME=${RUNTIME:-20}
RESDIR=${RESDIR:-/tmp/nacre-ceph-results}
# bench.py waits for the box to be quiet (<0.25 busy cores) before each test (up to
# QUIET_MAX_WAIT s) and repeats a test (up to RETRIES times) if other processes used more
# than MAX_FOREIGN CPU-seconds during it; the table marks still-contended runs with (!).
export QUIET_MAX_WAIT=${QUIET_MAX_WAIT:-240} RETRIES=${RETRIES:-2} MAX_FOREIGN=${MAX_FOREIGN:-1.0}
NOSD=${NOSD:-3}
OSD_BYTES=$((10 * 1024 * 1024 * 1024))   # 10 GiB sparse file per OSD
IMG=bench
IMG_SIZE=${IMG_SIZE:-4G}
PG=64

log() { echo "[$(date +%T)] $*" >&2; }
C() { timeout 60 ceph -c "$CONF" "$@"; }

write_conf() {
  local fsid=$1
  cat > "$CONF" <<EOF
[global]
fsid = $fsid
mon host = [v2:127.0.0.1:3300,v1:127.0.0.1:6789]
mon initial members = a
public addr = 127.0.0.1
cluster addr = 127.0.0.1
public network = 127.0.0.0/8
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
run dir = $D/run
pid file = $D/run/\$name.pid
log file = $D/log/\$name.log
crash dir = $D/crash
osd crush chooseleaf type = 0
osd pool default size = 3
osd pool default min size = 2
osd pool default pg num = $PG
osd pool default pgp num = $PG
osd pool default pg autoscale mode = off
mon allow pool delete = true
mon allow pool size one = true
mon warn on pool no redundancy = false
mon data avail warn = 5

[mon]
mon data = $D/mon.\$id
keyring = $D/mon.\$id/keyring

[mgr]
mgr data = $D/mgr.\$id
keyring = $D/mgr.\$id/keyring

[osd]
osd data = $D/osd.\$id
keyring = $D/osd.\$id/keyring
osd objectstore = bluestore
bluestore block create = true
bluestore block size = $OSD_BYTES
bluestore fsck on mount = false
osd memory target = 2147483648
# vda (virtio) reports rotational=1; the backing store is not a spinning disk,
# so run BlueStore + the OSD op queue with Ceph's SSD defaults:
bluestore debug enforce settings = ssd
osd op num shards = 8
osd op num threads per shard = 2

[client]
keyring = $D/ceph.client.admin.keyring
rbd cache = false
EOF
}

pid_of() { cat "$D/run/$1.pid" 2>/dev/null; }

wait_clean() {   # all PGs of all pools reported by the mgr and active+clean
  local i want
  for i in $(seq 1 180); do
    want=$(C osd pool ls detail -f json | python3 -c 'import json,sys;print(sum(p["pg_num"] for p in json.load(sys.stdin)))')
    if C pg stat -f json 2>/dev/null | WANT=$want python3 -c '
import json,os,sys
j=json.load(sys.stdin); s=j.get("pg_summary",j)
n=s["num_pgs"]; st={x["name"]:x["num"] for x in s["num_pg_by_state"]}
sys.exit(0 if n==int(os.environ["WANT"]) and st.get("active+clean",0)==n else 1)'; then
      return 0
    fi
    sleep 2
  done
  log "PGs not clean after 360s"; C -s; return 1
}

setup() {
  [ -e "$D" ] && { log "$D exists; run '$0 teardown' first"; exit 1; }
  mkdir -p "$D"/{run,log,crash,mgr.x}
  local fsid; fsid=$(uuidgen)
  write_conf "$fsid"

  log "keyrings + monmap"
  ceph-authtool --create-keyring "$D/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool --create-keyring "$D/ceph.client.admin.keyring" --gen-key -n client.admin \
      --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
  ceph-authtool "$D/mon.keyring" --import-keyring "$D/ceph.client.admin.keyring" >/dev/null
  monmaptool --create --fsid "$fsid" --addv a '[v2:127.0.0.1:3300,v1:127.0.0.1:6789]' "$D/monmap" >/dev/null

  log "mon.a mkfs + start"
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$D/monmap" --keyring "$D/mon.keyring"
  ceph-mon -c "$CONF" -i a
  for i in $(seq 1 30); do C mon stat >/dev/null 2>&1 && break; sleep 1; done
  C mon stat

  log "mgr.x"
  C auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' -o "$D/mgr.x/keyring"
  ceph-mgr -c "$CONF" -i x

  local n uuid key id
  for n in $(seq 0 $((NOSD - 1))); do
    uuid=$(uuidgen); key=$(ceph-authtool --gen-print-key)
    echo "{\"cephx_secret\": \"$key\"}" > "$D/osd-new.json"
    id=$(C osd new "$uuid" -i "$D/osd-new.json"); rm -f "$D/osd-new.json"
    log "osd.$id mkfs (bluestore on sparse 10 GiB file)"
    mkdir -p "$D/osd.$id"
    printf '[osd.%s]\n\tkey = %s\n' "$id" "$key" > "$D/osd.$id/keyring"
    ceph-osd -c "$CONF" -i "$id" --mkfs --key "$key" --osd-uuid "$uuid" > "$D/log/osd.$id.mkfs.log" 2>&1 \
      || { tail -20 "$D/log/osd.$id.mkfs.log"; exit 1; }
    ceph-osd -c "$CONF" -i "$id"
  done
  for i in $(seq 1 60); do
    [ "$(C osd stat -f json | python3 -c 'import json,sys;print(json.load(sys.stdin)["num_up_osds"])')" = "$NOSD" ] && break
    sleep 1
  done
  C osd tree

  log "pool rbd (size 3, min_size 2, pg_num $PG) + image $IMG ($IMG_SIZE)"
  C osd pool create rbd $PG $PG replicated
  C osd pool set rbd size 3
  C osd pool set rbd min_size 2
  rbd pool init rbd
  rbd create rbd/$IMG --size $IMG_SIZE
  rbd info rbd/$IMG
  wait_clean
  C -s
}

bench() { python3 "$HERE/bench.py" --resdir "$RESDIR" --piddir "$D/run" --runtime "$RUNTIME" "$@"; }

RBD_ARGS=(--engine rbd --pool rbd --image $IMG)
suite_rbd() {   # $1 = label prefix
  local p=${1:-rbd3}
  log "prefill rbd/$IMG with sequential 4M writes"
  fio --name=prefill --ioengine=rbd --clientname=admin --pool=rbd --rbdname=$IMG --direct=1 \
      --rw=write --bs=4M --iodepth=16 --size=$IMG_SIZE --output="$D/log/prefill.txt" >/dev/null
  bench "${RBD_ARGS[@]}" --label "$p a) 4M write QD16"    --rw write     --bs 4M --qd 16
  bench "${RBD_ARGS[@]}" --label "$p b) 4M read QD16"     --rw read      --bs 4M --qd 16
  bench "${RBD_ARGS[@]}" --label "$p c) 4k randwrite QD1"   --rw randwrite --bs 4k --qd 1
  bench "${RBD_ARGS[@]}" --label "$p d) 4k randwrite QD128" --rw randwrite --bs 4k --qd 128
  bench "${RBD_ARGS[@]}" --label "$p e) 4k randread QD1"    --rw randread  --bs 4k --qd 1
  bench "${RBD_ARGS[@]}" --label "$p f) 4k randread QD128"  --rw randread  --bs 4k --qd 128
}

# An image whose data is in an EC 4+2 pool (its header and metadata in the
# replicated pool `rbd`, as RBD on EC needs), failure domain osd.
setup_ec() {
  log "EC profile 4+2 (failure domain osd), pool ecdata (pg_num $PG, overwrites on) + image $IMG-ec"
  C osd erasure-code-profile set ec42 k=4 m=2 crush-failure-domain=osd
  C osd pool create ecdata $PG $PG erasure ec42
  C osd pool set ecdata allow_ec_overwrites true
  C osd pool application enable ecdata rbd
  rbd create rbd/$IMG-ec --size $IMG_SIZE --data-pool ecdata
  rbd info rbd/$IMG-ec
  wait_clean
  C -s
}

# Each test on the replicated image, then on the EC one.
suite_ec() {
  local i
  for i in $IMG $IMG-ec; do
    log "prefill rbd/$i with sequential 4M writes"
    fio --name=prefill --ioengine=rbd --clientname=admin --pool=rbd --rbdname=$i --direct=1 \
        --rw=write --bs=4M --iodepth=16 --size=$IMG_SIZE --output="$D/log/prefill-$i.txt" >/dev/null
  done
  t() {
    local label=$1; shift
    bench --engine rbd --pool rbd --image $IMG --label "rbd3 $label" "$@"
    bench --engine rbd --pool rbd --image $IMG-ec --label "ec42 $label" "$@"
  }
  t "a) 4M write QD16"    --rw write     --bs 4M --qd 16
  t "b) 4M read QD16"     --rw read      --bs 4M --qd 16
  t "c) 4k randwrite QD1"   --rw randwrite --bs 4k --qd 1
  t "d) 4k randwrite QD128" --rw randwrite --bs 4k --qd 128
  t "e) 4k randread QD1"    --rw randread  --bs 4k --qd 1
  t "f) 4k randread QD128"  --rw randread  --bs 4k --qd 128
}

suite_local() {
  local F=$D/local.img A=(--engine libaio --file "$D/local.img" --size 4G)
  mkdir -p "$D"
  log "prefill $F (4 GiB) with sequential 4M writes"
  rm -f "$F"
  fio --name=prefill --ioengine=libaio --filename="$F" --size=4G --direct=1 \
      --rw=write --bs=4M --iodepth=16 --end_fsync=1 --output="$D/local-prefill.txt" >/dev/null
  bench "${A[@]}" --label "local a) 4M write QD16"    --rw write     --bs 4M --qd 16
  bench "${A[@]}" --label "local b) 4M read QD16"     --rw read      --bs 4M --qd 16
  bench "${A[@]}" --label "local c) 4k randwrite QD1"   --rw randwrite --bs 4k --qd 1
  bench "${A[@]}" --label "local c') 4k randwrite QD1 fsync=1" --rw randwrite --bs 4k --qd 1 --fsync 1
  bench "${A[@]}" --label "local d) 4k randwrite QD128" --rw randwrite --bs 4k --qd 128
  bench "${A[@]}" --label "local e) 4k randread QD1"    --rw randread  --bs 4k --qd 1
  bench "${A[@]}" --label "local f) 4k randread QD128"  --rw randread  --bs 4k --qd 128
  rm -f "$F" "$D/local-prefill.txt"; rmdir "$D" 2>/dev/null || true
}

size1() {
  log "pool rbd -> size 1 / min_size 1"
  C osd pool set rbd min_size 1
  C osd pool set rbd size 1 --yes-i-really-mean-it
  sleep 3; wait_clean
  bench "${RBD_ARGS[@]}" --label "rbd1 c) 4k randwrite QD1" --rw randwrite --bs 4k --qd 1
  bench "${RBD_ARGS[@]}" --label "rbd1 e) 4k randread QD1"  --rw randread  --bs 4k --qd 1
  log "pool rbd -> back to size 3 / min_size 2"
  C osd pool set rbd size 3
  C osd pool set rbd min_size 2
}

spin() {   # optional experiment: keep both vCPUs out of HLT with SCHED_IDLE spinners
  # (they only run when nothing else wants the CPU) to see how much of the QD1 latency
  # is VM idle-wakeup cost.  Needs a running cluster with a prefilled image.
  local s1 s2 F=$D/local.img
  chrt -i 0 bash -c 'while :; do :; done' & s1=$!
  chrt -i 0 bash -c 'while :; do :; done' & s2=$!
  log "SCHED_IDLE spinners: $s1 $s2"
  export QUIET_MAX_WAIT=0 RETRIES=0 MAX_FOREIGN=1000000   # spinners count as 'foreign'
  bench "${RBD_ARGS[@]}" --label "spin rbd3 c) 4k randwrite QD1" --rw randwrite --bs 4k --qd 1
  bench "${RBD_ARGS[@]}" --label "spin rbd3 e) 4k randread QD1"  --rw randread  --bs 4k --qd 1
  fio --name=prefill --ioengine=libaio --filename="$F" --size=4G --direct=1 \
      --rw=write --bs=4M --iodepth=16 --end_fsync=1 --output="$D/local-prefill.txt" >/dev/null
  local A=(--engine libaio --file "$F" --size 4G)
  bench "${A[@]}" --label "spin local c) 4k randwrite QD1"   --rw randwrite --bs 4k --qd 1
  bench "${A[@]}" --label "spin local c') 4k randwrite QD1 fsync=1" --rw randwrite --bs 4k --qd 1 --fsync 1
  bench "${A[@]}" --label "spin local e) 4k randread QD1"    --rw randread  --bs 4k --qd 1
  rm -f "$F"
  kill "$s1" "$s2"; wait "$s1" "$s2" 2>/dev/null || true
  log "spinners stopped"
}

teardown() {
  local f pid
  for f in "$D"/run/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
      log "stopping $(basename "$f" .pid) pid $pid"
      kill -TERM "$pid"
    fi
  done
  for f in "$D"/run/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    for i in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    if kill -0 "$pid" 2>/dev/null; then log "pid $pid still alive, SIGKILL"; kill -KILL "$pid"; fi
  done
  if [ "${KEEP_DATA:-0}" != 1 ]; then rm -rf "$D"; log "removed $D"; fi
}

calib() {   # host-speed probe: best of 3 of a fixed pure-Python loop (seconds, lower = faster vCPU)
  local t
  t=$(python3 - <<'PY'
import time
best = 1e9
for _ in range(3):
    t0 = time.perf_counter(); x = 0
    for i in range(20000000): x += i
    best = min(best, time.perf_counter() - t0)
print(f"{best:.2f}")
PY
)
  local st; st=$(awk '/^cpu /{print $9}' /proc/stat)
  mkdir -p "$RESDIR"
  echo "$(date -u +%FT%TZ) $1 calib_loop_s=$t steal_ticks_total=$st" | tee -a "$RESDIR/calib.txt" >&2
}

table() { python3 "$HERE/bench.py" --resdir "$RESDIR" --table; }

info() {
  mkdir -p "$RESDIR"
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "kernel: $(uname -r)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) x $(nproc) vCPU"
    echo "mem: $(free -g | awk '/Mem:/{print $2}') GiB"
    echo "disk: $(lsblk -dno NAME,SIZE,ROTA,TYPE /dev/vda 2>/dev/null) sched=$(cat /sys/block/vda/queue/scheduler 2>/dev/null)"
    echo "fs: $(df -hT "$(dirname "$D")" | tail -1)"
    echo "ceph: $(ceph --version)"
    echo "fio: $(fio --version)"
  } > "$RESDIR/machine.txt"
  cat "$RESDIR/machine.txt"
}

cmd=${1:-all}
case $cmd in
  setup) setup ;;
  info) info ;;
  suite) suite_rbd ;;
  local) suite_local ;;
  size1) size1 ;;
  spin) spin ;;
  calib) calib manual ;;
  table) table ;;
  teardown) teardown ;;
  ec)
    [ "$NOSD" = 6 ] || { echo "ec: run with NOSD=6"; exit 2; }
    [ -e "$RESDIR/results.jsonl" ] && mv "$RESDIR/results.jsonl" "$RESDIR/results.$(date +%s).jsonl.old"
    info
    trap 'teardown' EXIT
    setup
    setup_ec
    suite_ec
    C -s > "$RESDIR/ceph-status-end.txt" || true
    teardown; trap - EXIT
    table
    ;;
  all)
    [ -e "$RESDIR/results.jsonl" ] && mv "$RESDIR/results.jsonl" "$RESDIR/results.$(date +%s).jsonl.old"
    info
    trap 'teardown' EXIT
    calib before-setup
    setup
    cp "$CONF" "$RESDIR/ceph.conf"
    calib before-rbd-suite
    suite_rbd
    calib after-rbd-suite
    size1
    C -s > "$RESDIR/ceph-status-end.txt" || true
    teardown; trap - EXIT
    calib before-local
    suite_local
    calib end
    table
    ;;
  *) echo "usage: $0 [all|setup|info|suite|local|size1|spin|calib|table|teardown|ec]"; exit 2 ;;
esac
