#!/usr/bin/env bash
# Builds the fuzz harnesses of tests/fuzz/ with clang and libFuzzer (ASAN and UBSAN on everything)
# and runs each for a while, one fuzzing process per core (docs/reliability.md):
#
#   scripts/fuzz.sh [--seconds N | --minutes M] [--jobs J] [HARNESS...]
#
#   --seconds N   how long each harness runs (default 60)
#   --minutes M   a campaign of M minutes in all, shared evenly by the harnesses run
#   --jobs J      build jobs (default: KVTIER_JOBS, else 1)
#   HARNESS       daemon_rpc peer_rpc lane_codec cold_record layout llama_state config trace_line
#                 (default: all)
#
# Build directory: build-fuzz. Each harness starts from its seed corpus, tests/fuzz/corpus/<h>/
# (left unchanged), and keeps what it learns in build-fuzz/corpus/<h>/ for the next run. A finding
# (crash, hang, leak, out-of-memory) is written to build-fuzz/findings/<h>/; turn it into a
# regression test by copying it into tests/fuzz/corpus/<h>/ (ctest replays that folder) and fixing
# the bug. Needs Debian's clang and libclang-rt-14-dev (installed here when missing and apt-get can).
# The last line is one JSON object: executions, crashes, hangs, leaks, ooms, and per harness.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
seconds=60
minutes=
jobs=${KVTIER_JOBS:-1}
harnesses=()
while [ $# -gt 0 ]; do
  case $1 in
    --seconds) seconds=$2 && shift 2 ;;
    --minutes) minutes=$2 && shift 2 ;;
    --jobs) jobs=$2 && shift 2 ;;
    -h | --help) sed -n '2,19p' "$0" && exit 0 ;;
    -*) echo "unknown option $1" >&2 && exit 2 ;;
    *) harnesses+=("$1") && shift ;;
  esac
done
all_harnesses=(daemon_rpc peer_rpc lane_codec cold_record layout llama_state config trace_line)
[ ${#harnesses[@]} -gt 0 ] || harnesses=("${all_harnesses[@]}")
[[ $seconds =~ ^[0-9]+$ && $seconds -gt 0 ]] || { echo "--seconds must be a positive number" >&2; exit 2; }
if [ -n "$minutes" ]; then
  [[ $minutes =~ ^[0-9]+$ && $minutes -gt 0 ]] || { echo "--minutes must be a positive number" >&2; exit 2; }
  seconds=$((minutes * 60 / ${#harnesses[@]}))
  [ "$seconds" -gt 0 ] || seconds=1
fi

# clang with libFuzzer's runtime: a one-line program must link with -fsanitize=fuzzer.
has_libfuzzer() {
  command -v clang++ >/dev/null || return 1
  local probe
  probe=$(mktemp -d)
  printf '%s\n' 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' \
    >"$probe/p.cc"
  clang++ -fsanitize=fuzzer,address,undefined "$probe/p.cc" -o "$probe/p" >/dev/null 2>&1
  local rc=$?
  rm -rf "$probe"
  return $rc
}
if ! has_libfuzzer; then
  echo "fuzz: installing clang and libclang-rt-14-dev (libFuzzer)" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo=sudo
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    clang libclang-rt-14-dev >&2
  has_libfuzzer || { echo "fuzz: clang cannot link -fsanitize=fuzzer" >&2 && exit 1; }
fi

build=$root/build-fuzz
flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined"
flags="$flags -fno-omit-frame-pointer -gline-tables-only"
link="-fsanitize=address,undefined"
CC=clang CXX=clang++ cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_EXE_LINKER_FLAGS="$link" -DCMAKE_SHARED_LINKER_FLAGS="$link" \
  -DKVTIER_FUZZ=ON -DKVTIER_CUDA=OFF -DKVTIER_BUILD_BENCH=OFF -DKVTIER_PYTHON=OFF >/dev/null
targets=()
for h in "${harnesses[@]}"; do targets+=("kvtier_fuzz_$h"); done
cmake --build "$build" -j "$jobs" --target "${targets[@]}" >&2

# The harnesses' scratch files (sockets) live here, removed at the end whatever happens.
scratch=$(mktemp -d /tmp/kvtier-fuzzrun-XXXXXX)
trap 'rm -rf "$scratch"' EXIT

# Bytes per input: the RPC harnesses' seeds carry a 16 KiB block; 64 KiB bounds a conversation.
max_len() {
  case $1 in
    daemon_rpc | peer_rpc) echo 65536 ;;
    llama_state) echo 16384 ;;
    *) echo 8192 ;;
  esac
}

# The RPC harnesses allocate a great deal per input (messages, promises, connections): recording
# a stack for each allocation was a quarter of their time (and for the peer harness, whose UCX
# has no frame pointers, the slow unwinder cut it to ~300 inputs a second). They run without
# allocation stacks; a report (a use after free, a leak at exit) is replayed for its stacks with
# `ASAN_OPTIONS=fast_unwind_on_malloc=0 build-fuzz/tests/fuzz/kvtier_fuzz_<h> FILE`, where
# scripts/lsan.supp can tell UCX's own pools apart.
asan_options() {
  case $1 in
    daemon_rpc | peer_rpc) echo "detect_leaks=1:abort_on_error=1:malloc_context_size=0" ;;
    *) echo "detect_leaks=1:abort_on_error=1" ;;
  esac
}

