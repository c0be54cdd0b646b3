#!/bin/bash
# The 4 MiB tests of the anchor suite (sequential write and read, QD16,
# fio's nbd engine) on two nacre binaries, alternating round by round so
# that both see the same machine, with the IOPS ratio of each pair:
#
#   scripts/ab-4m.sh OLD_NACRE NEW_NACRE [ROUNDS] [RUNTIME_S]
#
# Each run: `nacre up` with 3 OSDs on 10 GiB files, 3 replicas, a 4 GiB
# volume written whole first, then 4M write and 4M read for RUNTIME_S
# seconds (default 15). Prints IOPS and the CPU of every Nacre process
# (`nacre up` and its OSDs) per op in ms. Needs fio with its nbd engine.
# Uses /tmp/ab-4m.
set -euo pipefail
OLD=${1:?old nacre binary}
NEW=${2:?new nacre binary}
ROUNDS=${3:-2}
RT=${4:-15}
D=/tmp/ab-4m
command -v fio >/dev/null || { echo "fio is missing (apt-get install fio)" >&2; exit 1; }

# CPU ticks of process $1 and its children.
ticks() {
	local t=0 p
	for p in "$1" $(pgrep -P "$1"); do
		# (A process gone meanwhile counts nothing.)
		t=$((t + $(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null || echo 0)))
	done
	echo "$t"
}

# Prints "WRITE_IOPS WRITE_CPU_MS READ_IOPS READ_CPU_MS" for binary $1.
run() {
	local n=$1 pid c0 out=()
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
		c0=$(ticks "$pid")
		fio --name=t --ioengine=nbd --uri="$uri" --rw=$rw --bs=4M --iodepth=16 --size=4G \
			--time_based --runtime="$RT" --output-format=json --output="$D/fio.json" >/dev/null
		out+=("$(python3 -c '
import json, os, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
ops = j["write"]["total_ios"] + j["read"]["total_ios"]
cpu = (int(sys.argv[3]) - int(sys.argv[2])) / os.sysconf("SC_CLK_TCK")
print(round(j["write"]["iops"] + j["read"]["iops"], 1), round(cpu / ops * 1e3, 2))' "$D/fio.json" "$c0" "$(ticks "$pid")")")
	done
	kill "$pid"
	wait "$pid" 2>/dev/null || true
	rm -rf "$D"
	echo "${out[*]}"
}

printf '| round | old 4M write | new 4M write | ratio | CPU/write old, new (ms) | old 4M read | new 4M read | ratio | CPU/read old, new (ms) |\n'
printf '| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n'
for r in $(seq "$ROUNDS"); do
	read -r ow owc or_ orc < <(run "$OLD")
	read -r nw nwc nr nrc < <(run "$NEW")
	python3 -c 'import sys; r, ow, nw, owc, nwc, o, n, oc, nc = sys.argv[1:]; print(f"| {r} | {ow} | {nw} | {float(nw)/float(ow):.2f} | {owc}, {nwc} | {o} | {n} | {float(n)/float(o):.2f} | {oc}, {nc} |")' "$r" "$ow" "$nw" "$owc" "$nwc" "$or_" "$nr" "$orc" "$nrc"
done
