// kvtier-bench --suite gpu: the paged KV kernels against cudaMemcpy device-to-device of the same
// bytes, and host -> GPU pool promotion against a pinned cudaMemcpy host-to-device, on GPU 0 with a
// daemon whose GPU pool is there. Each kvtier figure and its anchor are timed back to back in every
// repetition (wall clock, each ending with a stream synchronize). Without CUDA or a GPU every
// ratio is null, with the reason.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench/harness.h"
#include "tools/json_string.h"
#include "tools/synthetic_kv.h"
#ifdef KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/gpu.h"
#endif

namespace kvtier::bench {
namespace {

#ifdef KVTIER_HAVE_CUDA
// 256 blocks of the local suite's 256 KiB: a 64 MiB prefix (4096 tokens).
constexpr uint64_t kGpuPrefixBlocks = 256;

// The engine's paged cache on GPU 0 for the suite's layout: 16-token blocks, a shuffled table.
struct GpuPagedCache {
  PagedKvCache view;
  std::vector<int32_t> table;
  uint64_t bytesPerTensor = 0;

  static Result<GpuPagedCache> create(const Layout& layout, uint64_t tokens) {
    GpuPagedCache c;
    c.view.blockTokens = 16;
    const uint64_t blocks = (tokens + 15) / 16;
    c.bytesPerTensor = blocks * 16 * layout.tokenBytes();
    for (uint32_t i = 0; i < 2 * layout.numLayers; ++i) {
      void* p = nullptr;
      if (cudaMalloc(&p, c.bytesPerTensor) != cudaSuccess) {
        return unavailable("cudaMalloc of the paged cache failed");
      }
      (i % 2 ? c.view.values : c.view.keys).push_back(p);
    }
    for (uint64_t b = 0; b < blocks; ++b) c.table.push_back(static_cast<int32_t>(b));
    std::mt19937 rng(7);
    std::shuffle(c.table.begin(), c.table.end(), rng);
    return c;
  }
  void free() {
    for (void* p : view.keys) cudaFree(p);
    for (void* p : view.values) cudaFree(p);
    view.keys.clear();
    view.values.clear();
  }
};

template <typename F>
Result<double> timedOnStream(cudaStream_t stream, F&& f) {
  const auto t0 = Clock::now();
  if (auto s = f(); !s) return s.error();
  if (cudaStreamSynchronize(stream) != cudaSuccess) return unavailable("stream failed");
  return secondsSince(t0);
}

// An anchor: one cudaMemcpyAsync of `bytes` (device to device or host to device) on `stream`.
Result<double> timedMemcpy(cudaStream_t stream, void* dst, const void* src, uint64_t bytes,
                           cudaMemcpyKind kind) {
  return timedOnStream(stream, [&]() -> Status {
    if (cudaMemcpyAsync(dst, src, bytes, kind, stream) != cudaSuccess)
      return unavailable("cudaMemcpyAsync ", kind == cudaMemcpyDeviceToDevice ? "D2D" : "H2D",
                         " failed");
    return {};
  });
}

Status runGpuMeasurements(const Options& options, std::vector<RatioReport>& reports,
                          std::string& daemonVersion) {
  auto dir = TempDir::create();
  if (!dir) return dir.error();
  const std::string socket = dir->file("kvtierd.sock");
  BenchDaemon daemon;
  if (auto s = daemon.start(options.daemon, *dir, socket,
                            options.daemonFlags({"--host-pool-bytes", "1G", "--gpus", "0",
                                                 "--gpu-pool-bytes", "1G"}));
      !s)
    return s;
  auto gpuClient = startClient(socket, options, options.threading);
  if (!gpuClient) return gpuClient.error();
  auto hostClient = startClient(socket, options, ClientThreading::kOwnThread, "kvtier-bench-host");
  if (!hostClient) return hostClient.error();
  daemonVersion = (*gpuClient)->daemonVersion();
  const Layout layout = benchLayout();  // the local suite's
  auto gpuSpace = (*gpuClient)->open(layout, OpenOptions{.device = 0});
  if (!gpuSpace) return gpuSpace.error();
  auto hostSpace = (*hostClient)->open(layout);
  if (!hostSpace) return hostSpace.error();

  const uint64_t tokens = kGpuPrefixBlocks * layout.blockTokens;
  const uint64_t bytes = tokens * layout.tokenKvBytes();
  const auto prompt = synthetic::tokens(4242, tokens);
  const auto promotePrompt = synthetic::tokens(4343, tokens);
  const auto kv = synthetic::packedKv(layout, prompt, 0, tokens);
  auto cache = GpuPagedCache::create(layout, tokens);
  if (!cache) return cache.error();
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    return unavailable("cudaStreamCreate failed");
  }
  void *d2dSrc = nullptr, *d2dDst = nullptr, *pinned = nullptr;
  if (cudaMalloc(&d2dSrc, bytes) != cudaSuccess || cudaMalloc(&d2dDst, bytes) != cudaSuccess ||
      cudaMallocHost(&pinned, bytes) != cudaSuccess) {
    return unavailable("cannot allocate the anchors' buffers");
  }
  std::memcpy(pinned, kv.data(), bytes);
  auto cleanup = [&] {
    cudaFree(d2dSrc);
    cudaFree(d2dDst);
    cudaFreeHost(pinned);
    cudaStreamDestroy(stream);
    cache->free();
  };

