#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs, for a GPU machine that has CUDA but not the libraries the
# build links (Cap'n Proto, RocksDB, UCX, ...): the GPU tests, the bench, kvtierd, the CLI and the
# test peers of BUILD_DIR (debug sections stripped), db_bench, llama.cpp's libraries (its CUDA
# back-end too, when scripts/build-llama-cuda.sh built it), every shared library those load that
# is not the C or C++ runtime or the CUDA driver, and .gpu-bundle/env.sh, which puts them on the
# paths.
#
#   scripts/gpu-bundle.sh [OUT.tar.xz] [BUILD_DIR]     (defaults: gpu-bundle.tar.xz, build)
#
# The binaries keep the checkout's absolute paths (the bench and the tests find kvtierd, and the
# llama suite its model generator, by them): unpack in a checkout at the same path as the build's,
# on a machine of the same architecture with a glibc at least as new as the build machine's.
#   tar xf gpu-bundle.tar.xz && . .gpu-bundle/env.sh && bash scripts/gpu-check.sh BUILD_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-gpu-bundle.tar.xz}")
build=${2:-build}

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
binaries=(bench/kvtier-bench daemon/kvtierd tools/kvtier tests/kvtier_gpu_test
  tests/kvtier_gpu_integration_test tests/kvtier_gpu_peer tests/kvtier_test_peer)
mkdir -p "$stage/.gpu-bundle/lib" "$stage/.gpu-bundle/bin" "$stage/.gpu-bundle/cudart"
for b in "${binaries[@]}"; do
  [ -x "$build/$b" ] || { echo "gpu-bundle: no $build/$b (build it first)" >&2; exit 1; }
  mkdir -p "$stage/$build/$(dirname "$b")"
  strip --strip-debug -o "$stage/$build/$b" "$build/$b"
done
if db_bench=$(command -v db_bench); then
  strip --strip-debug -o "$stage/.gpu-bundle/bin/db_bench" "$db_bench"
fi
mkdir -p "$stage/.deps"
for d in .deps/llama.cpp .deps/llama.cpp-cuda; do
  [ -d "$d" ] && cp -a "$d" "$stage/.deps/"
done

# The libraries they load, by their sonames. Left out: glibc's, libstdc++ and libgcc_s (the GPU
# machine's are as new or newer), the CUDA driver (the machine's own) and llama.cpp's (packed
# above, found by the binaries' run path). The CUDA runtime goes to a folder of its own, last on
# the path: the machine's own runtime, when it has one, matches its driver.
for f in "$stage/$build"/*/* "$stage/.gpu-bundle/bin"/*; do ldd "$f"; done |
  awk '$3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r name path; do
    case $name in
      libc.so* | libm.so* | libpthread.so* | libdl.so* | librt.so* | ld-linux*) ;;
      libstdc++.so* | libgcc_s.so* | libcuda.so* | libggml* | libllama*) ;;
      libcudart.so*) cp -L "$path" "$stage/.gpu-bundle/cudart/$name" ;;
      *) cp -L "$path" "$stage/.gpu-bundle/lib/$name" ;;
    esac
  done

cat >"$stage/.gpu-bundle/env.sh" <<'EOF'
# Source in the checkout the bundle was unpacked in: the bundle's libraries first, then CUDA 13's
# runtime and cuBLAS (the system's, or Python's nvidia packages'), then the bundle's runtime.
_bundle=$PWD/.gpu-bundle
_cuda=""  # ":dir:dir..."
# shellcheck source=scripts/cuda13-libs.sh
. scripts/cuda13-libs.sh
for _d in $(cuda13_python_dirs); do _cuda=$_cuda:$_d; done
for _d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -d "$_d" ] && _cuda=$_cuda:$_d
done
export LD_LIBRARY_PATH=$_bundle/lib$_cuda:$_bundle/cudart${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PATH=$_bundle/bin:$PATH
# The llama suite's model generator runs under the machine's python3 (with NumPy), without the
# bundle's libraries in its way.
printf '#!/bin/sh\nexec env -u LD_LIBRARY_PATH python3 "$@"\n' >"$_bundle/bin/python-numpy"
chmod +x "$_bundle/bin/python-numpy"
export KVTIER_PYTHON=$_bundle/bin/python-numpy
unset _bundle _cuda _d
EOF

tar -C "$stage" -cf "$out" --use-compress-program='xz -T0 -6' .
echo "gpu-bundle: $out ($(du -h "$out" | cut -f1)); on the GPU machine, in the checkout:" \
  "tar xf $(basename "$out") && . .gpu-bundle/env.sh && bash scripts/gpu-check.sh $build"
