#!/usr/bin/env bash
# Kills a fetching daemon (SIGKILL) at random moments of its start, its link and UCX endpoint setup
# to a holder, and its fetches, N times (default 200), and checks that the holder never dies and
# keeps no pin of a dead fetcher. Runs the GoogleTest
# ClusterFaults.FetchersKilledAtRandomMomentsNeverTakeTheHolderDown of the build in
# BUILD_DIR (default build/), from private copies of it and of kvtierd. A failed run's log is kept
# in the directory KEEP_LOGS names, if set.
# Usage: scripts/fetcher-kills.sh [--kills N] [--tcp] [--runs R]
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
build="${BUILD_DIR:-build}"
for f in "$build/tests/kvtier_cluster_integration_test" "$build/daemon/kvtierd"; do
  [[ -x "$f" ]] || { echo "$f is not built (bash scripts/build.sh)" >&2; exit 1; }
done
# Private copies: a rebuild while the runs go on does not pull the binaries from under them.
work=$(mktemp -d /tmp/kvtier-fetcher-kills.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp "$build/tests/kvtier_cluster_integration_test" "$build/daemon/kvtierd" "$work/"
test_bin="$work/kvtier_cluster_integration_test"
log="$work/run.log"
failed=0
for ((r = 1; r <= runs; r++)); do
  if env ${tls:+UCX_TLS=$tls} KVTIER_TEST_KILLS="$kills" KVTIER_TEST_KVTIERD="$work/kvtierd" \
      "$test_bin" \
      --gtest_filter='ClusterFaults.FetchersKilledAtRandomMomentsNeverTakeTheHolderDown' \
      > "$log" 2>&1; then
    echo "run $r: $kills kills, the holder survived every one"
  else
    failed=$((failed + 1))
    echo "run $r: FAILED: $(grep -m1 -E 'died at kill|Failure' "$log" || true)"
    grep -m1 -E 'Fatal|Assertion' "$log" || true
    [[ -n "${KEEP_LOGS:-}" ]] && cp "$log" "$KEEP_LOGS/fetcher-kills-run$r.log"
  fi
done
echo "{\"runs\": $runs, \"kills_per_run\": $kills, \"transports\": \"${tls:-default}\", \"failed_runs\": $failed}"
[[ $failed -eq 0 ]]
