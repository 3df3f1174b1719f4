#!/usr/bin/env bash
# The figures of docs/cache-policy.md: `kvtier replay` against fresh kvtierd processes, each run
# beside the anchor the replay computes in the same run (an ideal LRU of the same capacity).
#
#   scripts/cache-policy-figures.sh [--hit] [--speed] [--reps N] [--out FILE.json]
#
#   --hit    hit rates (cold tier off): the shared trace and three synthetic workloads
#            (kvtier replay --synthetic), capacities 6000 and 20000 blocks, --eviction lru and
#            arc, puts of the missed blocks and whole puts; and the shared trace with the cold
#            tier on (a disk that holds everything), both policies and put modes
#   --speed  the cold tier's cost: requests per second of the shared trace with the cold tier on
#            and off, REPS runs each, interleaved (on, off, on, off, ...), capacities 6000 and
#            20000, both policies; the ratio on/off per pair of runs, median and min-max
#   (neither: both)
#
# Every daemon this script starts is stopped on exit, error or Ctrl-C. Needs BUILD (default
# build/) with daemon/kvtierd and tools/kvtier. Writes bench/results/cache-policy.json.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
KVTIERD=$BUILD/daemon/kvtierd
KVTIER=$BUILD/tools/kvtier
TRACE=${TRACE:-$ROOT/../shared/traces/mooncake_synthetic_trace.jsonl}
OUT=$ROOT/bench/results/cache-policy.json
REPS=5
HIT=0
SPEED=0
CAPACITIES=(6000 20000)
POLICIES=(lru arc)

while [ $# -gt 0 ]; do
  case "$1" in
    --hit) HIT=1; shift ;;
    --speed) SPEED=1; shift ;;
    --reps) REPS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "cache-policy-figures: unknown argument $1" >&2; exit 2 ;;
  esac
done
if [ $HIT = 0 ] && [ $SPEED = 0 ]; then HIT=1; SPEED=1; fi
for f in "$KVTIERD" "$KVTIER"; do
  [ -x "$f" ] || { echo "cache-policy-figures: $f is missing (cmake --build build --target kvtierd kvtier)" >&2; exit 1; }
done
[ -r "$TRACE" ] || { echo "cache-policy-figures: no trace at $TRACE (set TRACE=...)" >&2; exit 1; }

WORK=$(mktemp -d /tmp/kvtier-policy-XXXXXX)
DAEMON=""
cleanup() {
  if [ -n "$DAEMON" ]; then kill -TERM "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

RUNS=$WORK/runs.jsonl
: > "$RUNS"

# run NAME POLICY CAPACITY COLD SOURCE... -- REPLAY-ARGS...: one replay against a fresh daemon;
# appends {"name", "policy", "cold", "run": <kvtier replay's run>} to $RUNS.
run() {
  local name=$1 policy=$2 capacity=$3 cold=$4
  shift 4
  local dir=$WORK/d
  rm -rf "$dir"
  mkdir -p "$dir"
  # One trace block = one 1 KiB block (tools/replay.h); multiples of 4 hold exactly C blocks.
  "$KVTIERD" --data-dir "$dir" --host-pool-bytes $((capacity * 1024)) --cold-tier "$cold" \
    --eviction "$policy" > "$dir/log" 2>&1 &
  DAEMON=$!
  for _ in $(seq 100); do [ -S "$dir/kvtierd.sock" ] && break; sleep 0.05; done
  "$KVTIER" --socket "$dir/kvtierd.sock" replay "$@" --capacity "$capacity" \
    --json "$dir/run.json" > "$dir/out" 2>&1 || { cat "$dir/out" >&2; exit 1; }
  kill -TERM "$DAEMON"
  wait "$DAEMON" 2>/dev/null || true
  DAEMON=""
  python3 - "$dir/run.json" "$name" "$policy" "$cold" >> "$RUNS" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))["runs"][0]
print(json.dumps({"name": sys.argv[2], "policy": sys.argv[3], "cold": sys.argv[4], "run": run}))
PY
  python3 - "$dir/run.json" "$name" "$policy" "$cold" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["runs"][0]
print("%-16s %-4s cold %-3s %5d %-6s hit %7.3f%%  ideal LRU %7.3f%%  %+6.3f pp  %6.0f req/s" % (
    sys.argv[2], sys.argv[3], sys.argv[4], r["capacity_blocks"], r["put"], 100 * r["hit_rate"],
    100 * r["ideal_lru_hit_rate"], r["diff_pp"], r["requests_per_s"]), flush=True)
PY
}

if [ $HIT = 1 ]; then
  for capacity in "${CAPACITIES[@]}"; do
    for policy in "${POLICIES[@]}"; do
      for put in missed whole; do
        whole=()
        [ $put = whole ] && whole=(--whole)
        run trace "$policy" "$capacity" off "$TRACE" "${whole[@]}"
        for kind in shared-prompts scan agents; do
          run "$kind" "$policy" "$capacity" off --synthetic "$kind" "${whole[@]}"
        done
        run trace "$policy" "$capacity" on "$TRACE" "${whole[@]}"
      done
    done
  done
fi

if [ $SPEED = 1 ]; then
  for rep in $(seq "$REPS"); do
    for capacity in "${CAPACITIES[@]}"; do
      for policy in "${POLICIES[@]}"; do
        run "speed-$rep" "$policy" "$capacity" on "$TRACE"
        run "speed-$rep" "$policy" "$capacity" off "$TRACE"
      done
    done
  done
fi

mkdir -p "$(dirname "$OUT")"
python3 - "$RUNS" "$OUT" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
speed = {}
for r in runs:
    if not r["name"].startswith("speed-"):
        continue
    key = (r["policy"], r["run"]["capacity_blocks"])
    speed.setdefault(key, {}).setdefault(r["name"], {})[r["cold"]] = r["run"]["requests_per_s"]
ratios = {}
for (policy, capacity), reps in sorted(speed.items()):
    pairs = [v["on"] / v["off"] for v in reps.values() if "on" in v and "off" in v]
    on = [v["on"] for v in reps.values() if "on" in v]
    off = [v["off"] for v in reps.values() if "off" in v]
    ratios["%s_%d" % (policy, capacity)] = {
        "cold_on_vs_off_median": statistics.median(pairs), "min": min(pairs), "max": max(pairs),
        "cold_on_requests_per_s_median": statistics.median(on),
        "cold_off_requests_per_s_median": statistics.median(off), "reps": len(pairs)}
    print("cold on/off %s %5d: %.2f (%.2f-%.2f), %0.f vs %0.f requests/s (medians of %d)" % (
        policy, capacity, statistics.median(pairs), min(pairs), max(pairs),
        statistics.median(on), statistics.median(off), len(pairs)))
json.dump({"tool": "scripts/cache-policy-figures.sh", "runs": runs, "cold_speed": ratios},
          open(sys.argv[2], "w"), indent=1)
print("wrote", sys.argv[2])
PY
