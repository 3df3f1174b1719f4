#!/usr/bin/env bash
# Builds kvtier and runs the local benchmark suite: shared-pool get/put against memcpy, a lookup's
# round trip against a Unix-socket ping-pong, get/put against redis-server. Prints a table and
# writes bench/results/local.json. Extra arguments go to kvtier-bench (e.g. --reps 9).
set -euo pipefail
cd "$(dirname "$0")/.."
# The bench is on by default; say so anyway, in case build/ was configured without it.
bash scripts/build.sh -DKVTIER_BUILD_BENCH=ON
build/bench/kvtier-bench --suite local --json bench/results/local.json "$@"
