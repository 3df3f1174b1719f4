#!/usr/bin/env bash
# The installable package, end to end (tests/CMakeLists.txt registers it as
# SdkPackage.InstallAndConsume):
#
#   sdk_package_test.sh BUILD_DIR           the SDK (SdkPackage.InstallAndConsume)
#   sdk_package_test.sh --llama BUILD_DIR   the llama.cpp integration (SdkPackage.LlamaConsumer):
#                                           steps 1, 2, 3 and 5 for kvtier/llama.h and
#                                           kvtier::llama; exit 77 when kvtier was built without
#                                           llama.cpp
#
# 1. `cmake --install BUILD_DIR --prefix P` into a temporary P, which must hold the binaries, the
#    headers, libkvtier.a and libkvtier.so, the CMake package and kvtier.pc, none of them naming
#    the build or source tree.
# 2. Every installed header compiles on its own (kvtier.h also as strict C99).
# 3. tests/consumer/, a separate project of C++ alone, is configured with find_package(kvtier) and
#    built against kvtier::client (libkvtier.so) and kvtier::client_static (libkvtier.a);
#    tests/consumer_c/, a project of C alone, against kvtier::client. With --llama: tests/consumer
#    with find_package(kvtier COMPONENTS llama) builds consumer_llama against kvtier::llama.
# 4. The same sources are built with a bare compiler and pkg-config (kvtier.pc), shared and
#    static (pkg-config --static).
# 5. Every consumer runs against P's own kvtierd (tests/with_daemon.sh), and P's kvtier tool reads
#    the daemon's counters. With --llama: consumer_llama, on a model integrations/llama/make_gguf.py
#    generates, stores a prompt's KV and restores it into an empty sequence.
# Everything is made under one temporary directory, removed on any exit; with_daemon.sh cleans up
# the daemon, its socket and its segments.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

# Step 5, run by with_daemon.sh: consume DIR (the temporary directory of the steps before).
if [ "${1:-}" = consume-llama ]; then
  "$2"/consumer/consumer_llama "$2"/model.gguf || { echo "FAILED: consumer_llama" >&2; exit 1; }
  exit 0
fi
if [ "${1:-}" = consume ]; then
  tmp=$2
  for exe in "$tmp"/consumer/consumer_shared "$tmp"/consumer/consumer_static \
    "$tmp"/consumer_c/consumer_c "$tmp"/pc/consumer "$tmp"/pc/consumer_static "$tmp"/pc/consumer_c; do
    name="$(basename "$(dirname "$exe")")-$(basename "$exe")"
    "$exe" "$name" || { echo "FAILED: $exe" >&2; exit 1; }
  done
  stats=$("$tmp"/prefix/bin/kvtier stats)
  grep -q '"hits": [1-9]' <<<"$stats" || { echo "FAILED: kvtier stats: $stats" >&2; exit 1; }
  echo "installed kvtier stats: $(grep -o '"hits": [0-9]*' <<<"$stats")"
  exit 0
fi

llama=0
if [ "${1:-}" = --llama ]; then
  llama=1
  shift
