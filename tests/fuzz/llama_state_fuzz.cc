// Fuzz harness: the parser of llama.cpp's sequence states (integrations/llama/seq_state.h,
// state_map.h), the bytes kvtier's llama.cpp integration reads out of llama_state_seq_get_data
// for every memory kind (KV, iSWA, recurrent, hybrid, hybrid iSWA) and checks before it hands a
// recurrent section to llama.cpp.
//
// Input: byte 0 picks the memory kind (mod 5) and byte 1 the context's streams (1-4), byte 2 a
// window; the rest is the state. Properties checked besides "no crash, no read outside the
// buffer" (ASAN): every view a parse returns lies inside the state (per layer, the K and V rows
// of every cell), has a position per cell, and a shape parsed from a state has its sections.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>

#include "integrations/llama/seq_state.h"
#include "integrations/llama/state_map.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "kvtier fuzz: %s\n", what);
    std::abort();
  }
}

bool inside(std::span<const uint8_t> buffer, const uint8_t* p, uint64_t bytes) {
  return p >= buffer.data() && p <= buffer.data() + buffer.size() &&
         bytes <= static_cast<uint64_t>(buffer.data() + buffer.size() - p);
}

void checkView(std::span<const uint8_t> state, const kvtier::llama::SeqStateView& view) {
  check(view.positions.size() == view.cellCount, "a view has no position for some cell");
  if (view.cellCount == 0) return;
  check(view.k.size() == view.shape.nLayer && view.v.size() == view.shape.nLayer,
        "a view has rows for another number of layers");
  for (uint32_t l = 0; l < view.shape.nLayer; ++l) {
    check(inside(state, view.k[l], view.cellCount * view.shape.kRowBytes),
          "a view's K rows lie outside the state");
    check(inside(state, view.v[l], view.cellCount * view.shape.vRowBytes),
          "a view's V rows lie outside the state");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier::llama;
  if (size < 3) return 0;
  const auto kind = static_cast<MemoryKind>(data[0] % 5);
  const uint32_t streams = 1 + data[1] % 4;
  const uint32_t nSwa = data[2];
  const std::span<const uint8_t> state(data + 3, size - 3);

  (void)parseSeqHeader(state);
  if (auto view = parseSeqState(state, streams)) checkView(state, *view);
  if (auto parsed = parseState(state, kind, streams)) {
    for (const SeqStateView& view : parsed->kv) checkView(state, view);
    check(parsed->recurrent.empty() ||
              inside(state, parsed->recurrent.data(), parsed->recurrent.size()),
          "a recurrent section lies outside the state");
    if (!parsed->recurrent.empty()) {
      (void)checkRecurrentSection(parsed->recurrent, int64_t{parsed->recurrentPos} + 1,
                                  parsed->recurrent.size());
    }
  }
  if (auto shape = shapeFromState(state, kind, streams, nSwa)) {
    check(shape->kv.size() == shape->kvSections(), "a shape has another number of KV sections");
  }
  (void)checkRecurrentSection(state, nSwa, state.size());
  return 0;
}
