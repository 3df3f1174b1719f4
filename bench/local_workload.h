// The local suite's workload (a 64-block, 16 MiB prefix of benchLayout()'s blocks, its packed KV
// and a reader's buffer), shared by bench/suite_local.cc and the raw pool copies it is measured
// against (bench/local_pool_copies.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "bench/harness.h"
#include "tools/synthetic_kv.h"

namespace kvtier::bench {

// The shapes are benchLayout()'s (256 KiB blocks); the prefix is 64 blocks, 16 MiB.
constexpr uint64_t kPrefixTokens = 1024;
constexpr uint32_t kPrefixBlocks = 64;

// The suite's data: the prompt, its packed KV (also the memcpy source) and the reader's buffer
// (also the memcpy destination).
struct Workload {
  Workload() {
    const auto packed = synthetic::packedKv(layout, tokens, 0, kPrefixTokens);
    std::memcpy(kv.data(), packed.data(), kv.size());
  }
  size_t bytes() const { return kv.size(); }
  // A new prompt for every put: the prompt's first token counts the puts, so every block's chained
  // key is new and the put is what a prefill hands over — 64 fresh blocks written, sealed and
  // indexed, the pool's oldest blocks evicted to make room once it is full. (A put of blocks the
  // index already holds writes them to a scratch block and keeps the cached ones: cheaper, and not
  // what a writer of new KV pays.)
  std::span<const uint32_t> nextPutTokens() {
    putTokens[0] = 0x40000000u + ++puts;
    return putTokens;
  }

  Layout layout = benchLayout();
  std::vector<uint32_t> tokens = synthetic::tokens(2024, kPrefixTokens);
  std::vector<uint32_t> firstBlock =
      std::vector<uint32_t>(tokens.begin(), tokens.begin() + layout.blockTokens);
  HostBuffer kv{kPrefixTokens * layout.tokenKvBytes()};
  HostBuffer out{kPrefixTokens * layout.tokenKvBytes()};
  std::vector<uint32_t> putTokens = tokens;
  uint32_t puts = 0;
};

}  // namespace kvtier::bench
