#!/usr/bin/env bash
# The hit-rate figures of docs/replay.md: `kvtier replay` plays the Mooncake synthetic trace
# against fresh kvtierd processes (cold tier off) and compares each run with the anchors it
# computes in the same run (an ideal LRU of the same total capacity; isolated LRUs per node).
#
#   scripts/replay-figures.sh [--reps N] [--limit N] [--no-paced] [--out FILE.json] [--png FILE.png]
#
#   single node, capacity 20000 and 6000 blocks                 vs ideal LRU of the same capacity
#   3-node cluster (static peers on loopback), C = 6668 and 2000 vs ideal LRU of 3C (20004, 6000)
#     blocks each, route session and round-robin                   and 3 isolated LRUs of C
#   plus one paced run (--speedup 20, round-robin, C = 6668): the as-fast-as-possible runs are
#     checked against one that leaves the cluster's directory time to publish
#
# Every daemon this script starts is stopped on exit, error or Ctrl-C. Needs build/daemon/kvtierd
# and build/tools/kvtier (cmake --build build --target kvtierd kvtier), and python3-matplotlib for
# the PNG. Writes bench/results/replay.json and bench/results/replay.png.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
KVTIERD=$BUILD/daemon/kvtierd
KVTIER=$BUILD/tools/kvtier
TRACE=${TRACE:-$ROOT/../shared/traces/mooncake_synthetic_trace.jsonl}
OUT=$ROOT/bench/results/replay.json
PNG=$ROOT/bench/results/replay.png
REPS=5        # cluster runs are repeated (publishing is asynchronous); single-node runs are exact
LIMIT=0       # 0: the whole trace (3,993 requests, ~2-5 s per run here)
PACED=1
BLOCK_BYTES=1024  # tools/replay.h: one trace block = one 1 KiB kvtier block
SINGLE_CAPACITIES=(20000 6000)
# Multiples of 4: a pool is rounded down to whole 4 KiB pages, so these hold exactly C blocks.
CLUSTER_CAPACITIES=(6668 2000)
ROUTES=(session round-robin)

while [ $# -gt 0 ]; do
  case "$1" in
    --reps) REPS=$2; shift 2 ;;
    --limit) LIMIT=$2; shift 2 ;;
    --no-paced) PACED=0; shift ;;
    --out) OUT=$2; shift 2 ;;
    --png) PNG=$2; shift 2 ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "replay-figures: unknown argument $1" >&2; exit 2 ;;
  esac
done

for f in "$KVTIERD" "$KVTIER"; do
  [ -x "$f" ] || { echo "replay-figures: $f is missing (cmake --build build --target kvtierd kvtier)" >&2; exit 1; }
done
[ -r "$TRACE" ] || { echo "replay-figures: no trace at $TRACE (set TRACE=...)" >&2; exit 1; }
PYTHON=python3
[ -x /usr/bin/python3 ] && PYTHON=/usr/bin/python3  # Debian's sees python3-matplotlib