  // The prefix on the GPU: put from the paged cache (after filling it), checked once end to end.
  Status result = [&]() -> Status {
    // Fill the paged cache through the pool: the host writes the prefix, a GPU gather reads it.
    if (auto r = (*hostSpace)->put("fill", 0, prompt, kv.data(), kv.size()); !r) return r.error();
    {
      auto hit = (*gpuSpace)->lookup(prompt);
      if (!hit) return hit.error();
      if (hit->matchedTokens() != tokens) return makeError(ErrorCode::kInternal, "fill missed");
      if (auto s = (*gpuSpace)->gatherTo(*hit, 0, tokens, cache->view, cache->table, stream); !s)
        return s;
    }
    // Host copies of promotePrompt's blocks: each repetition moves them to the GPU and back.
    const auto promoteKv = synthetic::packedKv(layout, promotePrompt, 0, tokens);
    if (auto r = (*hostSpace)->put("promote", 0, promotePrompt, promoteKv.data(), promoteKv.size());
        !r)
      return r.error();
    if (auto r = (*hostSpace)->remove("promote", 0); !r) return r.error();
    if (auto r = (*hostSpace)->remove("fill", 0); !r) return r.error();

    auto& gather = reports[0];
    auto& scatter = reports[1];
    auto& promote = reports[2];
    // Other tokens than the prefix, so that the commit below keeps the scattered blocks (the same
    // tokens would share the prefix's indexed blocks instead).
    const auto scatterTokens = synthetic::tokens(4545, tokens);
    auto write = (*gpuSpace)->beginPut("scatter-target", 0, scatterTokens);
    if (!write) return write.error();
    for (int rep = 0; rep <= options.reps; ++rep) {
      if (gInterrupted) return makeError(ErrorCode::kUnavailable, "interrupted");
      const bool warmup = rep == 0;
      // Every timed copy starts as an engine's does: right after a round trip to the daemon, the
      // GPU idle meanwhile. (The first kernel or copy after such a gap runs slower than one queued
      // behind another, and the more so the longer the gap: timing the anchor back to back would
      // compare a cold start with a warm one.) gather: the held prefix into the paged cache, after
      // its lookup; anchor: D2D of the same bytes, after the same lookup again.
      auto hit = (*gpuSpace)->lookup(prompt);
      if (!hit) return hit.error();
      auto g = timedOnStream(stream, [&] {
        return (*gpuSpace)->gatherTo(*hit, 0, tokens, cache->view, cache->table, stream);
      });
      if (!g) return g.error();
      auto sameGap = (*gpuSpace)->lookup(prompt);
      if (!sameGap) return sameGap.error();
      auto d2d = timedMemcpy(stream, d2dDst, d2dSrc, bytes, cudaMemcpyDeviceToDevice);
      if (!d2d) return d2d.error();
      sameGap->release();
      // Back to back, GPU busy (printed beside the figures): the same gather, then the anchor.
      auto gatherBusy = timedOnStream(stream, [&] {
        return (*gpuSpace)->gatherTo(*hit, 0, tokens, cache->view, cache->table, stream);
      });
      if (!gatherBusy) return gatherBusy.error();
      auto d2dBusy = timedMemcpy(stream, d2dDst, d2dSrc, bytes, cudaMemcpyDeviceToDevice);
      if (!d2dBusy) return d2dBusy.error();
      hit->release();
      // scatter: the paged cache into the granted pool blocks, after a round trip (a stats call,
      // about as long as the commit an engine sends after its previous scatter).
      if (auto st = (*gpuClient)->stats(); !st) return st.error();
      auto sc = timedOnStream(stream, [&] {
        return (*gpuSpace)->scatterTo(*write, 0, tokens, cache->view, cache->table, stream);
      });
      if (!sc) return sc.error();
      if (auto st = (*gpuClient)->stats(); !st) return st.error();
      auto d2dShort = timedMemcpy(stream, d2dDst, d2dSrc, bytes, cudaMemcpyDeviceToDevice);
      if (!d2dShort) return d2dShort.error();
      // promote: a host session's lookup takes the blocks to the host pool (untimed), then a GPU
      // session's lookup brings them back; anchor: pinned H2D of the same bytes.
      auto pinnedBefore = (*gpuClient)->stats();  // the scatter target's lease pins blocks
      if (!pinnedBefore) return pinnedBefore.error();
      {
        auto back = (*hostSpace)->lookup(promotePrompt);
        if (!back) return back.error();
      }
      // That release travels on the other connection: wait until it has landed, so that the
      // blocks are free to move when the timed lookup asks.
      for (int i = 0; i < 10000; ++i) {
        auto st = (*gpuClient)->stats();
        if (!st) return st.error();
        if (st->blocksPinned <= pinnedBefore->blocksPinned) break;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      const auto t0 = Clock::now();
      auto up = (*gpuSpace)->lookup(promotePrompt);
      if (!up) return up.error();
      const double promoteSeconds = secondsSince(t0);
      if (up->matchedTokens() != tokens) {
        return makeError(ErrorCode::kInternal, "promote prefix matched ", up->matchedTokens());
      }
      up->release();
      auto h2d = timedMemcpy(stream, d2dDst, pinned, bytes, cudaMemcpyHostToDevice);
      if (!h2d) return h2d.error();
      auto rate = [&](double seconds) { return human(bytes / seconds, "bytes/s"); };
      std::fprintf(stderr,
                   "%s %d: gather %s vs d2d %s, scatter %s vs d2d %s; back to back: gather %s, "
                   "d2d %s; promote %s, h2d %s\n",
                   warmup ? "warm-up" : "rep", rep, rate(*g).c_str(), rate(*d2d).c_str(),
                   rate(*sc).c_str(), rate(*d2dShort).c_str(), rate(*gatherBusy).c_str(),
                   rate(*d2dBusy).c_str(),
                   rate(promoteSeconds).c_str(), rate(*h2d).c_str());
      if (warmup) continue;
      gather.kvtier.perRep.push_back(bytes / *g);
      gather.anchor.perRep.push_back(bytes / *d2d);
      scatter.kvtier.perRep.push_back(bytes / *sc);
      scatter.anchor.perRep.push_back(bytes / *d2dShort);
      promote.kvtier.perRep.push_back(bytes / promoteSeconds);
      promote.anchor.perRep.push_back(bytes / *h2d);
    }
    // The last scatter's bytes must be the prefix's: commit, end the sequence (its blocks stay
    // cached), and read them on the host (the lookup brings them to the host pool).
    if (auto c = write->commit(); !c) return c.error();
    if (auto r = (*gpuSpace)->remove("scatter-target", 0); !r) return r.error();
    auto check = (*hostSpace)->lookup(scatterTokens);
    if (!check) return check.error();
    if (check->matchedTokens() != tokens) {
      return makeError(ErrorCode::kInternal, "scattered prefix matched ", check->matchedTokens());
    }
    std::vector<uint8_t> back(kv.size());
    if (auto s = check->copyTo(0, tokens, back.data(), back.size()); !s) return s;
    if (back != kv) return makeError(ErrorCode::kInternal, "scattered bytes differ");
    auto stats = (*gpuClient)->stats();
    if (stats && stats->gpuPromoted == 0) {
      return makeError(ErrorCode::kInternal, "no block was promoted to the GPU");
    }
    return {};
  }();
  cleanup();
  return result;
}
#endif

Status run(const Options& options) {
  const auto report = newReport;
  std::vector<RatioReport> reports = {
      report("gather_vs_d2d", "Space::gatherTo 64 MiB into a paged cache after its lookup",
             "cudaMemcpy D2D 64 MiB after a lookup", "bytes/s", true, 0.8),
      report("scatter_vs_d2d", "Space::scatterTo 64 MiB from a paged cache after a stats call",
             "cudaMemcpy D2D 64 MiB after a stats call", "bytes/s", true, 0.8),
      report("promote_vs_h2d", "lookup promoting 64 MiB host->GPU pool",
             "pinned cudaMemcpy H2D 64 MiB", "bytes/s", true, 0.8)};
  std::string daemonVersion;
#ifdef KVTIER_HAVE_CUDA
  if (const std::string why = kernels::gpu::noDeviceReason(); !why.empty()) {
    for (auto& r : reports) r.skipped = why;
  } else if (auto s = runGpuMeasurements(options, reports, daemonVersion); !s) {
    return s;
  }
#else
  for (auto& r : reports) r.skipped = "kvtier-bench was built without CUDA";
#endif
  if (!reports[0].skipped.empty()) {
    std::fprintf(stderr, "kvtier-bench: GPU suite skipped: %s\n", reports[0].skipped.c_str());
  }
  printTable("gpu", reports, options.reps);
  return writeReport(
      options, reports, Breakdown{},
      runInfoOf("gpu", options,
                {{"kvtierd", daemonVersion.empty() ? "null" : jsonString(daemonVersion)}}));
}

}  // namespace

extern const Suite kGpuSuite{
    "gpu",
    "  --suite gpu     the GPU suite (GPU 0): paged KV gather/scatter kernels vs cudaMemcpy D2D,\n"
    "                  host->GPU pool promotion vs pinned cudaMemcpy H2D (null without a GPU)\n",
    run};

}  // namespace kvtier::bench
