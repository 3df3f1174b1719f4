#!/usr/bin/env bash
# Chaos: clients and daemons killed with SIGKILL at random points, checked for leaked pins and
# blocks, wrong bytes and failed starts (docs/reliability.md#chaos):
#
#   scripts/chaos.sh [--quick|--ctest] [--seed N] [--client-kills N] [--daemon-restarts N]
#                    [OPTIONS of tests/chaos/chaos.py: --batch-kills, --workers, --writers, ...]
#
#   (default)           1000 client kills, 100 daemon kill/restart cycles (~6 minutes on 2 cores)
#   --quick             500 and 50: a few minutes
#   --ctest             150 and 20: about a minute (the Chaos.Quick test)
#   --seed N            repeat a run (the seed is printed on the first line and in the JSON)
#   --no-mounts         skip the full-disk and read-only data directory cycles
#
# Uses the build tree $BUILD (default: build/): its kvtierd and its Python package, with Debian's
# /usr/bin/python3 (the interpreter the package is built for). As root, parts of the daemon loop
# run with the data directory on a small, full tmpfs and remounted read-only; without the right
# to mount they are skipped ("full_disk": "skipped"). Work files live in a directory of the run's
# own under $KVTIER_TEST_TMPDIR (else /tmp), removed at the end, on error and on Ctrl-C, as are
# the daemons, the client processes and the mounts.
#
# The last line is one JSON object: client_kills, daemon_restarts, bytes_checked, leaked_pins,
# leaked_blocks, wrong_bytes, failed_starts, errors, full_disk, read_only, seconds, and details.
# Exit status: 0 clean, 1 something leaked, a byte was wrong, a start failed or an untyped error
# happened, 2 bad usage or no daemon, 77 the Python package was not built (skipped).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
[[ $build == /* ]] || build=$root/$build
python=/usr/bin/python3

args=()
while [ $# -gt 0 ]; do
  case $1 in
    --quick) args+=(--profile quick) && shift ;;
    --ctest) args+=(--profile ctest) && shift ;;
    -h | --help) sed -n '2,24p' "$0" && exit 0 ;;
    *) args+=("$1") && shift ;;
  esac
done

kvtierd=$build/daemon/kvtierd
if [ ! -x "$kvtierd" ]; then
  echo "chaos: no daemon at $kvtierd (build first, or set BUILD)" >&2
  exit 2
fi
if ! compgen -G "$build/bindings/python/kvtier/_kvtier*.so" >/dev/null; then
  echo "chaos: skipped: the Python package was not built in $build (needs pybind11 and NumPy)" >&2
  exit 77
fi
if [ ! -x $python ] || ! $python -c 'import numpy' 2>/dev/null; then
  echo "chaos: skipped: $python with NumPy is needed" >&2
  exit 77
fi

tmp_root=${KVTIER_TEST_TMPDIR:-/tmp}
mkdir -p "$tmp_root"
# A short path: the daemons' Unix socket lives in it.
work=$(mktemp -d "$tmp_root/kvchaos.XXXXXX")
child=""

cleanup() {
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  # chaos.py unmounts what it mounted; this is for a run that was killed outright.
  local mounts
  mounts=$(awk -v w="$work" '$2 == w || index($2, w "/") == 1 {print $2}' /proc/mounts | sort -r)
  for m in $mounts; do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# chaos.py forks its clients from a process that has imported NumPy: one BLAS thread.
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 \
  PYTHONPATH="$build/bindings/python${PYTHONPATH:+:$PYTHONPATH}" \
  $python "$root/tests/chaos/chaos.py" --kvtierd "$kvtierd" --workdir "$work" \
  ${args[@]+"${args[@]}"} &
child=$!
status=0
wait "$child" || status=$?
child=""
exit "$status"
