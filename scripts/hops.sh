#!/bin/bash
# Where a QD1 operation's time goes, layer by layer, from the daemons' own
# latency histograms: a fresh `nacre up` (scripts/up-volume.sh) with
# --metrics, fio at QD1 through NBD, the metrics scraped before and after,
# and each layer's mean latency over the run (sum/count deltas):
#   fio (the client's view), the gateway (request read whole → reply sent),
#   the primary (the op's arrival → its answer), a replica's sub-op, and a
#   store write (as primary or replica, no network).
# The differences between layers are the hops: fio → gateway is the NBD
# transport, gateway → primary the client library and its socket, primary
# → store the replication round trip beyond the local write.
#   B=target/release/nacre scripts/hops.sh [randwrite|randread] [SECONDS]
# QD sets fio's queue depth (default 1): at depth, the differences are
# where operations queue, not one operation's hops.
set -euo pipefail
B=${B:-target/release/nacre}
RW=${1:-randwrite}
SECS=${2:-20}
QD=${QD:-1}
D=${D:-/var/tmp/nacre-hops}
PORT=${PORT:-9299}
UP_ARGS="--metrics 127.0.0.1:$PORT"
# shellcheck source=up-volume.sh
. "$(dirname "$0")/up-volume.sh"
curl -fsS "http://127.0.0.1:$PORT/metrics" > "$D/before.txt"
fio --name=hops --ioengine=nbd --uri="$URI" --rw="$RW" --bs=4k --iodepth="$QD" \
  --size=1G --time_based --runtime="$SECS" --output-format=json > "$D/fio.json"
curl -fsS "http://127.0.0.1:$PORT/metrics" > "$D/after.txt"
python3 - "$D" "$RW" "$QD" <<'PY'
import json, re, sys
d, rw, qd = sys.argv[1], sys.argv[2], sys.argv[3]
def load(p):
    m = {}
    for line in open(p):
        if line.startswith('#'):
            continue
        k, _, v = line.rpartition(' ')
        m[k] = float(v)
    return m
a, b = load(f'{d}/before.txt'), load(f'{d}/after.txt')
def mean(family, want):
    """Mean latency (us) over the run of the series of `family` whose labels
    contain every `k="v"` of want, summed over the rest (e.g. every OSD)."""
    s = n = 0.0
    for k, v in b.items():
        if not k.startswith(family + '_sum'):
            continue
        if not all(f'{x}="{y}"' in k for x, y in want.items()):
            continue
        ck = k.replace('_sum', '_count', 1)
        s += v - a.get(k, 0.0)
        n += b[ck] - a.get(ck, 0.0)
    return (s / n * 1e6, int(n)) if n else (None, 0)
s = open(f'{d}/fio.json').read()
f = json.loads(s[s.index('{'):])['jobs'][0]  # the nbd engine may print before the JSON
side = 'write' if 'write' in rw else 'read'
rows = [('fio (client)', f[side]['lat_ns']['mean'] / 1000, f[side]['total_ios'])]
gw = 'write' if side == 'write' else 'read'
rows.append(('gateway: NBD ' + gw, *mean('nacre_nbd_request_latency_seconds', {'command': gw})))
op = 'write' if side == 'write' else 'read'
rows.append((f'primary: {op}', *mean('nacre_osd_op_latency_seconds', {'op': op})))
if side == 'write':
    rows.append(('replica: rep_write', *mean('nacre_osd_op_latency_seconds', {'op': 'rep_write'})))
    rows.append(('store write', *mean('nacre_osd_store_write_latency_seconds', {})))
print(f'| layer ({rw} 4 KiB QD{qd}) | mean latency (us) | ops |')
print('| --- | ---: | ---: |')
for name, us, n in rows:
    print(f'| {name} | {us:.1f} | {n} |' if us is not None else f'| {name} | - | {n} |')
PY
