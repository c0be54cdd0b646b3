#!/usr/bin/env bash
# Runs the set-up commands at the top of the README exactly as written
# (its first ```sh block), from the checkout's root, so CI proves that
# they work on a fresh machine. The test command is skipped when
# NACRE_README_SKIP_TESTS=1 (CI has just run it); every other command runs.
set -euo pipefail
cd "$(dirname "$0")/.."

mapfile -t cmds < <(awk '/^```sh$/ {inside = 1; next} inside && /^```$/ {exit} inside' README.md |
    grep -Ev '^[[:space:]]*(#|$)')
if [ ${#cmds[@]} -ne 2 ]; then
    echo "README: expected two set-up commands at the top, found ${#cmds[@]}: ${cmds[*]}" >&2
    exit 1
fi
for c in "${cmds[@]}"; do
    if [ "$c" = "./scripts/test.sh" ] && [ "${NACRE_README_SKIP_TESTS:-0}" = 1 ]; then
        echo "== README: $c (ran above)"
        continue
    fi
    echo "== README: $c"
    bash -c "$c"
done
