#include "integrations/llama/state_map.h"

#include <algorithm>
#include <cstring>

#include "kernels/block_copy.h"
#include "kernels/block_sum.h"

namespace kvtier::llama {

namespace {

Error bad(const char* what) {
  return makeError(ErrorCode::kInvalidArgument, "llama.cpp sequence state: ", what);
}

template <typename T>
bool readAt(std::span<const uint8_t> bytes, size_t at, T& out) {
  if (at > bytes.size() || bytes.size() - at < sizeof(T)) return false;
  std::memcpy(&out, bytes.data() + at, sizeof(T));
  return true;
}

}  // namespace

const char* memoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kKv:
      return "kv";
    case MemoryKind::kIswa:
      return "iswa";
    case MemoryKind::kRecurrent:
      return "recurrent";
    case MemoryKind::kHybrid:
      return "hybrid";
    case MemoryKind::kHybridIswa:
      return "hybrid-iswa";
  }
  return "?";
}

size_t MemoryShape::kvSections() const {
  switch (kind) {
    case MemoryKind::kKv:
    case MemoryKind::kHybrid:
      return 1;
    case MemoryKind::kIswa:
    case MemoryKind::kHybridIswa:
      return 2;
    case MemoryKind::kRecurrent:
      return 0;
  }
  return 0;
}

uint32_t MemoryShape::kvLayers() const {
  uint32_t n = 0;
  for (const StateShape& s : kv) n += s.nLayer;
  return n;
}

uint64_t MemoryShape::slotBytes() const {
  uint64_t n = 0;
  for (const StateShape& s : kv) n = std::max({n, s.kRowBytes, s.vRowBytes});
  return n;
}

uint64_t MemoryShape::sectionFirst(size_t section, uint64_t end) const {
  const bool window = windowed() && section + 1 == kv.size();
  return window && end > nSwa ? end - nSwa : 0;
}

Result<ParsedState> parseState(std::span<const uint8_t> state, MemoryKind kind, uint32_t streams) {
  auto seq = parseSeqHeader(state);
  if (!seq) return seq.error();
  MemoryShape probe;
  probe.kind = kind;
  ParsedState out;
  out.kv.resize(probe.kvSections());
  size_t at = kSeqHeaderBytes;
  for (SeqStateView& view : out.kv) {
    auto end = parseKvSection(state, at, streams, *seq, view);
    if (!end) return end.error();
    at = *end;
  }
  out.recurrent = state.subspan(at);
  if (!probe.recurrent()) {
    if (!out.recurrent.empty()) return bad("bytes after the last KV section");
    return out;
  }
  uint32_t cells = 0, nSeq = 0;
  if (!readAt(out.recurrent, 0, cells) || !readAt(out.recurrent, 4, out.recurrentPos) ||
      !readAt(out.recurrent, 8, nSeq)) {
    return bad("truncated recurrent section");
  }
  // One sequence's recurrent state is one cell, written without its sequence ids.
  if (cells != 1 || nSeq != 0 || out.recurrentPos < 0) return bad("unexpected recurrent cell");
  return out;
}

Status checkRecurrentSection(std::span<const uint8_t> section, uint64_t pos, uint64_t bytes) {
  uint32_t cells = 0, nSeq = 0;
  int32_t cellPos = -1;
  if (section.size() != bytes || !readAt(section, 0, cells) || !readAt(section, 4, cellPos) ||
      !readAt(section, 8, nSeq)) {
    return bad("recurrent section of another size");
  }
  if (cells != 1 || nSeq != 0 || pos == 0 || cellPos != static_cast<int64_t>(pos) - 1) {
    return bad("recurrent section of another position");
  }
  return {};
}

Result<MemoryShape> shapeFromState(std::span<const uint8_t> state, MemoryKind kind,
                                   uint32_t streams, uint32_t nSwa) {
  auto parsed = parseState(state, kind, streams);
  if (!parsed) {
    return makeError(ErrorCode::kNotSupported, "the context's memory (", memoryKindName(kind),
                     ") writes a state kvtier cannot map: ", parsed.error().message());
  }
  MemoryShape shape;
  shape.kind = kind;
  shape.nSwa = nSwa;
  shape.streams = streams;
  for (const SeqStateView& view : parsed->kv) {
    if (view.cellCount == 0) {
      return makeError(ErrorCode::kNotSupported, "a KV section of the probe holds no cell");
    }
    if (!shape.kv.empty() && view.shape.nLayer > 0 && shape.kv.front().nLayer > 0 &&
        shape.kv.front().vTrans != view.shape.vTrans) {
      return makeError(ErrorCode::kNotSupported, "KV sections arrange V differently");
    }
    shape.kv.push_back(view.shape);
  }
  shape.stateBytes = parsed->recurrent.size();
  if (shape.windowed() && nSwa == 0) {
    return makeError(ErrorCode::kNotSupported, "a windowed memory without a window");
  }
  return shape;
}

StateMap::StateMap(const MemoryShape& shape, const Layout& layout)
    : shape_(shape), layout_(layout), slotBytes_(shape.slotBytes()) {
  uint32_t layer = 0;
  for (const StateShape& s : shape_.kv) {
    layerOffset_.push_back(layer);
    layer += s.nLayer;
  }
}

