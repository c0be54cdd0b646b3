#!/bin/bash
# The 4 MiB tests of the anchor suite (sequential write and read, QD16,
# fio's nbd engine) on two nacre binaries, alternating round by round so
# that both see the same machine, with the IOPS ratio of each pair:
#
#   scripts/ab-4m.sh OLD_NACRE NEW_NACRE [ROUNDS] [RUNTIME_S]
#
# Each run: `nacre up` with 3 OSDs on 10 GiB files, 3 replicas, a 4 GiB
# volume written whole first, then 4M write and 4M read for RUNTIME_S
# seconds (default 15). Needs fio with its nbd engine. Uses /tmp/ab-4m.
set -euo pipefail
OLD=${1:?old nacre binary}
NEW=${2:?new nacre binary}
ROUNDS=${3:-2}
RT=${4:-15}
D=/tmp/ab-4m
command -v fio >/dev/null || { echo "fio is missing (apt-get install fio)" >&2; exit 1; }

# Prints "WRITE_IOPS READ_IOPS" for binary $1.
run() {
	local n=$1 pid iops=()
	rm -rf "$D"
	mkdir -p "$D"
	"$n" up --dir "$D/c" --osds 3 --osd-size 10G --replicas 3 --nbd "unix:$D/nbd.sock" >"$D/up.log" 2>&1 &
	pid=$!
	for _ in $(seq 60); do
		[ -S "$D/nbd.sock" ] && "$n" status --dir "$D/c" >/dev/null 2>&1 && break
		sleep 1
	done
	"$n" volume create --dir "$D/c" bench --size 4G >/dev/null
	local uri="nbd+unix:///bench?socket=$D/nbd.sock"
	fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=4M --iodepth=16 --size=4G >/dev/null
	for rw in write read; do
		fio --name=t --ioengine=nbd --uri="$uri" --rw=$rw --bs=4M --iodepth=16 --size=4G \
			--time_based --runtime="$RT" --output-format=json --output="$D/fio.json" >/dev/null
		iops+=("$(python3 -c 'import json,sys; j=json.load(open(sys.argv[1]))["jobs"][0]; print(round(j["write"]["iops"] + j["read"]["iops"], 1))' "$D/fio.json")")
	done
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	rm -rf "$D"
	echo "${iops[*]}"
}

printf '| round | old 4M write | new 4M write | ratio | old 4M read | new 4M read | ratio |\n'
printf '| ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for r in $(seq "$ROUNDS"); do
	read -r ow or_ < <(run "$OLD")
	read -r nw nr < <(run "$NEW")
	python3 -c 'import sys; r, ow, nw, o, n = sys.argv[1:]; print(f"| {r} | {ow} | {nw} | {float(nw)/float(ow):.2f} | {o} | {n} | {float(n)/float(o):.2f} |")' "$r" "$ow" "$nw" "$or_" "$nr"
done
