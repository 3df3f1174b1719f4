#!/usr/bin/env bash
# The test command, from a fresh Debian 12 machine: install dependencies, build with warnings as
# errors, and run every test suite (unit tests and integration tests that start real kvtierd
# processes) through ctest; then build again with AddressSanitizer and UndefinedBehaviorSanitizer
# and run the whole suite under them (scripts/sanitize.sh asan: ~16 minutes on 2 cores, so CI
# stays well within its hour; docs/reliability.md). KVTIER_SANITIZE=0 skips that second part.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_DEPS:-0}" = 1 ] || bash scripts/install-deps.sh
bash scripts/build.sh -DKVTIER_WERROR=ON
cd build
ctest --output-on-failure -j "${KVTIER_JOBS:-2}" --timeout 300
cd ..
if [ "${KVTIER_SANITIZE:-1}" = 1 ]; then
  KVTIER_JOBS=${KVTIER_JOBS:-2} bash scripts/sanitize.sh asan
fi
