// llama.cpp's serialized sequence state (llama_state_seq_get_data / set_data), read and built.
//
// The format, as llama.cpp 0.5.0 writes it for a model whose memory is the plain KV cache
// (src/llama-context.cpp state_seq_get_data, src/llama-kv-cache.cpp state_write_*):
//   u32 magic 0xaf143cd8, i32 seq_id
//   u32 n_stream, then per stream: u32 cell_count, and when it is not 0:
//     cell_count x { i32 pos, u32 n_seq_id (1), i32 seq_id }              (cells, cache order)
//     u32 v_trans, u32 n_layer
//     n_layer x { i32 k_type, u64 k_row_bytes, cell_count rows of K }
//     v_trans = 0: n_layer x { i32 v_type, u64 v_row_bytes, cell_count rows of V }
//     v_trans = 1: n_layer x { i32 v_type, u32 v_elem_bytes, u32 n_embd_v,
//                              n_embd_v x (cell_count elements of V) }
// Every field is checked where it is read: a state that does not parse whole, exactly, is
// refused, never guessed at. Tested against the engine itself (seq_state_test.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kvtier/error.h"

namespace kvtier::llama {

inline constexpr uint32_t kSeqStateMagic = 0xaf143cd8;
inline constexpr size_t kSeqHeaderBytes = 8;  // magic, seq_id

// What one layer's K and V look like in the state, the same for every layer of the models this
// integration maps.
struct StateShape {
  uint32_t nLayer = 0;
  int32_t kType = 0, vType = 0;  // ggml_type
  uint64_t kRowBytes = 0;        // one cell's K in one layer
  uint64_t vRowBytes = 0;        // one cell's V in one layer (n_embd_v * vElemBytes if transposed)
  bool vTrans = false;           // V stored transposed: [n_embd_v][cell] elements
  uint32_t vElemBytes = 0, nEmbdV = 0;  // meaningful when vTrans
  bool operator==(const StateShape&) const = default;
};

// A parsed state: views into the buffer it was parsed from (which must outlive it).
struct SeqStateView {
  StateShape shape;
  uint32_t cellCount = 0;
  std::vector<int32_t> positions;    // per cell, in the state's order
  std::vector<const uint8_t*> k, v;  // per layer: the K rows, the V rows (or V columns)
};

// Parses the state of one sequence of a plain KV cache. `expectedStreams` is the context's stream
// count; the cells must all be in one stream. INVALID_ARGUMENT naming the first field that is
// wrong.
Result<SeqStateView> parseSeqState(std::span<const uint8_t> state, uint32_t expectedStreams);
// The header of any sequence state: its sequence id.
Result<int32_t> parseSeqHeader(std::span<const uint8_t> state);
// Parses the section one KV cache wrote for sequence `seq` at `offset` of a state (the format
// above, from n_stream on); returns the offset past it. A section of no cells has no shape.
Result<size_t> parseKvSection(std::span<const uint8_t> state, size_t offset,
                              uint32_t expectedStreams, int32_t seq, SeqStateView& view);

// Bytes of a state holding `cells` cells of `shape`, in a context of `streams` streams; of one
// KV section of them.
size_t seqStateBytes(const StateShape& shape, uint32_t cells, uint32_t streams);
size_t kvSectionBytes(const StateShape& shape, uint32_t cells, uint32_t streams);

// Where buildSeqState put things, for the caller to fill: per layer, the first byte of the K rows
// and of the V rows (or columns).
struct SeqStateSlots {
  std::vector<uint8_t*> k, v;
};

// Writes into `out` (seqStateBytes(...) bytes) a state of `cells` cells at positions
// firstPos..firstPos+cells-1 for `seq`, whose K and V are left for the caller to fill at the
// returned slots.
SeqStateSlots buildSeqState(std::span<uint8_t> out, const StateShape& shape, uint32_t cells,
                            uint32_t streams, int32_t seq, int32_t firstPos = 0);
// The pieces of buildSeqState: the header, and a KV section at `offset`.
void writeSeqHeader(std::span<uint8_t> out, int32_t seq);
SeqStateSlots writeKvSection(std::span<uint8_t> out, size_t offset, const StateShape& shape,
                             uint32_t cells, uint32_t streams, int32_t seq, int32_t firstPos);

}  // namespace kvtier::llama