# The RPC harnesses serve every input with one daemon (as kvtierd serves its clients), so most
# inputs leave memory the daemon keeps (its index, its caches): libFuzzer's leak check after each
# such input (a scan of the whole heap) was half their time, and the entropic schedule's
# bookkeeping a third of the rest. Leaks are still looked for when each process ends (ASAN's
# detect_leaks), and the harness itself checks after every input that the daemon holds nothing
# for the gone client.
fuzzer_options() {
  case $1 in
    daemon_rpc | peer_rpc) echo "-detect_leaks=0 -entropic=0" ;;
    *) echo "" ;;
  esac
}

# One fuzzing process per core (libFuzzer's fork mode: the jobs share the corpus as they go).
workers=$(nproc)

total_execs=0 total_crashes=0 total_hangs=0 total_leaks=0 total_ooms=0
per=""
for h in "${harnesses[@]}"; do
  corpus=$build/corpus/$h
  findings=$build/findings/$h
  mkdir -p "$corpus" "$findings"
  cp -n "$root/tests/fuzz/corpus/$h"/* "$corpus"/ 2>/dev/null || true
  log=$build/fuzz-$h.log
  started=$build/.started-$h  # findings newer than this are this run's
  touch "$started"
  echo "fuzz: $h for $seconds s" >&2
  set +e
  KVTIER_TEST_TMPDIR=$scratch TMPDIR=$scratch \
    ASAN_OPTIONS=$(asan_options "$h") UBSAN_OPTIONS=print_stacktrace=1 \
    LSAN_OPTIONS=suppressions=$root/scripts/lsan.supp:print_suppressions=0 \
    "$build/tests/fuzz/kvtier_fuzz_$h" "$corpus" "$root/tests/fuzz/corpus/$h" \
    -fork="$workers" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=4096 \
    -max_len="$(max_len "$h")" $(fuzzer_options "$h") \
    -artifact_prefix="$findings/" >"$log" 2>&1 &
  pid=$!
  wait $pid
  rc=$?
  set -e
  # A job that died leaves its shared-memory segment (kvtier-fuzz[-peer]-<pid>-0): every one
  # whose process is gone goes.
  for segment in /dev/shm/kvtier-fuzz-*; do
    [ -e "$segment" ] || continue
    owner=${segment#/dev/shm/kvtier-fuzz-}
    owner=${owner#peer-}
    owner=${owner%%-*}
    [[ $owner =~ ^[0-9]+$ ]] && ! kill -0 "$owner" 2>/dev/null && rm -f "$segment"
  done
  # Fork mode's status lines count every job's executions: the last one is the run's total.
  execs=$(grep -oE "^#[0-9]+" "$log" | tail -n 1 | tr -d '#')
  execs=${execs:-0}
  crashes=$(find "$findings" -type f -name 'crash-*' -newer "$started" | wc -l)
  hangs=$(find "$findings" -type f -name 'timeout-*' -newer "$started" | wc -l)
  leaks=$(find "$findings" -type f -name 'leak-*' -newer "$started" | wc -l)
  ooms=$(find "$findings" -type f -name 'oom-*' -newer "$started" | wc -l)
  # A run that failed without leaving an input (e.g. a crash at start-up) is a crash too.
  if [ "$rc" -ne 0 ] && [ $((crashes + hangs + leaks + ooms)) -eq 0 ]; then crashes=1; fi
  echo "fuzz: $h: $execs executions, $crashes crashes, $hangs hangs, $leaks leaks, $ooms ooms (log: $log)" >&2
  [ "$rc" -eq 0 ] || tail -n 40 "$log" >&2
  total_execs=$((total_execs + execs))
  total_crashes=$((total_crashes + crashes))
  total_hangs=$((total_hangs + hangs))
  total_leaks=$((total_leaks + leaks))
  total_ooms=$((total_ooms + ooms))
  per="$per${per:+, }\"$h\": {\"executions\": $execs, \"per_second\": $((execs / seconds)), \"crashes\": $crashes, \"hangs\": $hangs, \"leaks\": $leaks, \"ooms\": $ooms}"
done
echo "{\"seconds_per_harness\": $seconds, \"executions\": $total_execs, \"executions_per_second\": $((total_execs / (seconds * ${#harnesses[@]}))), \"crashes\": $total_crashes, \"hangs\": $total_hangs, \"leaks\": $total_leaks, \"ooms\": $total_ooms, \"harnesses\": {$per}}"
[ $((total_crashes + total_hangs + total_leaks + total_ooms)) -eq 0 ]
