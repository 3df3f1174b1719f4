#!/usr/bin/env bash
# Cold-tier damage: bytes flipped in the cold tier's files (tables, blob files, manifest, logs,
# CURRENT) while a real kvtierd serves prompts that live only on disk, with restarts (SIGTERM and
# SIGKILL) on whatever damage is left (docs/reliability.md, "The cold tier's own files"):
#
#   scripts/cold-damage.sh [--trials N] [--seed N]
#
#   (default)     10,000 trials (about 2.5 minutes on 2 cores); ctest runs 300
#   --trials N    trials: each flips 1-4 bytes, reads 3 prompts and checks every byte served,
#                 undoes the flips 9 times in 10; a restart every 50 trials
#   --seed N      repeat a run's choices (printed in the JSON)
#
# Uses the build tree $BUILD (default: build/): its kvtier_integration_test and kvtierd. Work files
# live under $KVTIER_TEST_TMPDIR (else /tmp) and are removed at the end, as are the daemons; the
# log of a failed run is kept (its path is printed).
# The last line is one JSON object: trials, flips, lookups, hits, misses, bytes_checked,
# wrong_bytes, aborts, failed_starts, restarts, quarantined, corrupt_dropped, errors, seed,
# seconds. Exit status: 0 clean; 1 a wrong byte, an abort, a failed start or an untyped error;
# 2 bad usage or no build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
[[ $build == /* ]] || build=$root/$build
trials=10000
seed=
while [ $# -gt 0 ]; do
  case $1 in
    --trials) trials=$2 && shift 2 ;;
    --seed) seed=$2 && shift 2 ;;
    -h | --help) sed -n '2,19p' "$0" && exit 0 ;;
    *) echo "unknown option $1 (see --help)" >&2 && exit 2 ;;
  esac
done
[[ $trials =~ ^[0-9]+$ && $trials -gt 0 ]] || { echo "--trials must be a positive number" >&2; exit 2; }
[[ -z $seed || $seed =~ ^[0-9]+$ ]] || { echo "--seed must be a number" >&2; exit 2; }
[ -n "$seed" ] || seed=$(( (RANDOM << 15 | RANDOM) ))  # a new run each time (ctest's is fixed)
test_binary=$build/tests/kvtier_integration_test
[ -x "$test_binary" ] || { echo "no $test_binary: build first (scripts/build.sh)" >&2; exit 2; }
log=$(mktemp "${KVTIER_TEST_TMPDIR:-/tmp}/kvtier-cold-damage-XXXXXX.log")
trap 'rm -f "$log"' EXIT
status=0
KVTIER_COLD_DAMAGE_TRIALS=$trials KVTIER_COLD_DAMAGE_SEED=$seed "$test_binary" \
  --gtest_filter='ColdDamage.*' >"$log" 2>&1 || status=1
if [ $status -ne 0 ]; then
  # The whole log of a failed run is kept, for its daemons' lines around the failure.
  cp "$log" "${log%.log}-failed.log" && echo "# log kept at ${log%.log}-failed.log" >&2
fi
# The daemons' own warnings, counted by kind (the full log is too long to keep).
grep -o 'event=[a-z_]*' "$log" | sort | uniq -c | sort -rn | sed 's/^/# /' >&2 || true
grep -E 'event=startup_failed|level=error' "$log" | head -20 >&2 || true
grep -E '^\[  FAILED|Failure' -A3 "$log" | grep -v '^{"ts' | head -40 >&2 || true
grep -E '^\{"trials"' "$log" || { echo "no result line" >&2; exit 1; }
exit $status
