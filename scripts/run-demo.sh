#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: install dependencies, build, start kvtierd on its
# embedded defaults (no flags: ./kvtier-data, a 1 GiB shared-memory pool), and run the two-process
# demo against it. The daemon is stopped at the end unless KEEP_RUNNING=1.
# Only the daemon and the CLI are built (scripts/test.sh builds everything else).
set -euo pipefail
cd "$(dirname "$0")/.."
[ "${SKIP_DEPS:-0}" = 1 ] || bash scripts/install-deps.sh
bash scripts/build.sh --target kvtierd kvtier

log=$(mktemp)
build/daemon/kvtierd >"$log" 2>&1 &
daemon=$!
stop() { kill -TERM "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true; }
[ "${KEEP_RUNNING:-0}" = 1 ] || trap stop EXIT
# Wait for the daemon to say it is ready (it exits at once if it cannot start).
for _ in $(seq 1 200); do
  grep -q "kvtierd ready" "$log" && break
  kill -0 "$daemon" 2>/dev/null || { cat "$log"; echo "kvtierd failed to start"; exit 1; }
  sleep 0.05
done
grep "kvtierd ready" "$log"
build/tools/kvtier demo
echo "kvtier stats:"
build/tools/kvtier stats
if [ "${KEEP_RUNNING:-0}" = 1 ]; then
  echo "kvtierd keeps running (pid $daemon, socket kvtier-data/kvtierd.sock, log $log)"
fi
