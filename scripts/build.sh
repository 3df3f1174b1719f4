#!/usr/bin/env bash
# Configures and builds kvtier into ./build (2 parallel jobs: the project's machines have 2 cores).
# Arguments before `--target` go to cmake's configure step; `--target T...` builds only those
# targets (and what they need) instead of everything.
set -euo pipefail
cd "$(dirname "$0")/.."
configure=()
targets=()
while [ $# -gt 0 ]; do
  if [ "$1" = --target ]; then
    shift
    targets=("$@")
    break
  fi
  configure+=("$1")
  shift
done
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "${configure[@]}" >/dev/null
if [ ${#targets[@]} -gt 0 ]; then
  cmake --build build -j "${KVTIER_JOBS:-2}" --target "${targets[@]}"
else
  cmake --build build -j "${KVTIER_JOBS:-2}"
fi
