#!/usr/bin/env bash
# The longest client write pause when a whole host dies and when a host is
# cut off the network (issue 10's targets), on the namespace cluster of the
# multi-host tests: 3 etcd members with a monitor each, 4 OSD hosts with 2
# OSDs each, pool size 3 / min_size 2 / failure domain host, a gateway
# host, and a writer in this process sending 4 KiB FUA writes through the
# gateway from 8 tasks. Prints the longest time no write was acknowledged,
# with no fault, with host o1 killed, with host o2 cut off; then checks every
# acknowledged write.
#
#   sudo scripts/host-failover.sh      # as root: it makes network namespaces
#
# Needs etcd (Debian: etcd-server) and iproute2; builds the release test.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release -p nacre-cli --test many_hosts -- --ignored --exact host_pauses --nocapture
