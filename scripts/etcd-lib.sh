# Shared by the scripts that run a Nacre cluster on etcd on this machine's
# loopback (failover.sh, pg-cost-etcd.sh): source it after setting NACRE and
# D (the run's directory). Gives
#   ETCD            the client URLs of a 3-member etcd, for --etcd
#   BASE            the first of the ports this run uses (BASE..BASE+99)
#   PID[name]       every daemon started, killed by the EXIT trap
#   start_etcd I    starts etcd member I (0..2)
#   start NAME ARGS starts `nacre ARGS --etcd $ETCD`, its log in $D/NAME.log
#   nacre ARGS      runs `nacre ARGS --etcd $ETCD` (and --prefix $PREFIX if
#                   PREFIX is set: one cluster among several on the etcd)
#   st              `nacre status --format json` (empty if it fails)
#   field KEY       a top-level field of the JSON on stdin
#   wait_healthy    waits (up to 2 min) for HEALTH_OK
#   log MSG         to stderr, with the time
# KEEP=1 keeps $D and every daemon's log.
NACRE=$(realpath "$NACRE")
mkdir -p "$D"
log() { echo "[$(date +%T)] $*" >&2; }
declare -A PID
cleanup() {
    for p in "${PID[@]}"; do kill -9 "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    [ -n "${KEEP:-}" ] || rm -rf "$D"
}
trap cleanup EXIT

BASE=$((20000 + RANDOM % 20000))
ETCD=""
INITIAL=""
for i in 0 1 2; do
    ETCD+="${ETCD:+,}http://127.0.0.1:$((BASE + i))"
    INITIAL+="${INITIAL:+,}e$i=http://127.0.0.1:$((BASE + 10 + i))"
done
start_etcd() { # member index
    local i=$1
    etcd --name "e$i" --data-dir "$D/etcd$i" \
        --listen-client-urls "http://127.0.0.1:$((BASE + i))" \
        --advertise-client-urls "http://127.0.0.1:$((BASE + i))" \
        --listen-peer-urls "http://127.0.0.1:$((BASE + 10 + i))" \
        --initial-advertise-peer-urls "http://127.0.0.1:$((BASE + 10 + i))" \
        --initial-cluster "$INITIAL" --initial-cluster-state new \
        >>"$D/etcd$i.log" 2>&1 &
    PID[etcd$i]=$!
}
start() { # name, then nacre's arguments
    local name=$1
    shift
    # The binary itself, not a subshell: PID is what `kill` must reach.
    NACRE_LOG=info "$NACRE" "$@" --etcd "$ETCD" ${PREFIX:+--prefix "$PREFIX"} \
        >>"$D/$name.log" 2>&1 &
    PID[$name]=$!
}
nacre() { "$NACRE" "$@" --etcd "$ETCD" ${PREFIX:+--prefix "$PREFIX"}; }
st() { nacre status --format json 2>/dev/null || true; }
field() { python3 -c "import json,sys
try: v=json.load(sys.stdin)
except Exception: v={}
print(v.get('$1') or '')"; }
wait_healthy() {
    for _ in $(seq 240); do
        [ "$(st | field health)" = HEALTH_OK ] && return 0
        sleep 0.5
    done
    log "the cluster did not become healthy; logs in $D (KEEP=1 keeps them)"
    exit 1
}
