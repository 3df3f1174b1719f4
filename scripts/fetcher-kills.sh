#!/usr/bin/env bash
# Kills a fetching daemon (SIGKILL) at random moments of its start, its link and UCX endpoint setup
# to a holder, and its fetches, N times (default 200), and checks that the holder never dies and
# keeps no pin of a dead fetcher. Runs the GoogleTest
# ClusterFaults.DISABLED_FetchersKilledAtRandomMomentsNeverTakeTheHolderDown of the build in
# BUILD_DIR (default build/). Usage: scripts/fetcher-kills.sh [--kills N] [--tcp] [--runs R]
set -euo pipefail
cd "$(dirname "$0")/.."
kills=200 runs=1 tls=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --kills) kills="$2"; shift 2 ;;
    --runs) runs="$2"; shift 2 ;;
    --tcp) tls=tcp; shift ;;
    *) echo "usage: $0 [--kills N] [--runs R] [--tcp]" >&2; exit 2 ;;
  esac
done
test_bin="${BUILD_DIR:-build}/tests/kvtier_cluster_integration_test"
[[ -x "$test_bin" ]] || { echo "$test_bin is not built (bash scripts/build.sh)" >&2; exit 1; }
failed=0
for ((r = 1; r <= runs; r++)); do
  if env ${tls:+UCX_TLS=$tls} KVTIER_TEST_KILLS="$kills" "$test_bin" --gtest_also_run_disabled_tests \
      --gtest_filter='ClusterFaults.DISABLED_FetchersKilledAtRandomMomentsNeverTakeTheHolderDown' \
      > /tmp/kvtier-fetcher-kills.$$.log 2>&1; then
    echo "run $r: $kills kills, the holder survived every one"
  else
    failed=$((failed + 1))
    echo "run $r: FAILED: $(grep -m1 -E 'died at kill|Failure' /tmp/kvtier-fetcher-kills.$$.log || true)"
    grep -m1 -E 'Fatal|Assertion' /tmp/kvtier-fetcher-kills.$$.log || true
  fi
  rm -f /tmp/kvtier-fetcher-kills.$$.log
done
echo "{\"runs\": $runs, \"kills_per_run\": $kills, \"transports\": \"${tls:-default}\", \"failed_runs\": $failed}"
[[ $failed -eq 0 ]]
