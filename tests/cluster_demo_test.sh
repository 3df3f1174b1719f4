#!/usr/bin/env bash
# The deployment files, checked without Docker (tests/CMakeLists.txt registers both, label
# `cluster`; exit 77 means skipped):
#   cluster_demo_test.sh compose-config   docker-compose.yml is a valid compose file
#   cluster_demo_test.sh demo BUILD_DIR   scripts/cluster-demo.sh passes against BUILD_DIR's
#                                         kvtierd and kvtier (no dependencies, no build)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
case "${1:-}" in
  compose-config)
    if command -v docker-compose >/dev/null; then
      compose=(docker-compose)
    elif docker compose version >/dev/null 2>&1; then
      compose=(docker compose)
    else
      echo "SKIPPED: no docker-compose (scripts/install-deps.sh installs Debian's)"
      exit 77
    fi
    # The token file need not exist for the check; point the secret at a path that is never read.
    KVTIER_CLUSTER_TOKEN=/nonexistent/cluster-token \
      "${compose[@]}" --project-directory "$root" -f "$root/docker-compose.yml" config -q
    echo "${compose[*]} config -q: docker-compose.yml is valid"
    ;;
  demo)
    [ $# -eq 2 ] || { echo "usage: $0 demo BUILD_DIR" >&2; exit 2; }
    # Its files under the run's own directory when ctest gives one (tests/clean_run/).
    TMPDIR=${KVTIER_TEST_TMPDIR:-${TMPDIR:-/tmp}} SKIP_DEPS=1 SKIP_BUILD=1 KVTIER_BUILD_DIR=$2 \
      timeout 60 bash "$root/scripts/cluster-demo.sh"
    ;;
  *)
    echo "usage: $0 compose-config | demo BUILD_DIR" >&2
    exit 2
    ;;
esac
