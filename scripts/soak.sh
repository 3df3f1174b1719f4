#!/usr/bin/env bash
# Soak and load: many client processes doing put/lookup/get/remove (and begin_put/commit,
# copy_prefix, snapshot/restore, truncate) against one kvtierd for a long while, checking that the
# daemon's memory and file descriptors stay bounded, that only typed errors happen, that every byte
# read is right, and that nothing is leaked at the end (docs/reliability.md#soak):
#
#   scripts/soak.sh [--clients N] [--minutes M | --seconds S] [--ctest] [--seed N]
#                   [OPTIONS of tests/soak/soak.py: --pool, --disk-bytes, --interval, ...]
#
#   (default)           64 client processes for 10 minutes (and a few seconds to start and stop)
#   --ctest             16 clients for 30 s: about 35 s in all (the Soak.Quick test)
#   --clients N         client processes alive at a time (each replaced when it ends)
#   --minutes M         minutes of load (or --seconds S)
#   --seed N            repeat a run's choices (not its timing); printed first and in the JSON
#
# Uses the build tree $BUILD (default: build/): its kvtierd and its Python package, with Debian's
# /usr/bin/python3 (the interpreter the package is built for). Work files (the daemon's data
# directory and socket, the clients' reports) live in a directory of the run's own under
# $KVTIER_TEST_TMPDIR (else /tmp), removed at the end, on error, on SIGTERM and on Ctrl-C, as are
# the daemon, the client processes and the daemon's shared-memory segments.
#
# The last line is one JSON object: clients, seconds, calls (total and per kind: count, p50_us,
# p99_us, max_us, typed_errors), untyped_errors, wrong_bytes, resources (RSS and descriptor
# samples, slopes), bounded, leaked_sessions, leaked_leases, leaked_pins, daemon_exit, ...
# Exit status: 0 clean; 1 an untyped error, a wrong byte, unbounded growth, a leak, or a daemon
# that died or did not exit 0 on SIGTERM; 2 bad usage or no daemon; 77 the Python package was not
# built (skipped).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
[[ $build == /* ]] || build=$root/$build
python=/usr/bin/python3

args=()
while [ $# -gt 0 ]; do
  case $1 in
    --ctest) args+=(--profile ctest) && shift ;;
    --minutes)
      [ $# -ge 2 ] || { echo "soak: --minutes needs a value" >&2; exit 2; }
      args+=(--seconds "$(awk -v m="$2" 'BEGIN { printf "%g", m * 60 }')") && shift 2 ;;
    -h | --help) sed -n '2,28p' "$0" && exit 0 ;;
    *) args+=("$1") && shift ;;
  esac
done

kvtierd=$build/daemon/kvtierd
if [ ! -x "$kvtierd" ]; then
  echo "soak: no daemon at $kvtierd (build first, or set BUILD)" >&2
  exit 2
fi
if ! compgen -G "$build/bindings/python/kvtier/_kvtier*.so" >/dev/null; then
  echo "soak: skipped: the Python package was not built in $build (needs pybind11 and NumPy)" >&2
  exit 77
fi
if [ ! -x $python ] || ! $python -c 'import numpy' 2>/dev/null; then
  echo "soak: skipped: $python with NumPy is needed" >&2
  exit 77
fi

tmp_root=${KVTIER_TEST_TMPDIR:-/tmp}
mkdir -p "$tmp_root"
# A short path: the daemon's Unix socket lives in it.
work=$(mktemp -d "$tmp_root/kvsoak.XXXXXX")
child=""

cleanup() {
  if [ -n "$child" ] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null || true
    wait "$child" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# soak.py forks its clients from a process that has imported NumPy: one BLAS thread.
OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1 \
  PYTHONPATH="$build/bindings/python${PYTHONPATH:+:$PYTHONPATH}" \
  $python "$root/tests/soak/soak.py" --kvtierd "$kvtierd" --workdir "$work" \
  ${args[@]+"${args[@]}"} &
child=$!
status=0
wait "$child" || status=$?
child=""
exit "$status"
