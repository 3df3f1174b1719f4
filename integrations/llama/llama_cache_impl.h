// PrefixCache's state, shared by its implementation files: llama_cache.cc (open, connection,
// restore) and llama_store.cc (store, prefill). Not part of the integration's API.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "integrations/llama/stage_worker.h"
#include "integrations/llama/state_map.h"
#include "kvtier/llama.h"

namespace kvtier::llama {

using Clock = std::chrono::steady_clock;

// Adds the nanoseconds of its scope to a counter (CacheStats' time split).
class Timed {
 public:
  explicit Timed(uint64_t& counter) : counter_(counter), start_(Clock::now()) {}
  ~Timed() {
    counter_ += static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start_).count());
  }
  Timed(const Timed&) = delete;
  Timed& operator=(const Timed&) = delete;

 private:
  uint64_t& counter_;
  Clock::time_point start_;
};

// With a scratch sequence, the state of one staged step: small enough to stay in a core's L2
// cache between llama.cpp's copy and kvtier's, so that the KV crosses memory once.
inline constexpr size_t kStageBytes = 1 << 20;

struct PrefixCache::Impl {
  llama_context* ctx = nullptr;
  CacheOptions options;
  Layout layout;
  MemoryShape memory;  // what the context's sequence state holds
  std::optional<StateMap> map;
  uint32_t streams = 1;
  llama_seq_id scratchSeq = -1;  // CacheOptions::scratchSeq (plain KV caches)
  uint32_t checkpoint = 0;       // prefill's chunk: states' spacing, or the window's bound
  std::thread::id owner;

  std::unique_ptr<Client> client;
  std::unique_ptr<Space> space;     // borrows client: declared after it, destroyed before it
  Clock::time_point lastAttempt{};  // of a connection: the next is at most once a second later
  bool everConnected = false;
  std::string helperSeq;  // the sequence stores write through (storeImpl)
  CacheStats stats;

  // The state buffer, kept across calls so that a restore or store in steady state touches no
  // fresh pages (make_unique_for_overwrite: not zeroed, every byte is written before use).
  std::unique_ptr<uint8_t[]> scratch;
  size_t scratchBytes = 0;
  std::vector<uint32_t> rowScratch;
  // The second thread of pipelined restores and stores (CacheOptions::pipelineRestores), made at
  // the first.
  std::unique_ptr<StageWorker> worker;

  uint8_t* scratchOf(size_t bytes) {
    if (bytes > scratchBytes) {
      scratch = std::make_unique_for_overwrite<uint8_t[]>(bytes);
      scratchBytes = bytes;
    }
    return scratch.get();
  }

  // The checks every call makes first; nothing has changed when one fails.
  Status checkCall(llama_seq_id seq, const llama_token* tokens, size_t nTokens) const;
  // Blocks per staged step: as many as keep the step's state within kStageBytes (at least one).
  size_t stageBlocks() const { return std::max<size_t>(1, kStageBytes / layout.blockBytes()); }

  void disconnect();
  // Connects (again) when there is no connection and the last try is old enough.
  bool connected();
  // A result's error that means the daemon is gone drops the connection.
  void noteError(const Error& error);

  // What a restore's copies did.
  struct Restored {
    uint64_t cells = 0;    // the sequence's cells now (0: nothing restored)
    bool corrupt = false;  // a block or state failed its check (reported to the daemon, not used)
    bool failed = false;   // llama.cpp refused the state, or the hit had another shape
  };
  // Restores [0, end) of the hit in one state (a KV cache: the blocks before a damaged one).
  Restored restoreWhole(llama_seq_id seq, const ReadHandle& hit, uint64_t end);
  // Restores the hit in steps through the scratch sequence, up to a damaged block: pipelined
  // (CacheOptions::pipelineRestores) or one step after the other.
  Restored restoreStaged(llama_seq_id seq, const ReadHandle& hit);
  // The steps from block `from` on, one after the other (blocks before `from` are loaded).
  Restored restoreSteps(llama_seq_id seq, const ReadHandle& hit, size_t from);
  // Builds the state of blocks [b0, b0 + n) of the hit in `buffer`, each checked: returns how many
  // blocks from b0 passed (n: all); shapeOk false when a block has another size. Reports nothing
  // and calls neither llama.cpp nor the daemon (the worker runs it).
  size_t buildStep(const ReadHandle& hit, size_t b0, size_t n, uint8_t* buffer,
                   bool& shapeOk) const;
  // Loads a built step of positions [first, end) into `seq` through the scratch sequence.
  bool loadStep(llama_seq_id seq, const uint8_t* buffer, uint64_t first, uint64_t end);
  // Copies block b of the hit (positions from `first`, slots [0, slots)) into the built state,
  // checked against its writer's checksum; false when it fails the check (drainChecked: and
  // reported to the daemon).
  bool drainVerified(const StateMap::Build& build, const ReadHandle& hit, size_t b, uint64_t first,
                     uint32_t slots, kernels::CopyMethod method) const;
  bool drainChecked(const StateMap::Build& build, const ReadHandle& hit, size_t b, uint64_t first,
                    uint32_t slots, kernels::CopyMethod method);
  // Writes blocks [firstBlock, firstBlock + nBlocks) of `w`, positions from firstPos on, from a
  // parsed state.
  Status fillFromState(WriteHandle& w, size_t firstBlock, size_t nBlocks, const ParsedState& state,
                       uint64_t firstPos);
  // Which row of each KV section of `state` holds each of positions [from, from + n): rows[s]
  // points at n rows. INVALID_ARGUMENT if a position is missing or held twice.
  Status rowsOf(const ParsedState& state, uint64_t from, uint64_t n,
                std::vector<const uint32_t*>& rows);
  // The blocks (and with `withState` a recurrent model's state at n) of [0, n); `bounded`: a
  // windowed model's blocks that left the window are left out instead of failing.
  Result<StoreInfo> storeImpl(llama_seq_id seq, const llama_token* tokens, size_t nTokens,
                              bool withState);
  // Writes `blocks` blocks of `w` from positions `cached` on of `seq`, in steps through the
  // scratch sequence.
  Status storeSteps(WriteHandle& w, llama_seq_id seq, uint64_t cached, size_t blocks);
  Result<uint32_t> storeBlocks(const llama_token* tokens, uint64_t whole, const ParsedState* parsed,
                               llama_seq_id seq, StoreInfo& info);
  Status storeState(const llama_token* tokens, size_t nTokens, const ParsedState& parsed);
};

}  // namespace kvtier::llama
