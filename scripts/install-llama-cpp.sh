#!/usr/bin/env bash
# Installs the prebuilt CPU build of llama.cpp that kvtier's llama.cpp integration links against
# (integrations/llama/). Debian 12 packages no llama.cpp; the npm registry serves the libraries
# that the node-llama-cpp project builds and publishes:
#   @node-llama-cpp/linux-x64   bins/linux-x64/: libllama, libggml, libggml-base and the CPU
#                               back-end variants (loaded at run time)
#   node-llama-cpp              llama/gitRelease.bundle: a git bundle of the matching llama.cpp
#                               source, from which we take include/ and ggml/include/
# Both are pinned to one version (the headers must match the binaries) and checked against the
# SHA-256 below. The tarballs are cached in ~/.cache/kvtier; the result goes to
# .deps/llama.cpp/{lib,include} of this checkout (or $KVTIER_LLAMA_CPP_DIR), where CMake finds it
# (cmake/FindLlamaCpp.cmake). Idempotent: a second run with the same pins does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=3.22.1
BINS_SHA256=0d953e1503d5ab4608d8ed5b739132308c81ac05ffeb760d2a7f30e08a9f90e0
SOURCE_SHA256=a0d9dd80eacd2ab1cfe71aee57ac8a806487fd70b3d2a38fbec637752d9e5c5f
DEST=${KVTIER_LLAMA_CPP_DIR:-$PWD/.deps/llama.cpp}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/kvtier
STAMP="node-llama-cpp $VERSION $BINS_SHA256 $SOURCE_SHA256"

if [ -f "$DEST/.installed" ] && [ "$(cat "$DEST/.installed")" = "$STAMP" ]; then
  exit 0
fi

if ! command -v npm >/dev/null; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends npm git
fi

# fetch NAME SHA256 FILE: `npm pack` NAME into the cache unless a good copy is there already.
fetch() {
  local name=$1 sha=$2 file=$3
  if [ -f "$CACHE/$file" ] && echo "$sha  $CACHE/$file" | sha256sum -c --status; then
    return
  fi
  rm -f "$CACHE/$file"
  (cd "$CACHE" && npm pack --silent "$name" >/dev/null)
  if ! echo "$sha  $CACHE/$file" | sha256sum -c --status; then
    echo "install-llama-cpp: $file does not match its pinned SHA-256; refusing it" >&2
    rm -f "$CACHE/$file"
    exit 1
  fi
}

mkdir -p "$CACHE"
fetch "@node-llama-cpp/linux-x64@$VERSION" "$BINS_SHA256" "node-llama-cpp-linux-x64-$VERSION.tgz"
fetch "node-llama-cpp@$VERSION" "$SOURCE_SHA256" "node-llama-cpp-$VERSION.tgz"

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
tar xzf "$CACHE/node-llama-cpp-linux-x64-$VERSION.tgz" -C "$WORK" package/bins/linux-x64
tar xzf "$CACHE/node-llama-cpp-$VERSION.tgz" -C "$WORK" package/llama/gitRelease.bundle
git init -q "$WORK/src"
git -C "$WORK/src" fetch -q "$WORK/package/llama/gitRelease.bundle" HEAD
mkdir -p "$WORK/out/lib" "$WORK/out/include" "$WORK/tree"
git -C "$WORK/src" archive FETCH_HEAD include ggml/include LICENSE | tar x -C "$WORK/tree"
cp "$WORK"/tree/include/*.h "$WORK"/tree/ggml/include/*.h "$WORK/out/include/"
cp "$WORK/tree/LICENSE" "$WORK/out/LICENSE.llama.cpp"
cp "$WORK"/package/bins/linux-x64/*.so "$WORK/out/lib/"
cp "$WORK/package/bins/linux-x64/_nlcBuildMetadata.json" "$WORK/out/"
echo "$STAMP" > "$WORK/out/.installed"

rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$WORK/out" "$DEST"
echo "install-llama-cpp: llama.cpp (node-llama-cpp $VERSION) in $DEST"
