#!/usr/bin/env bash
# Runs a command against a fresh kvtierd and cleans up after both, whatever happens:
#
#   with_daemon.sh KVTIERD COMMAND [ARGS...]
#
# Starts KVTIERD in a new temporary data directory (64 MiB host pool on 4 KiB pages, cold tier
# off, no GPUs), waits for its ready line, and runs COMMAND with KVTIER_SOCKET set to the daemon's
# socket. Then it stops the daemon and removes its data directory, socket and shared-memory
# segments — on success, failure, Ctrl-C or SIGTERM alike; if this script is killed outright, the
# daemon gets SIGTERM (parent-death signal) and unlinks its own socket and segments. Exits with
# COMMAND's status (77, "skipped", passes through); on a failure the daemon's last log lines are
# printed.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 KVTIERD COMMAND [ARGS...]" >&2; exit 2; }
kvtierd=$1
shift

# Under the run's own directory when ctest gives one (tests/clean_run/ checks it is left empty).
tmp=$(mktemp -d "${KVTIER_TEST_TMPDIR:-/tmp}/kvtier-with-daemon-XXXXXX")
pid="" segments="" command_pid=""
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "$command_pid" ] && kill -0 "$command_pid" 2>/dev/null; then
    kill -TERM "$command_pid" 2>/dev/null || true
    wait "$command_pid" 2>/dev/null || true
  fi
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    # A clean stop unlinks the socket and the segments; a daemon stuck for 10 s is killed.
    # (The watchdog's sleep holds none of our output: ctest does not wait for it.)
    kill -TERM "$pid" 2>/dev/null || true
    (sleep 10 && kill -KILL "$pid") >/dev/null 2>&1 &
    local watchdog=$!
    wait "$pid" 2>/dev/null || true
    kill "$watchdog" 2>/dev/null || true
  fi
  [ -z "$segments" ] || rm -f /dev/shm/"$segments"*
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && [ -s "$tmp/daemon.log" ]; then
    echo "--- last lines of the kvtierd log" >&2
    tail -n 20 "$tmp/daemon.log" >&2
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The daemon's stdout is a fifo: its ready line is read as it comes, with no polling.
mkfifo "$tmp/stdout"
setpriv --pdeathsig TERM -- "$kvtierd" --data-dir "$tmp/data" --host-pool-bytes 64M \
  --cold-tier off --gpus none --huge-pages off >"$tmp/stdout" 2>"$tmp/daemon.log" &
pid=$!
exec 3<"$tmp/stdout"
ready=""
while IFS= read -r -t 30 line <&3; do
  case $line in
    "kvtierd ready "*) ready=$line && break ;;
  esac
done
# Whatever the daemon prints later goes on being read, so it never blocks on a full pipe.
cat <&3 >/dev/null 2>&1 &
exec 3<&-
[ -n "$ready" ] || { echo "with_daemon: $kvtierd did not become ready within 30 s" >&2; exit 1; }
socket=$(sed 's/.* socket=\([^ ]*\).*/\1/' <<<"$ready")
segments=$(sed 's/.* segments=\([^ ]*\).*/\1/' <<<"$ready")

# In the background, so that a signal to this script is handled at once (bash runs traps only
# between commands); the cleanup stops the command too.
KVTIER_SOCKET=$socket "$@" &
command_pid=$!
rc=0
wait "$command_pid" || rc=$?
command_pid=""
exit "$rc"