void StateMap::fillBlock(uint8_t* dst, const ParsedState& state,
                         const std::vector<const uint32_t*>& rows, uint32_t slots) const {
  const uint32_t bt = layout_.blockTokens;
  for (size_t s = 0; s < shape_.kv.size(); ++s) {
    const StateShape& sh = shape_.kv[s];
    const SeqStateView& view = state.kv[s];
    const uint32_t* row = rows[s];
    bool consecutive = true;
    for (uint32_t i = 1; i < slots; ++i) consecutive = consecutive && row[i] == row[0] + i;
    for (uint32_t l = 0; l < sh.nLayer; ++l) {
      const uint32_t layer = layerOffset_[s] + l;
      uint8_t* k = dst + layout_.slotOffset(layer, 0, 0);
      uint8_t* v = dst + layout_.slotOffset(layer, 1, 0);
      if (consecutive && slotBytes_ == sh.kRowBytes) {
        kernels::copyBytes(k, view.k[l] + uint64_t{row[0]} * sh.kRowBytes, slots * sh.kRowBytes,
                           kernels::CopyDirection::kIntoPool);
      } else {
        for (uint32_t i = 0; i < slots; ++i) {
          std::memcpy(k + i * slotBytes_, view.k[l] + uint64_t{row[i]} * sh.kRowBytes,
                      sh.kRowBytes);
        }
      }
      if (sh.vTrans) {
        // V transposed: the block holds n_embd_v columns of blockTokens elements.
        const uint32_t el = sh.vElemBytes;
        for (uint32_t j = 0; j < sh.nEmbdV; ++j) {
          const uint8_t* col = view.v[l] + uint64_t{j} * view.cellCount * el;
          uint8_t* out = v + uint64_t{j} * bt * el;
          if (consecutive) {
            std::memcpy(out, col + uint64_t{row[0]} * el, uint64_t{slots} * el);
          } else {
            for (uint32_t i = 0; i < slots; ++i) {
              std::memcpy(out + i * el, col + uint64_t{row[i]} * el, el);
            }
          }
        }
      } else if (consecutive && slotBytes_ == sh.vRowBytes) {
        kernels::copyBytes(v, view.v[l] + uint64_t{row[0]} * sh.vRowBytes, slots * sh.vRowBytes,
                           kernels::CopyDirection::kIntoPool);
      } else {
        for (uint32_t i = 0; i < slots; ++i) {
          std::memcpy(v + i * slotBytes_, view.v[l] + uint64_t{row[i]} * sh.vRowBytes,
                      sh.vRowBytes);
        }
      }
    }
  }
}

uint64_t StateMap::fillBlockSummed(uint8_t* dst, const ParsedState& state,
                                   const std::vector<const uint32_t*>& rows) const {
  const uint32_t bt = layout_.blockTokens;
  bool runs = true;  // every layer's K and V one run of whole slots, the runs filling the block
  for (size_t s = 0; s < shape_.kv.size() && runs; ++s) {
    const StateShape& sh = shape_.kv[s];
    runs = !sh.vTrans && sh.kRowBytes == slotBytes_ && sh.vRowBytes == slotBytes_;
    for (uint32_t i = 1; i < bt && runs; ++i) runs = rows[s][i] == rows[s][0] + i;
  }
  if (!runs || layout_.tokenBytes() != slotBytes_ || layout_.numLayers != shape_.kvLayers()) {
    fillBlock(dst, state, rows, bt);
    return 0;
  }
  // The runs in the block's order (layer by layer, K then V; the sections' layers in turn).
  kernels::FusedXxh3 sum(layout_.blockBytes(),
                         kernels::copyMethod(kernels::CopyDirection::kIntoPool));
  const uint64_t run = uint64_t{bt} * slotBytes_;
  for (size_t s = 0; s < shape_.kv.size(); ++s) {
    const SeqStateView& view = state.kv[s];
    const uint64_t first = uint64_t{rows[s][0]} * slotBytes_;
    for (uint32_t l = 0; l < shape_.kv[s].nLayer; ++l) {
      const uint32_t layer = layerOffset_[s] + l;
      sum.feed(dst + layout_.slotOffset(layer, 0, 0), view.k[l] + first, run);
      sum.feed(dst + layout_.slotOffset(layer, 1, 0), view.v[l] + first, run);
    }
  }
  return sum.digest();
}

std::pair<uint64_t, uint32_t> StateMap::sectionCells(size_t s, uint64_t from, uint64_t end) const {
  uint64_t first = std::max(from, shape_.sectionFirst(s, end));
  if (first > from) first -= first % MemoryShape::kCellTile;  // a window: placeholders first
  return {first, static_cast<uint32_t>(end - first)};
}

size_t StateMap::stateBytesAt(uint64_t from, uint64_t end) const {
  size_t bytes = kSeqHeaderBytes + shape_.stateBytes;
  for (size_t s = 0; s < shape_.kv.size(); ++s) {
    bytes += kvSectionBytes(shape_.kv[s], sectionCells(s, from, end).second, shape_.streams);
  }
  return bytes;
}

