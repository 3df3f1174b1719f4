#!/usr/bin/env bash
# Builds kvtier and runs its benchmark suites; each prints a table and writes its JSON under
# bench/results/:
#   local  shared-pool get/put against memcpy, a lookup's round trip against a Unix-socket
#          ping-pong, get/put against redis-server                    -> bench/results/local.json
#   cold   blocks spilled to and promoted from the RocksDB cold tier against db_bench fillrandom
#          and readrandom, hot lookup p99 while spilling against idle -> bench/results/cold.json
#   gpu    paged KV gather/scatter kernels against cudaMemcpy D2D, host->GPU promotion against
#          pinned H2D (needs a GPU and a CUDA build; null ratios otherwise) -> bench/results/gpu.json
#   cluster remote hits between two daemons on loopback against ucx_perftest ucp_get (UCX_TLS=tcp
#          and UCX's defaults), a lookup missing everywhere against a local miss, puts on a
#          cluster member against a lone daemon                       -> bench/results/cluster.json
#   scale  daemon memory per indexed block and lookup latency at 10 k, 1 M and 10 M blocks; a
#          restart with 10 M blocks on disk (minutes; KVTIER_SCALE_COLD=0 skips that part)
#                                                                     -> bench/results/scale.json
#   llama  llama.cpp on kvtier with a generated model: time to first token with the prefix
#          restored against recomputed, restore and store of KV against memcpy (needs llama.cpp:
#          scripts/install-llama-cpp.sh)                              -> bench/results/llama.json
#
#   scripts/bench.sh [--suite local|cold|gpu|cluster|scale|policy|llama|all] [kvtier-bench arguments]
#
# The default is all: local, cold, gpu, cluster, scale, then llama. Other arguments go to every
# kvtier-bench run.
set -euo pipefail
cd "$(dirname "$0")/.."
suites=(local cold gpu cluster scale policy llama)
if [[ "${1:-}" == "--suite" ]]; then
  case "${2:-}" in
    local | cold | gpu | cluster | scale | policy | llama) suites=("$2") ;;
    all) ;;
    *)
      echo "usage: scripts/bench.sh [--suite local|cold|gpu|cluster|scale|policy|llama|all] [kvtier-bench arguments]" >&2
      exit 2
      ;;
  esac
  shift 2
fi
# The bench is on by default; say so anyway, in case build/ was configured without it.
bash scripts/build.sh -DKVTIER_BUILD_BENCH=ON
for suite in "${suites[@]}"; do
  build/bench/kvtier-bench --suite "$suite" --json "bench/results/$suite.json" "$@"
done
