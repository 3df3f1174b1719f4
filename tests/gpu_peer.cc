// A GPU client process for the GPU integration tests: an "engine" with its own paged KV cache in
// device memory (vLLM's layout) that stores to and loads from kvtierd's GPU pool through CUDA IPC.
//
//   put-paged SOCKET SEQ SEED N        put tokens(SEED, N) from a paged cache (block table in
//                                      reverse order); print "OK sealed=S gpu_used=U". The
//                                      sequence ends with the session; its sealed blocks stay.
//   verify-paged SOCKET SEED N EXPECT  lookup tokens(SEED, N), gather the hit into a fresh paged
//                                      cache (another block order), compare with the synthetic
//                                      KV; print "MATCHED M identical|DIFFERENT"; exit 0 iff
//                                      M == EXPECT and identical
//   hold-gpu SOCKET SEED N             lookup tokens(SEED, N) (read lease on GPU blocks) and an
//                                      uncommitted putPaged-sized write lease on the GPU; print
//                                      "READY <blocks>"; sleep until killed
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kvtier/client.h"
#include "tests/test_support.h"
#include "tools/synthetic_kv.h"

using namespace kvtier;

namespace {

[[noreturn]] void fail(const std::string& what, const std::string& why) {
  std::printf("ERROR %s: %s\n", what.c_str(), why.c_str());
  std::fflush(stdout);
  std::exit(4);
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(what, cudaGetErrorString(e));
}

// A paged KV cache on GPU 0: numBlocks engine blocks of 16 tokens per layer for K and V.
struct EngineCache {
  Layout layout;
  uint32_t blockTokens = 16;
  uint32_t numBlocks = 0;
  PagedKvCache view;
  std::vector<int32_t> table;

  EngineCache(const Layout& l, uint64_t tokens, bool reversed) : layout(l) {
    const uint32_t needed = static_cast<uint32_t>((tokens + blockTokens - 1) / blockTokens);
    numBlocks = needed + 3;
    view.blockTokens = blockTokens;
    const uint64_t bytes = uint64_t{numBlocks} * blockTokens * layout.tokenBytes();
    for (uint32_t i = 0; i < 2 * layout.numLayers; ++i) {
      void* p = nullptr;
      check(cudaMalloc(&p, bytes), "cudaMalloc");
      check(cudaMemset(p, 0, bytes), "cudaMemset");
      (i % 2 ? view.values : view.keys).push_back(p);
    }
    for (uint32_t b = 0; b < needed; ++b) {
      table.push_back(static_cast<int32_t>(reversed ? numBlocks - 1 - b : 1 + b));
    }
  }
  ~EngineCache() {
    for (void* p : view.keys) cudaFree(p);
    for (void* p : view.values) cudaFree(p);
  }
  void* tensor(uint32_t layer, uint32_t kv) const {
    return kv ? view.values[layer] : view.keys[layer];
  }
  uint64_t rowOffset(uint64_t pos) const {
    return (uint64_t(table[pos / blockTokens]) * blockTokens + pos % blockTokens) *
           layout.tokenBytes();
  }
  // Writes packed KV ([layer][K|V][token]...) of positions [0, n) into the paged tensors.
  void upload(const std::vector<uint8_t>& packed, uint64_t n) {
    const uint64_t tb = layout.tokenBytes();
    for (uint32_t l = 0; l < layout.numLayers; ++l) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        for (uint64_t t = 0; t < n; ++t) {
          const uint8_t* src = packed.data() + ((uint64_t{l} * 2 + kv) * n + t) * tb;
          check(cudaMemcpy(static_cast<uint8_t*>(tensor(l, kv)) + rowOffset(t), src, tb,
                           cudaMemcpyHostToDevice),
                "upload");
        }
      }
    }
  }
  std::vector<uint8_t> download(uint64_t n) const {
    const uint64_t tb = layout.tokenBytes();
    std::vector<uint8_t> packed(n * layout.tokenKvBytes());
    for (uint32_t l = 0; l < layout.numLayers; ++l) {
      for (uint32_t kv = 0; kv < 2; ++kv) {
        for (uint64_t t = 0; t < n; ++t) {
          uint8_t* dst = packed.data() + ((uint64_t{l} * 2 + kv) * n + t) * tb;
          check(cudaMemcpy(dst, static_cast<const uint8_t*>(tensor(l, kv)) + rowOffset(t), tb,
                           cudaMemcpyDeviceToHost),
                "download");
        }
      }
    }
    return packed;
  }
};

std::unique_ptr<Space> openOnGpu(Client& client, const Layout& layout) {
  auto space = client.open(layout, OpenOptions{.device = 0});
  if (!space) fail("open", space.error().toString());
  return std::move(space).value();
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> a(argv + 1, argv + argc);
  if (a.empty()) return 2;
  const Layout layout = test::testLayout();
  auto client = Client::connect({.socketPath = a.size() > 1 ? a[1] : "", .clientName = "gpu-peer"});
  if (!client) fail("connect", client.error().toString());
  if (a[0] == "put-paged" && a.size() == 5) {
    auto space = openOnGpu(**client, layout);
    const auto tokens = synthetic::tokens(std::stoull(a[3]), std::stoull(a[4]));
    EngineCache cache(layout, tokens.size(), /*reversed=*/true);
    cache.upload(synthetic::packedKv(layout, tokens, 0, tokens.size()), tokens.size());
    cudaStream_t stream;
    check(cudaStreamCreate(&stream), "stream");
    auto info = space->putPaged(a[2], 0, tokens, cache.view, cache.table, stream);
    if (!info) fail("putPaged", info.error().toString());
    auto stats = (*client)->stats();
    std::printf("OK sealed=%u gpu_used=%lu\n", info->sealedBlocks,
                static_cast<unsigned long>(stats ? stats->gpuBlocksUsed : 0));
    return 0;
  }
  if (a[0] == "verify-paged" && a.size() == 5) {
    auto space = openOnGpu(**client, layout);
    const auto tokens = synthetic::tokens(std::stoull(a[2]), std::stoull(a[3]));
    auto hit = space->lookup(tokens);
    if (!hit) fail("lookup", hit.error().toString());
    const uint64_t matched = hit->matchedTokens();
    EngineCache cache(layout, tokens.size(), /*reversed=*/false);
    if (auto s = space->gatherTo(*hit, 0, matched, cache.view, cache.table); !s) {
      fail("gatherTo", s.error().toString());
    }
    const bool same = cache.download(matched) == synthetic::packedKv(layout, tokens, 0, matched);
    std::printf("MATCHED %lu %s\n", static_cast<unsigned long>(matched),
                same ? "identical" : "DIFFERENT");
    return matched == std::stoull(a[4]) && same ? 0 : 1;
  }
  if (a[0] == "hold-gpu" && a.size() == 4) {
    auto space = openOnGpu(**client, layout);
    const auto tokens = synthetic::tokens(std::stoull(a[2]), std::stoull(a[3]));
    auto hit = space->lookup(tokens);
    if (!hit) fail("lookup", hit.error().toString());
    const auto other = synthetic::tokens(std::stoull(a[2]) + 1000, 64);
    auto write = space->beginPut("uncommitted", 0, other);
    if (!write) fail("beginPut", write.error().toString());
    std::printf("READY %zu\n", hit->blockCount());
    std::fflush(stdout);
    while (true) pause();
  }
  return 2;
}
