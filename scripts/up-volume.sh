# Shared by the scripts that measure a fresh one-machine cluster under fio
# (ab-4k.sh, profile.sh): source it after setting B (the nacre binary) and
# D (the run's directory, made anew). Starts `nacre up` in $D/c (3 OSDs of
# 4 GiB, NBD on $D/nbd.sock), makes a 2 GiB volume and prefills its first
# 1 GiB with 4 MiB writes. Gives
#   UP    the pid of `nacre up` (its OSDs are its children); killed by the
#         EXIT trap, which also deletes the OSDs' images (gigabytes each,
#         written by the prefill) unless KEEP is set; the rest of $D
#         (logs, fio's output) stays
#   URI   the volume's NBD URI, for fio's nbd engine
# UP_ARGS, if set, is added to `nacre up`'s arguments (e.g. --metrics ADDR);
# OSD_SIZE, if set, replaces the OSDs' 4G (e.g. 12G with --journal-size 6G);
# VOL_SIZE and PREFILL the volume's 2G and the prefill's 1G.
rm -rf "$D"; mkdir -p "$D"
"$B" up --dir "$D/c" --osd-size "${OSD_SIZE:-4G}" --nbd "unix:$D/nbd.sock" ${UP_ARGS:-} > "$D/up.log" 2>&1 &
UP=$!
trap 'kill $UP 2>/dev/null; wait $UP 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -f "$D"/c/osd.*.img' EXIT
for _ in $(seq 60); do [ -S "$D/nbd.sock" ] && "$B" status --dir "$D/c" >/dev/null 2>&1 && break; sleep 1; done
"$B" volume create v --size "${VOL_SIZE:-2G}" --dir "$D/c" >/dev/null
URI="nbd+unix:///v?socket=$D/nbd.sock"
fio --name=pre --ioengine=nbd --uri="$URI" --rw=write --bs=4M --iodepth=8 --size="${PREFILL:-1G}" >/dev/null
