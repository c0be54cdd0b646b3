#!/usr/bin/env bash
# Nacre's test command: formatting, lints, and every test in the workspace.
# Installs what it needs (rustfmt and clippy through rustup); the tests of
# this stage need nothing else (they run on files, memory and the fault
# device). Run from anywhere inside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."

if command -v rustup >/dev/null 2>&1; then
    for c in rustfmt clippy; do
        rustup component list --installed 2>/dev/null | grep -q "^$c" || rustup component add "$c"
    done
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
# 2 000 random crash sequences by default; NACRE_CRASH_CASES changes it.
cargo test --workspace --locked --features nacre-blockstore/strict 2>&1 | tee target/test.log
echo "== summary"
passed=$(grep -Eo '[0-9]+ passed' target/test.log | awk '{s += $1} END {print s + 0}')
failed=$(grep -Eo '[0-9]+ failed' target/test.log | awk '{s += $1} END {print s + 0}')
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
