#!/usr/bin/env bash
# Configures and builds kvtier into ./build (2 parallel jobs: the project's machines have 2 cores).
# Extra arguments go to cmake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
cmake --build build -j "${KVTIER_JOBS:-2}"
