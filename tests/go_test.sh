#!/usr/bin/env bash
# The Go bindings' tests (bindings/go), as ctest runs them (Go.Bindings):
#
#   go_test.sh BUILD_DIR KVTIERD LIBDIR
#
# `go test` offline against this build tree: cgo finds libkvtier through BUILD_DIR/pkgconfig
# (kvtier.pc for the build tree, tests/CMakeLists.txt) and the binary finds libkvtier.so in LIBDIR
# by its rpath. Go's caches live under BUILD_DIR/go; nothing is downloaded (the module has no
# dependencies, GOPROXY=off). A daemon is started and cleaned up by with_daemon.sh. Exits 77
# (skipped) when no Go toolchain is installed.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 3 ] || { echo "usage: $0 BUILD_DIR KVTIERD LIBDIR" >&2; exit 2; }
if ! command -v go >/dev/null; then
  echo "SKIPPED: no Go toolchain (scripts/install-deps.sh installs Debian's golang-go)"
  exit 77
fi
build=$(cd "$1" && pwd)
export GOPATH=$build/go/path GOCACHE=$build/go/cache GOFLAGS=-buildvcs=false GOPROXY=off \
  GOSUMDB=off GO111MODULE=on GOTOOLCHAIN=local GOTELEMETRY=off CGO_ENABLED=1
export PKG_CONFIG_PATH=$build/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export CGO_LDFLAGS="-Wl,-rpath,$3"
cd "$here/../bindings/go"
go version
bash "$here/with_daemon.sh" "$2" go test -count=1 -v ./...