WORK=$(mktemp -d /tmp/kvtier-replay-XXXXXX)
PIDS=()     # the daemons running now
REPLAY=""   # the replay running now
stop_daemons() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
cleanup() {
  if [ -n "$REPLAY" ]; then
    kill -TERM "$REPLAY" 2>/dev/null || true
    wait "$REPLAY" 2>/dev/null || true
  fi
  stop_daemons
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'echo "replay-figures: interrupted" >&2; exit 130' INT
trap 'exit 143' TERM

# Private copies: a rebuild while the figures run does not pull the binaries from under them.
mkdir "$WORK/bin"
cp "$KVTIERD" "$KVTIER" "$WORK/bin/"
KVTIERD=$WORK/bin/kvtierd
KVTIER=$WORK/bin/kvtier

# start_daemon NAME BLOCKS [EXTRA ARGS...]: a fresh kvtierd whose pool holds BLOCKS replay blocks;
# returns once it prints "kvtierd ready".
start_daemon() {
  local name=$1 blocks=$2
  shift 2
  # The figures of docs/replay.md are LRU's (EVICTION=adaptive: the default policy's; the cache
  # policy's own figures: scripts/cache-policy-figures.sh).
  "$KVTIERD" --data-dir "$WORK/$name" --host-pool-bytes $((blocks * BLOCK_BYTES)) \
    --cold-tier off --gpus none --eviction "${EVICTION:-lru}" "$@" >"$WORK/$name.out" \
    2>"$WORK/$name.err" &
  PIDS+=($!)
  local pid=$! i
  for i in $(seq 200); do
    grep -q '^kvtierd ready' "$WORK/$name.out" 2>/dev/null && return 0
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "replay-figures: kvtierd $name did not start:" >&2
  cat "$WORK/$name.err" >&2
  exit 1
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Three loopback ports nothing listens on.
pick_ports() {
  local try base
  for try in $(seq 50); do
    base=$((20000 + RANDOM % 20000))
    if port_free "$base" && port_free $((base + 1)) && port_free $((base + 2)); then
      PORTS=("$base" $((base + 1)) $((base + 2)))
      return 0
    fi
  done
  echo "replay-figures: no free loopback ports" >&2
  exit 1
}

# start_cluster C: three fresh daemons of C blocks each, static peers, all members up.
start_cluster() {
  local capacity=$1 i j peers
  pick_ports
  for i in 0 1 2; do
    peers=""
    for j in 0 1 2; do
      [ "$j" != "$i" ] && peers="$peers${peers:+,}127.0.0.1:${PORTS[$j]}"
    done
    start_daemon "n$i" "$capacity" --listen "127.0.0.1:${PORTS[$i]}" --peers "$peers" --node-id "n$i"
  done
  for i in $(seq 200); do
    local up=0
    for j in 0 1 2; do
      up=$((up + $("$KVTIER" --socket "$WORK/n$j/kvtierd.sock" cluster | grep -c ' up' || true)))
    done
    [ "$up" -eq 9 ] && return 0
    sleep 0.05
  done
  echo "replay-figures: the cluster did not come up" >&2
  exit 1
}

RUN=0
# replay ARGS...: one run into $WORK/run-N.json; the table goes to stdout.
replay() {
  RUN=$((RUN + 1))
  local limit=()
  [ "$LIMIT" -gt 0 ] && limit=(--limit "$LIMIT")
  # In the background and waited for, so that a signal's trap runs at once, not after the run.
  "$KVTIER" replay "$TRACE" "${limit[@]}" --json "$WORK/run-$RUN.json" "$@" &
  REPLAY=$!
  wait "$REPLAY" || echo "replay-figures: run $RUN met errors (its table says which)" >&2
  REPLAY=""
  echo
}

START=$(date +%s)
echo "== single node vs ideal LRU"
for c in "${SINGLE_CAPACITIES[@]}"; do
  start_daemon single "$c"
  replay --nodes "$WORK/single/kvtierd.sock" --capacity "$c"
  stop_daemons
  rm -rf "$WORK/single"
done

echo "== three nodes (a cluster) vs ideal LRU of 3C and 3 isolated LRUs of C"
for c in "${CLUSTER_CAPACITIES[@]}"; do
  for route in "${ROUTES[@]}"; do
    for rep in $(seq "$REPS"); do
      start_cluster "$c"
      replay --nodes "$WORK/n0/kvtierd.sock,$WORK/n1/kvtierd.sock,$WORK/n2/kvtierd.sock" \
        --capacity "$c" --route "$route"
      stop_daemons
      rm -rf "$WORK"/n?
    done
  done
done

if [ "$PACED" -eq 1 ]; then
  echo "== paced: round-robin, C = ${CLUSTER_CAPACITIES[0]}, --speedup 20"
  start_cluster "${CLUSTER_CAPACITIES[0]}"
  replay --nodes "$WORK/n0/kvtierd.sock,$WORK/n1/kvtierd.sock,$WORK/n2/kvtierd.sock" \
    --capacity "${CLUSTER_CAPACITIES[0]}" --route round-robin --speedup 20
  stop_daemons
fi

SECONDS_TAKEN=$(($(date +%s) - START))
COMMAND="scripts/replay-figures.sh --reps $REPS"
[ "$LIMIT" -gt 0 ] && COMMAND="$COMMAND --limit $LIMIT"
[ "$PACED" -eq 0 ] && COMMAND="$COMMAND --no-paced"
mkdir -p "$(dirname "$OUT")"
"$PYTHON" "$ROOT/scripts/plot-replay.py" --merge "$OUT" \
  --meta "command=$COMMAND" \
  --meta "trace=$(basename "$TRACE")" \
  --meta "machine={\"nproc\": $(nproc), \"uname\": \"$(uname -sr)\"}" \
  --meta "commit=$(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)" \
  --meta "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  --meta "seconds=$SECONDS_TAKEN" \
  "$WORK"/run-*.json
echo "wrote $OUT"
if "$PYTHON" -c 'import matplotlib' 2>/dev/null; then
  "$PYTHON" "$ROOT/scripts/plot-replay.py" --out "$PNG" "$OUT"
  echo "wrote $PNG"
else
  echo "replay-figures: no matplotlib for $PYTHON (apt-get install python3-matplotlib): no PNG" >&2
fi
