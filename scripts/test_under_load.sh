#!/usr/bin/env bash
# The test command beside busy neighbours (issue 37: the suite must give the same result
# on a busy machine): starts N CPU-bound processes (`while True: pass`, default 2), runs
# scripts/test.sh with its arguments, stops them, and passes on its exit status.
#   scripts/test_under_load.sh            # two neighbours
#   BUSY=1 scripts/test_under_load.sh -x  # one, and pytest's -x
set -euo pipefail
cd "$(dirname "$0")/.."
pids=()
stop() { [ ${#pids[@]} -gt 0 ] && kill "${pids[@]}" 2>/dev/null || true; }
trap stop EXIT
for _ in $(seq "${BUSY:-2}"); do
    python3 -c 'while True: pass' &
    pids+=($!)
done
echo "== ${#pids[@]} CPU-bound neighbours: ${pids[*]}"
scripts/test.sh "$@"