StateMap::Build StateMap::buildState(std::span<uint8_t> out, uint64_t from, uint64_t end,
                                     int32_t seq) const {
  Build b;
  b.bytes = out;
  writeSeqHeader(out, seq);
  size_t at = kSeqHeaderBytes;
  for (size_t s = 0; s < shape_.kv.size(); ++s) {
    const auto [first, cells] = sectionCells(s, from, end);
    b.slots.push_back(writeKvSection(out, at, shape_.kv[s], cells, shape_.streams, seq,
                                     static_cast<int32_t>(first)));
    b.first.push_back(first);
    b.cells.push_back(cells);
    at += kvSectionBytes(shape_.kv[s], cells, shape_.streams);
    // Placeholder cells (positions before the window) hold zeros; no block fills them.
    const uint64_t lead = std::max(from, shape_.sectionFirst(s, end)) - first;
    if (lead == 0) continue;
    const StateShape& sh = shape_.kv[s];
    for (uint32_t l = 0; l < sh.nLayer; ++l) {
      std::memset(b.slots.back().k[l], 0, lead * sh.kRowBytes);
      if (!sh.vTrans) {
        std::memset(b.slots.back().v[l], 0, lead * sh.vRowBytes);
        continue;
      }
      for (uint32_t j = 0; j < sh.nEmbdV; ++j) {
        std::memset(b.slots.back().v[l] + uint64_t{j} * cells * sh.vElemBytes, 0,
                    lead * sh.vElemBytes);
      }
    }
  }
  b.recurrent = out.subspan(at, shape_.stateBytes);
  return b;
}

void StateMap::blockRuns(const Build& build, uint64_t first, uint32_t slots,
                         std::vector<kernels::CopyRun>& runs) const {
  runs.clear();
  auto add = [&runs](uint64_t offset, uint64_t bytes, uint8_t* dst) {
    // Runs that continue one another in the block and in the state are one run.
    if (!runs.empty()) {
      kernels::CopyRun& last = runs.back();
      if (last.offset + last.bytes == offset && last.dst + last.bytes == dst) {
        last.bytes += bytes;
        return;
      }
    }
    runs.push_back({offset, bytes, dst});
  };
  const uint32_t bt = layout_.blockTokens;
  for (size_t s = 0; s < shape_.kv.size(); ++s) {
    // The block's slots this section holds: positions [lo, hi) of [first, first + slots).
    const uint64_t lo = std::max(first, build.first[s]);
    const uint64_t hi = std::min(first + slots, build.first[s] + build.cells[s]);
    if (lo >= hi) continue;
    const auto slot0 = static_cast<uint32_t>(lo - first), n = static_cast<uint32_t>(hi - lo);
    const uint64_t row0 = lo - build.first[s];
    const StateShape& sh = shape_.kv[s];
    for (uint32_t l = 0; l < sh.nLayer; ++l) {
      const uint32_t layer = layerOffset_[s] + l;
      const uint64_t k = layout_.slotOffset(layer, 0, 0), v = layout_.slotOffset(layer, 1, 0);
      uint8_t* kOut = build.slots[s].k[l] + row0 * sh.kRowBytes;
      for (uint32_t i = 0; i < n; ++i) {
        add(k + (slot0 + i) * slotBytes_, sh.kRowBytes, kOut + i * sh.kRowBytes);
      }
      if (sh.vTrans) {
        // llama.cpp's V without flash attention: rows of one channel over the cells.
        const uint32_t el = sh.vElemBytes;
        for (uint32_t j = 0; j < sh.nEmbdV; ++j) {
          add(v + (uint64_t{j} * bt + slot0) * el, uint64_t{n} * el,
              build.slots[s].v[l] + (uint64_t{j} * build.cells[s] + row0) * el);
        }
      } else {
        uint8_t* vOut = build.slots[s].v[l] + row0 * sh.vRowBytes;
        for (uint32_t i = 0; i < n; ++i) {
          add(v + (slot0 + i) * slotBytes_, sh.vRowBytes, vOut + i * sh.vRowBytes);
        }
      }
    }
  }
  // Sections follow one another in the block; sorted all the same, as a summed copy needs.
  if (!std::is_sorted(runs.begin(), runs.end(),
                      [](const auto& a, const auto& b) { return a.offset < b.offset; })) {
    std::sort(runs.begin(), runs.end(),
              [](const auto& a, const auto& b) { return a.offset < b.offset; });
  }
}

uint64_t StateMap::drainBlock(const Build& build, uint64_t first, const uint8_t* src,
                              uint32_t slots, kernels::CopyMethod method, bool summed) const {
  thread_local std::vector<kernels::CopyRun> runs;
  blockRuns(build, first, slots, runs);
  if (summed) return kernels::copyRunsSummed(src, layout_.chunkBytes(), runs, method);
  for (const kernels::CopyRun& run : runs) {
    kernels::copyWithMethod(
        run.dst, src + run.offset, run.bytes,
        run.bytes >= kernels::kStreamingThreshold ? method : kernels::CopyMethod::kCached);
  }
  return 0;
}

}  // namespace kvtier::llama
