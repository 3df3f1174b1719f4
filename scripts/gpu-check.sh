#!/usr/bin/env bash
# The checks that need a GPU, in one run: the GPU kernel tests, the GPU integration tests (real
# kvtierd processes with GPU pools and GPU client processes sharing them through CUDA IPC), the
# kernel tests again under compute-sanitizer's memcheck, the GPU bench suite, and llama.cpp with
# its KV cache on the GPU restoring from kvtier (when scripts/build-llama-cuda.sh built its CUDA
# back-end); then the cold suite, whose hot-lookup tail wants the cores a GPU machine has to spare.
# A machine without the build's libraries takes them from scripts/gpu-bundle.sh's bundle.
#
#   scripts/gpu-check.sh [BUILD_DIR] [OUT_DIR]     (defaults: build, gpu-check-out)
#
# BUILD_DIR is a CUDA build (KVTIER_CUDA=AUTO finds nvcc). Every step writes its log into OUT_DIR;
# the bench writes OUT_DIR/gpu.json. The last lines are a summary, one per step, and the exit
# status is non-zero when any step failed. Without a GPU every test skips and says why, and the
# bench's ratios are null: run it where there is one.
set -uo pipefail

build=${1:-build}
out=${2:-gpu-check-out}
mkdir -p "$out"
export GTEST_COLOR=no

summary=()
failed=0
step() {  # step NAME SECONDS COMMAND...: run it, log to OUT/NAME.log, remember the result
  local name=$1 seconds=$2
  shift 2
  local t0=$SECONDS
  timeout --kill-after=10 "$seconds" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  local took=$((SECONDS - t0))
  [ "$rc" -eq 0 ] || failed=1
  local found
  found=$(grep -E '^\[  (PASSED|FAILED|SKIPPED) *\] [0-9]+ tests?|ERROR SUMMARY|^[a-z0-9_]+_vs_[a-z0-9]+ ' \
    "$out/$name.log" | head -n 4 | tr -s ' \n' ' ')
  summary+=("$(printf '%-16s rc=%-3s %4ss  %s' "$name" "$rc" "$took" "$found")")
  echo "== $name: rc=$rc in ${took}s"
  tail -n 25 "$out/$name.log"
}

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi

step gpu_test 90 "$build/tests/kvtier_gpu_test"
step gpu_integration 180 "$build/tests/kvtier_gpu_integration_test"
step bench 150 "$build/bench/kvtier-bench" --suite gpu --reps 7 --json "$out/gpu.json"
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ -n "$sanitizer" ]; then
  step memcheck 120 "$sanitizer" --tool memcheck --leak-check full --error-exitcode 9 \
    "$build/tests/kvtier_gpu_test"
else
  summary+=("memcheck         skipped: no compute-sanitizer (PATH, /usr/local/cuda/bin)")
fi

# llama.cpp with its layers and KV cache on the GPU, restoring from kvtier: the llama suite with
# the CUDA back-end scripts/build-llama-cuda.sh builds (GGML_BACKEND_PATH), its ratios in
# OUT/llama-gpu.json. The back-end needs CUDA 13's libcudart and libcublas: the system's, else
# those of Python's nvidia packages (a PyTorch image has them).
cuda_backend=${KVTIER_LLAMA_CUDA_DIR:-.deps/llama.cpp-cuda}/libggml-cuda.so
if [ -f "$cuda_backend" ]; then
  if ! ldconfig -p | grep -q 'libcublas\.so\.13'; then
    # shellcheck source=scripts/cuda13-libs.sh
    . "$(dirname "$0")/cuda13-libs.sh"
    libs=$(cuda13_python_dirs | paste -sd:)
    if [ -n "$libs" ]; then export LD_LIBRARY_PATH=${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}; fi
  fi
  # The models are generated with NumPy: $KVTIER_PYTHON's (gpu-bundle.sh's env.sh sets it), else
  # Debian's python3, else the python3 on PATH.
  if [ -z "${KVTIER_PYTHON:-}" ] && ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
    export KVTIER_PYTHON=python3
  fi
  export GGML_BACKEND_PATH
  GGML_BACKEND_PATH=$(realpath "$cuda_backend")
  step llama_gpu 420 "$build/bench/kvtier-bench" --suite llama --reps 3 \
    --json "$out/llama-gpu.json"
  unset GGML_BACKEND_PATH
else
  summary+=("llama_gpu        skipped: no $cuda_backend (scripts/build-llama-cuda.sh)")
fi

# The cold suite's figures depend on cores to spare (hot_p99_under_spill; docs/performance.md):
# three repetitions, into OUT/cold.json. It needs db_bench on PATH for its anchors.
step cold 180 "$build/bench/kvtier-bench" --suite cold --reps 3 --json "$out/cold.json"

echo "== summary"
printf '%s\n' "${summary[@]}"
exit "$failed"
