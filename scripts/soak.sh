#!/usr/bin/env bash
# Long soaks an operator can run (CI runs short versions of the same tests).
# Each prints what it did and ends with a one-line verdict; exit status 0
# means nothing was found.
#
#   scripts/soak.sh kill9 [ROUNDS]   kill -9 of `nacre up` under random 4 KiB FUA
#                                    writes over 256 MiB, ROUNDS times on one
#                                    cluster dir (default 50), every acknowledged
#                                    byte read back after each restart; then the
#                                    same with an 8 MiB journal so the kills land
#                                    inside folds and checkpoints
#   scripts/soak.sh crash [CASES]    the blockstore's model-based crash test
#                                    (power cuts and kills) with CASES random
#                                    sequences (default 20000)
#   scripts/soak.sh sim [SEEDS]      the cluster simulator's read invariant
#                                    over SEEDS seeds (default 10000)
set -euo pipefail
cd "$(dirname "$0")/.."

what=${1:-}
case "$what" in
kill9)
    rounds=${2:-50}
    log=target/soak-kill9.log
    mkdir -p target
    echo "== soak kill9: $rounds rounds, default journal, then $rounds with an 8 MiB journal (log: $log)"
    start=$(date +%s)
    if NACRE_KILL9_ROUNDS=$rounds cargo test --release --locked -p nacre-cli --test cluster \
        -- --test-threads 1 --nocapture kill9_ 2>&1 | tee "$log" | grep --line-buffered -E '^kill9 |panicked|wrong'; then
        :
    fi
    done_rounds=$(grep -c 'read back intact' "$log" || true)
    echo "== soak kill9: $done_rounds rounds completed in $(( $(date +%s) - start )) s"
    if grep -q 'test result: ok. 2 passed' "$log"; then
        echo "== soak kill9: nothing found"
    else
        echo "== soak kill9: FAILED (see $log)"
        exit 1
    fi
    ;;
crash)
    cases=${2:-20000}
    echo "== soak crash: $cases random sequences"
    NACRE_CRASH_CASES=$cases cargo test --release --locked -p nacre-blockstore \
        --features strict --test crash -- acknowledged_writes_survive_power_cuts
    echo "== soak crash: nothing found in $cases sequences"
    ;;
sim)
    seeds=${2:-10000}
    echo "== soak sim: $seeds seeds"
    NACRE_SIM_SEEDS=$seeds cargo test --release --locked -p nacre-sim --test sim \
        -- acknowledged_ops_survive_faults_and_crashes
    echo "== soak sim: nothing found in $seeds seeds"
    ;;
*)
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
