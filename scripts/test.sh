#!/usr/bin/env bash
# The test command, from a fresh Debian 12 machine: install dependencies, build with warnings as
# errors, and run every test suite (unit tests and integration tests that start real kvtierd
# processes) through ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_DEPS:-0}" = 1 ] || bash scripts/install-deps.sh
bash scripts/build.sh -DKVTIER_WERROR=ON
cd build
ctest --output-on-failure -j "${KVTIER_JOBS:-2}" --timeout 300
