#!/usr/bin/env bash
# Cluster chaos: etcd and 3-5 daemons, each in a network namespace of its own with its own address
# (veth pairs on a bridge, made and removed by this script), under a client load with every hit's
# bytes checked, while faults come at random: daemon SIGKILL and restart (cold tier on),
# SIGSTOP/SIGCONT, a node's link down and up, etcd killed and restarted, a byte flipped in a
# sealed block of a pool (docs/reliability.md#cluster-chaos):
#
#   scripts/cluster-chaos.sh [--quick] [--seed N] [--faults N] [--nodes N] [--clients N]
#                            [--rate R] [--ucx-tls TLS] [OPTIONS of tests/chaos/cluster_chaos.py]
#
#   (default)     320 faults, 4 daemons, 2 clients each (~8 minutes on 2 cores)
#   --quick       36 faults, 3 daemons (about 1.5 minutes; the ClusterChaos.Quick test)
#   --seed N      repeat a run (the seed is printed on the first line and in the JSON)
#   --ucx-tls T   UCX_TLS for the daemons (e.g. tcp; default: UCX's own choice)
#
# Needs root (network namespaces), iproute2, etcd, and the build tree $BUILD (default build/):
# its kvtierd, kvtier CLI and Python package, with Debian's /usr/bin/python3. The namespaces are
# named kvcc<pid>-*; they, the processes in them and the work directory under
# $KVTIER_TEST_TMPDIR (else /tmp) are removed at the end, on error and on Ctrl-C.
#
# The last line is one JSON object: faults (by kind), lookups, remote_hit_blocks, wrong_bytes,
# checksum_misses, daemon_crashes, lookups_over_deadline, leaked_pins, leaked_blocks, and details.
# Exit status: 0 clean, 1 a byte was wrong, a daemon crashed, a lookup ran over its deadline or
# something leaked, 2 bad usage or no build, 77 skipped (not root, no network namespaces, no etcd
# or no Python package).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
[[ $build == /* ]] || build=$root/$build
python=/usr/bin/python3

args=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) args+=(--profile quick) && shift ;;
    -h | --help) sed -n '2,27p' "$0" && exit 0 ;;
    *) args+=("$1") && shift ;;
  esac
done

skip() { echo "cluster-chaos: skipped: $*" >&2; exit 77; }
[ -x "$build/daemon/kvtierd" ] && [ -x "$build/tools/kvtier" ] ||
  { echo "cluster-chaos: no kvtierd or kvtier in $build (build first, or set BUILD)" >&2; exit 2; }
compgen -G "$build/bindings/python/kvtier/_kvtier*.so" >/dev/null ||
  skip "the Python package was not built in $build (needs pybind11 and NumPy)"
[ -x $python ] && $python -c 'import numpy' 2>/dev/null || skip "$python with NumPy is needed"
[ "$(id -u)" = 0 ] || skip "network namespaces need root"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
[ -x /usr/bin/etcd ] || skip "etcd is not installed (/usr/bin/etcd)"

prefix=kvcc$$
if ! ip netns add "$prefix-probe" 2>/dev/null; then
  skip "this machine does not allow network namespaces"
fi
ip netns del "$prefix-probe"

tmp_root=${KVTIER_TEST_TMPDIR:-/tmp}
mkdir -p "$tmp_root"
work=$(mktemp -d "$tmp_root/kvcc.XXXXXX")  # short: the daemons' sockets live in it
child=""

cleanup() {
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  # The driver removes what it made; this is for a driver that was killed outright.
  local ns
  for ns in $(ip netns list 2>/dev/null | awk -v p="$prefix-" 'index($1, p) == 1 {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  # Daemons killed with the driver leave their pools' segments (named in their ready lines).
  local seg
  for seg in $(grep -ho 'segments=[^ ]*' "$work"/n*.log 2>/dev/null | sort -u); do
    seg=${seg#segments=}
    [ -n "$seg" ] && rm -f /dev/shm/"$seg"* 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 \
  PYTHONPATH="$root/tests/chaos:$build/bindings/python${PYTHONPATH:+:$PYTHONPATH}" \
  $python "$root/tests/chaos/cluster_chaos.py" --kvtierd "$build/daemon/kvtierd" \
  --kvtier "$build/tools/kvtier" --workdir "$work" --netns-prefix "$prefix" \
  ${args[@]+"${args[@]}"} &
child=$!
status=0
wait "$child" || status=$?
child=""
exit "$status"
