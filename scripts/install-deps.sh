#!/usr/bin/env bash
# Installs kvtier's build and test dependencies from Debian 12 packages.
# Each one is chosen on purpose; docs/dependencies.md says why.
set -euo pipefail
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake pkg-config \
  capnproto libcapnp-dev \
  libboost-dev \
  libssl-dev \
  libxxhash-dev \
  libgtest-dev \
  libhiredis-dev redis-server \
  librocksdb-dev rocksdb-tools \
  libucx-dev ucx-utils \
  etcd-server etcd-client \
  docker-compose \
  python3-matplotlib \
  python3-dev pybind11-dev python3-numpy python3-pytest python3-torch \
  mypy python3-typeshed \
  golang-go
# llama.cpp's prebuilt CPU libraries and matching headers, from the npm registry (no Debian
# package): the llama.cpp integration and its tests use them.
bash "$(dirname "$0")/install-llama-cpp.sh"