fi
[ $# -eq 1 ] || { echo "usage: $0 [--llama] BUILD_DIR" >&2; exit 2; }
build=$(cd "$1" && pwd)
src=$(cd "$here/.." && pwd)
cache_value() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
cc=$(cache_value CMAKE_C_COMPILER)
cxx=$(cache_value CMAKE_CXX_COMPILER)

tmp=$(mktemp -d "${KVTIER_TEST_TMPDIR:-/tmp}/kvtier-package-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
fail() { echo "FAILED: $*" >&2; exit 1; }

# 1. Install.
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || {
  cat "$tmp/install.log" >&2
  fail "cmake --install"
}
pc=$(find "$prefix" -name kvtier.pc)
[ -n "$pc" ] || fail "no kvtier.pc under $prefix"
libdir=$(dirname "$(dirname "$pc")")
for f in bin/kvtierd bin/kvtier include/kvtier/client.h include/kvtier/kvtier.h \
  include/kvtier/error.h include/kvtier/layout.h include/kvtier/block_key.h; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
for f in libkvtier.a libkvtier.so cmake/kvtier/kvtierConfig.cmake \
  cmake/kvtier/kvtierConfigVersion.cmake cmake/kvtier/kvtierSharedTargets.cmake \
  cmake/kvtier/kvtierStaticTargets.cmake; do
  [ -e "$libdir/$f" ] || fail "${libdir#"$prefix"/}/$f is not installed"
done
if grep -rl -e "$build" -e "$src" "$libdir/cmake" "$libdir/pkgconfig"; then
  fail "the files above name the build or source tree: the prefix would not be relocatable"
fi
echo "installed into $prefix: $(cd "$prefix" && find . -type f -o -type l | sort | tr '\n' ' ')"

# A sanitizer build's library needs the sanitizer's runtime in every program that links it:
# scripts/sanitize.sh passes its flags in KVTIER_CONSUMER_FLAGS (empty otherwise).
extra=${KVTIER_CONSUMER_FLAGS:-}

# Configures the consumer project tests/NAME against the installed package into $tmp/NAME (with
# the cmake arguments after TARGET: the compiler and its flags) and builds TARGET there.
build_consumer() {
  local name=$1 target=$2
  shift 2
  cmake -S "$here/$name" -B "$tmp/$name" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_EXE_LINKER_FLAGS="$extra" "$@" >"$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log" >&2; fail "configuring tests/$name"; }
  cmake --build "$tmp/$name" -j 1 --target "$target" >>"$tmp/$name.log" 2>&1 ||
    { cat "$tmp/$name.log" >&2; fail "building $target of tests/$name"; }
}

# The llama.cpp integration: its own header, library and package files, and a consumer.
if [ $llama = 1 ]; then
  if [ ! -e "$prefix/include/kvtier/llama.h" ]; then
    echo "SKIPPED: this kvtier was built without llama.cpp (scripts/install-llama-cpp.sh), so" \
      "it installs no kvtier/llama.h"
    exit 77
  fi
  for f in libkvtier-llama.a cmake/kvtier/kvtierLlamaTargets.cmake cmake/kvtier/FindLlamaCpp.cmake; do
    [ -e "$libdir/$f" ] || fail "${libdir#"$prefix"/}/$f is not installed"
  done
  llama_dir=$(cache_value KVTIER_LLAMA_CPP_DIR)
  echo "#include <kvtier/llama.h>" |
    "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Werror -I"$prefix/include" \
      -I"$llama_dir/include" -x c++ - || fail "llama.h does not compile on its own"
  # A project of C++ alone, the llama component required.
  build_consumer consumer consumer_llama -DCMAKE_CXX_COMPILER="$cxx" \
    -DCMAKE_CXX_FLAGS="$extra" -DWITH_LLAMA=ON -DKVTIER_LLAMA_CPP_DIR="$llama_dir"
  /usr/bin/python3 "$src/integrations/llama/make_gguf.py" --out "$tmp/model.gguf" >/dev/null ||
    fail "make_gguf.py"
  bash "$here/with_daemon.sh" "$prefix/bin/kvtierd" bash "$0" consume-llama "$tmp"
  echo "the installed package builds a llama.cpp program on kvtier/llama.h (kvtier::llama) that works"
  exit 0
fi

# 2. Each header on its own (kvtier/llama.h, which needs llama.cpp's headers, with --llama).
for h in "$prefix"/include/kvtier/*.h; do
  [ "$(basename "$h")" = llama.h ] && continue
  echo "#include <kvtier/$(basename "$h")>" |
    "$cxx" -std=c++20 -fsyntax-only -Wall -Wextra -Werror -I"$prefix/include" -x c++ - ||
    fail "$(basename "$h") does not compile on its own"
done
echo "#include <kvtier/kvtier.h>" |
  "$cc" -std=c99 -pedantic-errors -fsyntax-only -Wall -Wextra -Werror -I"$prefix/include" -x c - ||
  fail "kvtier.h is not strict C99"

# 3. find_package(kvtier).
build_consumer consumer all -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_CXX_FLAGS="$extra"
build_consumer consumer_c all -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$extra"
readelf -d "$tmp/consumer/consumer_shared" | grep -q 'NEEDED.*libkvtier\.so' ||
  fail "consumer_shared does not link libkvtier.so"
if readelf -d "$tmp/consumer/consumer_static" | grep -q 'NEEDED.*libkvtier'; then
  fail "consumer_static links libkvtier.so, not libkvtier.a"
fi

# 4. pkg-config.
export PKG_CONFIG_PATH=$libdir/pkgconfig
[ "$(pkg-config --modversion kvtier)" = "$(sed -n 's/^Version: //p' "$pc")" ] ||
  fail "pkg-config does not find kvtier.pc"
mkdir "$tmp/pc"
# shellcheck disable=SC2046,SC2086 # the flags are words
{
  "$cxx" -std=c++20 $extra "$here/consumer/consumer.cc" -o "$tmp/pc/consumer" \
    $(pkg-config --cflags --libs kvtier) -Wl,-rpath,"$libdir" &&
    "$cc" -std=c99 $extra "$here/consumer_c/consumer_c.c" -o "$tmp/pc/consumer_c" \
      $(pkg-config --cflags --libs kvtier) -Wl,-rpath,"$libdir" &&
    "$cxx" -std=c++20 $extra "$here/consumer/consumer.cc" -o "$tmp/pc/consumer_static" \
      $(pkg-config --cflags --static --libs kvtier | sed 's/-lkvtier\b/-l:libkvtier.a/') \
      $(pkg-config --static --libs-only-L kvtier | sed 's/-L/-Wl,-rpath,/g')
} || fail "building with pkg-config"
if readelf -d "$tmp/pc/consumer_static" | grep -q 'NEEDED.*libkvtier'; then
  fail "pkg-config --static linked libkvtier.so"
fi

# 5. Run them all against the installed daemon.
bash "$here/with_daemon.sh" "$prefix/bin/kvtierd" bash "$0" consume "$tmp"
echo "the installed package builds consumers (CMake, pkg-config; shared, static) that work"
