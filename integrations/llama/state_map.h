// The shape of a llama.cpp context's memory and the one translation between its sequence state
// and kvtier blocks, for every memory llama.cpp 0.5.0 can write as a sequence state:
//
//   kind         sections of llama_state_seq_get_data (after the 8-byte header)
//   kKv          [KV cache]                               llama, mistral, qwen2, ...
//   kIswa        [KV base: full layers][KV SWA: windowed]  gemma2/3, gpt-oss, cohere2, ...
//   kRecurrent   [recurrent]                              mamba, mamba2, rwkv6/7, ...
//   kHybrid      [KV: attention layers][recurrent]         lfm2, granite-hybrid, jamba, ...
//   kHybridIswa  [KV base][KV SWA][recurrent]              lfm2 with a sliding window, ...
//
// (src/llama-kv-cache-iswa.cpp, llama-memory-hybrid.cpp, llama-memory-hybrid-iswa.cpp,
// llama-memory-recurrent.cpp: each writes its parts in this order.) A KV section is the format
// seq_state.h reads; an SWA section holds only the cells the window still sees (the last n_swa
// positions). A recurrent section is one cell: the state after the sequence's last token; kvtier
// keeps it as opaque bytes (its size is fixed for a model and context), checked by llama.cpp
// when it loads them and by kvtier's checksum before.
//
// A kvtier block holds, for its blockTokens positions, the K and V rows of every layer of every
// KV section (full layers first, then windowed ones): a windowed layer's rows are stored while
// the engine still holds them (the cache stores as the prompt is evaluated), so a restore at any
// block boundary p finds the full layers' rows of [0, p) and the windowed layers' of the window
// before p in the blocks before p. The recurrent section at a position is the prefix state kvtier
// keeps there (Layout::stateBytes).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "integrations/llama/seq_state.h"
#include "kernels/block_sum.h"
#include "kvtier/error.h"
#include "kvtier/layout.h"

namespace kvtier::llama {

enum class MemoryKind : uint8_t { kKv, kIswa, kRecurrent, kHybrid, kHybridIswa };
const char* memoryKindName(MemoryKind kind);

struct MemoryShape {
  MemoryKind kind = MemoryKind::kKv;
  std::vector<StateShape> kv;  // the KV sections, in the state's order (0, 1 or 2)
  uint32_t nSwa = 0;           // the window of the last KV section, for the iSWA kinds
  uint64_t stateBytes = 0;     // the recurrent section's bytes (recurrent kinds), else 0
  uint32_t streams = 1;

  bool recurrent() const {
    return kind == MemoryKind::kRecurrent || kind == MemoryKind::kHybrid ||
           kind == MemoryKind::kHybridIswa;
  }
  bool windowed() const { return kind == MemoryKind::kIswa || kind == MemoryKind::kHybridIswa; }
  // KV sections a state of this kind has.
  size_t kvSections() const;
  uint32_t kvLayers() const;
  // Bytes of one slot of a block: the largest K or V row of any layer.
  uint64_t slotBytes() const;
  // The positions a KV section holds in a state at `end` (exclusive), from its first: all of
  // [0, end) for a full section, the last nSwa for a windowed one.
  uint64_t sectionFirst(size_t section, uint64_t end) const;
  // Cells a restored windowed section starts with before its first position: with flash
  // attention, llama.cpp's CPU kernel sums over the cells in tiles of 64, so a batch of 64 tokens
  // or more computes exactly what a recompute does only when every position sits in the same
  // cell modulo 64 as the recompute put it (cell = position, the sequence evaluated from 0).
  // Those leading cells hold positions the window no longer sees, and zeros.
  static constexpr uint64_t kCellTile = 64;
};

// A state parsed into its sections: views into the buffer it was parsed from.
struct ParsedState {
  std::vector<SeqStateView> kv;
  std::span<const uint8_t> recurrent;
  int32_t recurrentPos = -1;  // the position of the recurrent section's one cell
};

// Parses a whole state of `kind` (llama_state_seq_get_data of one sequence, flags 0).
// INVALID_ARGUMENT naming the first field that is wrong.
Result<ParsedState> parseState(std::span<const uint8_t> state, MemoryKind kind, uint32_t streams);

// Checks a recurrent section kvtier is about to hand llama.cpp: one cell, at position pos - 1,
// not bound to a sequence (how llama.cpp writes one sequence's state), `bytes` long.
Status checkRecurrentSection(std::span<const uint8_t> section, uint64_t pos, uint64_t bytes);

// The shape of a context's memory from a state it wrote (a probe of one token); the kind comes
// from the model. NOT_SUPPORTED when the state has another structure.
Result<MemoryShape> shapeFromState(std::span<const uint8_t> state, MemoryKind kind,
                                   uint32_t streams, uint32_t nSwa);

// The blocks' translation. `layout` is the cache's (numLayers = shape.kvLayers()).
class StateMap {
 public:
  StateMap(const MemoryShape& shape, const Layout& layout);

  // Fills block bytes `dst` with the rows of positions first..first+blockTokens-1 from a parsed
  // state: `rows[s][i]` is the row of section s holding position first + i. Slots past `slots`
  // (a partial block) are left as they are.
  void fillBlock(uint8_t* dst, const ParsedState& state, const std::vector<const uint32_t*>& rows,
                 uint32_t slots) const;
  // fillBlock of a whole block (blockTokens slots) that also returns the block's checksum
  // (kernels::blockChecksum of the bytes it now holds), folded in from the source as it is copied
  // (the block is not read back); 0 when the block is not one run per layer, K and V, of
  // consecutive rows that fill it (transposed V, padded slots): then only filled.
  uint64_t fillBlockSummed(uint8_t* dst, const ParsedState& state,
                           const std::vector<const uint32_t*>& rows) const;

  // A state being built for a restore at `end`: its header, every KV section's cells (the
  // positions each section holds at `end`, from `from` on: a restore in steps builds states of
  // [from, end) for a plain KV cache) and their rows to fill, and room for the recurrent section
  // at its end.
  struct Build {
    std::span<uint8_t> bytes;
    std::vector<SeqStateSlots> slots;  // per section
    std::vector<uint64_t> first;       // per section: the position of its first cell
    std::vector<uint32_t> cells;       // per section (leading placeholder cells included)
    std::span<uint8_t> recurrent;      // stateBytes bytes to fill
  };
  // Bytes of such a state.
  size_t stateBytesAt(uint64_t from, uint64_t end) const;
  Build buildState(std::span<uint8_t> out, uint64_t from, uint64_t end, int32_t seq) const;
  // The runs of a block holding positions from `first` on that its slots [0, slots) fill in the
  // built state, for every section that holds them, ascending in the block.
  void blockRuns(const Build& build, uint64_t first, uint32_t slots,
                 std::vector<kernels::CopyRun>& runs) const;
  // Copies those runs out of block bytes `src` with `method`. `summed`: returns the XXH3 of the
  // whole block (chunkBytes), every byte read once, to check against its writer's; else 0.
  uint64_t drainBlock(const Build& build, uint64_t first, const uint8_t* src, uint32_t slots,
                      kernels::CopyMethod method, bool summed) const;

  const MemoryShape& shape() const { return shape_; }

 private:
  // The first position and the cells of section `s` of a state of [from, end).
  std::pair<uint64_t, uint32_t> sectionCells(size_t s, uint64_t from, uint64_t end) const;

  MemoryShape shape_;
  Layout layout_;
  uint64_t slotBytes_;
  std::vector<uint32_t> layerOffset_;  // per section: the block layer of its first layer
};

}  // namespace kvtier::llama
