#!/usr/bin/env bash
# Builds llama.cpp's CUDA back-end (libggml-cuda.so) from the same pinned llama.cpp source as the
# CPU build that scripts/install-llama-cpp.sh installs, for the GPU architectures named, into
# .deps/llama.cpp-cuda/ (or $KVTIER_LLAMA_CUDA_DIR). With GGML_BACKEND_PATH naming it
# (llama.cpp's own variable for a back-end outside its folder), every llama.cpp program of kvtier
# (the llama bench suite, kvtier_llama_test, the examples) loads the CUDA back-end beside the CPU
# ones, and llama.cpp puts the model's layers and its KV cache on the GPU:
#   GGML_BACKEND_PATH=.deps/llama.cpp-cuda/libggml-cuda.so build/bench/kvtier-bench --suite llama
#
#   scripts/build-llama-cuda.sh [ARCHS]   (CMake CUDA architectures; default 90a-real: H100, H200)
#
# Why not the npm registry's CUDA build (@node-llama-cpp/linux-x64-cuda, the same version): its
# libggml-cuda.so is 159 MB (a 143 MB download), machine code for sm_86, sm_89, sm_120a and
# sm_121a and only PTX for Hopper, which the driver would compile at every fresh start; it needs
# the CUDA 13 runtime (libcudart.so.13, libcublas.so.13). Built here for one architecture the
# back-end is a fraction of that, and the same source makes it ABI-compatible with the CPU
# build's libggml-base.so, which it loads against.
#
# Needs nvcc (CUDA 12.8 or later; the back-end then needs that CUDA's libcudart and libcublas at
# run time), CMake and git. Takes about 20 minutes on 2 cores. Idempotent: a second run with the
# same pins and architectures does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

ARCHS=${1:-90a-real}
VERSION=3.22.1
SOURCE_SHA256=a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f
CPU_DIR=${KVTIER_LLAMA_CPP_DIR:-$PWD/.deps/llama.cpp}
DEST=${KVTIER_LLAMA_CUDA_DIR:-$PWD/.deps/llama.cpp-cuda}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kvtier
SOURCE="$CACHE/node-llama-cpp-$VERSION.tgz"
STAMP="node-llama-cpp $VERSION $SOURCE_SHA256 cuda $ARCHS"
JOBS=${KVTIER_JOBS:-$(nproc)}

if [ -f "$DEST/.installed" ] && [ "$(cat "$DEST/.installed")" = "$STAMP" ]; then
  exit 0
fi
NVCC=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$NVCC" ] || { echo "build-llama-cuda: no nvcc (PATH, /usr/local/cuda/bin)" >&2; exit 1; }

# The CPU build and the verified source archive (install-llama-cpp.sh keeps it in the cache).
bash scripts/install-llama-cpp.sh
if ! echo "$SOURCE_SHA256  $SOURCE" | sha256sum -c --status; then
  echo "build-llama-cuda: $SOURCE does not match its pinned SHA-256; refusing it" >&2
  exit 1
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
tar xzf "$SOURCE" -C "$WORK" package/llama/gitRelease.bundle
git init -q "$WORK/src"
git -C "$WORK/src" fetch -q "$WORK/package/llama/gitRelease.bundle" HEAD
mkdir -p "$WORK/tree"
git -C "$WORK/src" archive FETCH_HEAD | tar x -C "$WORK/tree"

# Only the CUDA back-end, as a loadable module (GGML_BACKEND_DL), as the CPU build's are; linked
# against libggml-base.so by that name (the CPU build's has no version in its soname) and with no
# run path into this build, which is removed; without NCCL, as the npm builds.
cmake -S "$WORK/tree" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
  -DCMAKE_PLATFORM_NO_VERSIONED_SONAME=ON -DCMAKE_SKIP_RPATH=ON \
  -DCMAKE_CUDA_COMPILER="$NVCC" -DCMAKE_CUDA_ARCHITECTURES="$ARCHS" \
  -DGGML_CUDA=ON -DGGML_CUDA_NCCL=OFF -DGGML_BACKEND_DL=ON -DGGML_NATIVE=OFF -DGGML_CPU=OFF \
  -DGGML_CCACHE=OFF \
  -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF >"$WORK/configure.log" ||
  { tail -n 30 "$WORK/configure.log" >&2; exit 1; }
cmake --build "$WORK/build" --target ggml-cuda -j "$JOBS"

mkdir -p "$WORK/out"
cp "$WORK"/build/bin/libggml-cuda.so "$WORK/out/" 2>/dev/null ||
  cp "$(find "$WORK/build" -name libggml-cuda.so | head -n 1)" "$WORK/out/"
cp "$CPU_DIR/LICENSE.llama.cpp" "$WORK/out/"
echo "$STAMP" >"$WORK/out/.installed"

rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$WORK/out" "$DEST"
echo "build-llama-cuda: llama.cpp's CUDA back-end ($ARCHS):" \
  "GGML_BACKEND_PATH=$DEST/libggml-cuda.so"
