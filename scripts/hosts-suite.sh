#!/usr/bin/env bash
# The healthy-path suite (scripts/fio-nbd.sh: 4 MiB write and read at QD16,
# 4 KiB random write at QD1 with fsync and at QD128, 4 KiB random read at
# QD1 and QD128) through a gateway on another host, beside the one-machine
# cluster, back to back (issue 10's target):
#   1. the namespace cluster of the multi-host tests (3 etcd members with a
#      monitor each, 4 OSD hosts x 2 OSDs on 1 GiB files, pool size 3 /
#      min_size 2 / failure domain host, 64 PGs, a gateway host), fio in
#      this machine's namespace reaching the gateway over the bridge
#      (`healthy_suite` in crates/cli/tests/many_hosts.rs);
#   2. `nacre up` (3 OSDs, 3 replicas, the embedded meta store), fio on its
#      unix socket.
# Both on a 1 GiB volume, prefilled; RUNTIME seconds per test.
#
#   sudo RUNTIME=20 scripts/hosts-suite.sh   # as root: it makes network namespaces
#
# Needs etcd (Debian: etcd-server), iproute2, fio; builds release binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNTIME=${RUNTIME:-20}
echo "== namespace cluster, gateway on another host (nbd over TCP)"
NACRE_SUITE_RUNTIME=$RUNTIME cargo test --release -p nacre-cli --test many_hosts -- \
    --ignored --exact healthy_suite --nocapture 2>/dev/null | grep -E '^(test +IOPS|[a-z]+-[0-9])'
cargo build --release -p nacre-cli
D=$(mktemp -d "${TMPDIR:-/var/tmp}/nacre-hosts-suite.XXXXXX")
target/release/nacre up --dir "$D/c" --osds 3 --nbd "unix:$D/nbd.sock" >"$D/up.log" 2>&1 &
UP=$!
trap 'kill $UP 2>/dev/null; wait $UP 2>/dev/null; rm -rf "$D"' EXIT
for _ in $(seq 60); do [ -S "$D/nbd.sock" ] && target/release/nacre status --dir "$D/c" >/dev/null 2>&1 && break; sleep 1; done
target/release/nacre volume create bench --size 1G --dir "$D/c" >/dev/null
echo "== one machine: nacre up (nbd over a unix socket)"
scripts/fio-nbd.sh "nbd+unix:///bench?socket=$D/nbd.sock" 1G "$RUNTIME" "$UP"
