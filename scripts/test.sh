#!/usr/bin/env bash
# Nacre's test command: formatting, lints, and every test in the workspace.
# Installs what it needs: rustfmt and clippy through rustup, and the real
# NBD clients the cluster tests drive (Debian: libnbd-bin for nbdinfo and
# nbdcopy, qemu-utils for qemu-img, fio for its nbd engine), and etcd
# (etcd-server) for the etcd meta store's tests, which start their own
# members on free loopback ports, and iproute2 for the multi-host tests,
# whose hosts are network namespaces (they need root), losetup (mount)
# and mkfs.ext4 (e2fsprogs) for `nacre disk check` on loop devices (root
# too), curl, Python's Prometheus parser (python3-prometheus-client) and
# Prometheus itself with promtool (prometheus; its service is not started)
# to scrape, parse, lint and query the `--metrics` endpoints, a TrueType font (fonts-dejavu-core) for `nacre bench --plot`, and
# ISA-L
# (libisal-dev) for the erasure code, which the tests then require
# (NACRE_REQUIRE_ISAL: its pure-Rust fallback is tested against it). Run
# from anywhere inside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v rustup >/dev/null 2>&1; then
    for c in rustfmt clippy; do
        rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
    done
fi

need=()
command -v nbdinfo >/dev/null 2>&1 || need+=(libnbd-bin)
command -v nbdcopy >/dev/null 2>&1 || need+=(libnbd-bin)
command -v qemu-img >/dev/null 2>&1 || need+=(qemu-utils)
command -v fio >/dev/null 2>&1 || need+=(fio)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v losetup >/dev/null 2>&1 || need+=(mount)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v curl >/dev/null 2>&1 || need+=(curl)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
# (Debian's own Python: a python3 earlier in PATH may not see the package.)
/usr/bin/python3 -c 'import prometheus_client' >/dev/null 2>&1 || need+=(python3-prometheus-client)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core)
compgen -G '/usr/lib/*/libisal.so.2' >/dev/null || need+=(libisal-dev)
if [ ${#need[@]} -gt 0 ]; then
    echo "== apt-get install ${need[*]}"
    sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
# 2 000 random crash sequences by default; NACRE_CRASH_CASES changes it.
export NACRE_REQUIRE_ISAL=1
# Into a file, followed until cargo ends (not through a pipe: a process
# that a failed test left behind would hold a pipe open, and this script
# with it, until that process ends).
mkdir -p target
cargo test --workspace --locked --features nacre-blockstore/strict >target/test.log 2>&1 &
cargo_pid=$!
trap 'kill "$cargo_pid" 2>/dev/null || true' EXIT
tail -n +1 -f --pid="$cargo_pid" target/test.log
status=0
wait "$cargo_pid" || status=$?
echo "== summary"
passed=$(grep -Eo '[0-9]+ passed' target/test.log | awk '{s += $1} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed' target/test.log | awk '{s += $1} END {print s + 0}')
echo "$passed passed, $failed failed (cargo test exited $status)"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
