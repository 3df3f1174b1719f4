#include "integrations/llama/seq_state.h"

#include <cstring>
#include <limits>

namespace kvtier::llama {
namespace {

// Bounds on what a parsed state may claim before any size arithmetic is trusted with it.
constexpr uint32_t kMaxStreams = 1024;  // llama.cpp's LLAMA_MAX_SEQ is 256
constexpr uint32_t kMaxLayers = 4096;

// A bounds-checked reader over the state's bytes.
class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}
  template <typename T>
  bool read(T& out) {
    if (bytes_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&out, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // Skips `n` bytes and returns where they start (nullptr past the end).
  const uint8_t* take(uint64_t n) {
    if (bytes_.size() - pos_ < n) return nullptr;
    const uint8_t* at = bytes_.data() + pos_;
    pos_ += n;
    return at;
  }
  bool atEnd() const { return pos_ == bytes_.size(); }
  size_t pos() const { return pos_; }
  size_t left() const { return bytes_.size() - pos_; }

 private:
  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
};

Error bad(size_t at, const char* what) {
  return makeError(ErrorCode::kInvalidArgument, "llama.cpp sequence state: ", what, " (byte ", at,
                   ")");
}

class Writer {
 public:
  explicit Writer(std::span<uint8_t> out) : out_(out) {}
  template <typename T>
  void put(const T& value) {
    std::memcpy(out_.data() + pos_, &value, sizeof(T));
    pos_ += sizeof(T);
  }
  uint8_t* skip(uint64_t n) {
    uint8_t* at = out_.data() + pos_;
    pos_ += n;
    return at;
  }
  size_t pos() const { return pos_; }

 private:
  std::span<uint8_t> out_;
  size_t pos_ = 0;
};

}  // namespace

Result<size_t> parseKvSection(std::span<const uint8_t> state, size_t offset,
                              uint32_t expectedStreams, int32_t seq, SeqStateView& view) {
  Reader r(state);
  if (r.take(offset) == nullptr) return bad(offset, "section past the end");
  uint32_t nStream = 0;
  if (!r.read(nStream)) return bad(r.pos(), "truncated section header");
  if (nStream == 0 || nStream > kMaxStreams || nStream != expectedStreams) {
    return bad(r.pos(), "stream count differs from the context's");
  }
  view = SeqStateView{};
  bool seen = false;
  for (uint32_t s = 0; s < nStream; ++s) {
    uint32_t cells = 0;
    if (!r.read(cells)) return bad(r.pos(), "truncated stream header");
    if (cells == 0) continue;
    if (seen) return bad(r.pos(), "cells in more than one stream");
    seen = true;
    // Each cell takes 12 bytes (position, sequence count, sequence): a count the bytes cannot hold
    // is refused before anything is sized by it.
    if (cells > r.left() / 12) return bad(r.pos(), "more cells than the state holds");
    view.cellCount = cells;
    view.positions.resize(cells);
    for (uint32_t i = 0; i < cells; ++i) {
      uint32_t nSeq = 0;
      int32_t cellSeq = 0;
      if (!r.read(view.positions[i]) || !r.read(nSeq)) return bad(r.pos(), "truncated cell");
      // One sequence's state names only that sequence; anything else is another format (cells
      // with extensions, M-RoPE) that this reader does not know.
      if (nSeq != 1 || !r.read(cellSeq) || cellSeq != seq) return bad(r.pos(), "unexpected cell");
      if (view.positions[i] < 0) return bad(r.pos(), "negative position");
    }
    uint32_t vTrans = 0, nLayer = 0;
    if (!r.read(vTrans) || !r.read(nLayer)) return bad(r.pos(), "truncated data header");
    // (No layers: a cache all of whose layers went to another section, e.g. a hybrid whose every
    // attention layer is windowed keeps only positions in its full-attention cache.)
    if (vTrans > 1 || nLayer > kMaxLayers) return bad(r.pos(), "bad data header");
    StateShape& shape = view.shape;
    shape.nLayer = nLayer;
    shape.vTrans = vTrans == 1;
    view.k.resize(nLayer);
    view.v.resize(nLayer);
    for (uint32_t l = 0; l < nLayer; ++l) {
      int32_t type = 0;
      uint64_t row = 0;
      if (!r.read(type) || !r.read(row)) return bad(r.pos(), "truncated K header");
      if (row == 0 || row > std::numeric_limits<uint32_t>::max()) return bad(r.pos(), "K row size");
      if (l > 0 && (type != shape.kType || row != shape.kRowBytes)) {
        return bad(r.pos(), "K differs between layers");
      }
      shape.kType = type;
      shape.kRowBytes = row;
      view.k[l] = r.take(row * cells);
      if (view.k[l] == nullptr) return bad(r.pos(), "truncated K rows");
    }
    for (uint32_t l = 0; l < nLayer; ++l) {
      int32_t type = 0;
      uint64_t row = 0;
      if (!r.read(type)) return bad(r.pos(), "truncated V header");
      if (shape.vTrans) {
        uint32_t elem = 0, nEmbd = 0;
        if (!r.read(elem) || !r.read(nEmbd)) return bad(r.pos(), "truncated V header");
        if (elem == 0 || nEmbd == 0) return bad(r.pos(), "V element size");
        if (l > 0 && (elem != shape.vElemBytes || nEmbd != shape.nEmbdV)) {
          return bad(r.pos(), "V differs between layers");
        }
        shape.vElemBytes = elem;
        shape.nEmbdV = nEmbd;
        row = uint64_t{elem} * nEmbd;
      } else {
        if (!r.read(row)) return bad(r.pos(), "truncated V header");
        if (row == 0 || row > std::numeric_limits<uint32_t>::max()) {
          return bad(r.pos(), "V row size");
        }
      }
      if (l > 0 && (type != shape.vType || row != shape.vRowBytes)) {
        return bad(r.pos(), "V differs between layers");
      }
      shape.vType = type;
      shape.vRowBytes = row;
      view.v[l] = r.take(row * cells);
      if (view.v[l] == nullptr) return bad(r.pos(), "truncated V rows");
    }
  }
  return r.pos();
}

Result<int32_t> parseSeqHeader(std::span<const uint8_t> state) {
  Reader r(state);
  uint32_t magic = 0;
  int32_t seq = 0;
  if (!r.read(magic) || magic != kSeqStateMagic) return bad(r.pos(), "wrong magic");
  if (!r.read(seq)) return bad(r.pos(), "truncated header");
  return seq;
}

Result<SeqStateView> parseSeqState(std::span<const uint8_t> state, uint32_t expectedStreams) {
  auto seq = parseSeqHeader(state);
  if (!seq) return seq.error();
  SeqStateView view;
  auto end = parseKvSection(state, kSeqHeaderBytes, expectedStreams, *seq, view);
  if (!end) return end.error();
  if (*end != state.size()) return bad(*end, "bytes after the last stream");
  return view;
}

size_t kvSectionBytes(const StateShape& shape, uint32_t cells, uint32_t streams) {
  size_t bytes = sizeof(uint32_t) + streams * sizeof(uint32_t);
  if (cells == 0) return bytes;
  bytes += size_t{cells} * 12;  // pos, n_seq_id, seq_id
  bytes += 2 * sizeof(uint32_t);
  const size_t vHeader = shape.vTrans ? 4 + 4 + 4 : 4 + 8;
  bytes += shape.nLayer * (4 + 8 + shape.kRowBytes * cells + vHeader + shape.vRowBytes * cells);
  return bytes;
}

size_t seqStateBytes(const StateShape& shape, uint32_t cells, uint32_t streams) {
  return kSeqHeaderBytes + kvSectionBytes(shape, cells, streams);
}

void writeSeqHeader(std::span<uint8_t> out, int32_t seq) {
  Writer w(out);
  w.put(kSeqStateMagic);
  w.put(seq);
}

SeqStateSlots writeKvSection(std::span<uint8_t> out, size_t offset, const StateShape& shape,
                             uint32_t cells, uint32_t streams, int32_t seq, int32_t firstPos) {
  Writer w(out.subspan(offset));
  w.put(streams);
  // llama.cpp reads a sequence's cells into that sequence's own stream whichever entry carries
  // them; the first one does, the others (after it) are empty.
  w.put(cells);
  SeqStateSlots slots;
  if (cells == 0) {
    for (uint32_t s = 1; s < streams; ++s) w.put(0u);
    return slots;
  }
  for (uint32_t i = 0; i < cells; ++i) {
    w.put(static_cast<int32_t>(firstPos + static_cast<int32_t>(i)));
    w.put(uint32_t{1});
    w.put(seq);
  }
  w.put(uint32_t{shape.vTrans ? 1u : 0u});
  w.put(shape.nLayer);
  slots.k.resize(shape.nLayer);
  slots.v.resize(shape.nLayer);
  for (uint32_t l = 0; l < shape.nLayer; ++l) {
    w.put(shape.kType);
    w.put(shape.kRowBytes);
    slots.k[l] = w.skip(shape.kRowBytes * cells);
  }
  for (uint32_t l = 0; l < shape.nLayer; ++l) {
    w.put(shape.vType);
    if (shape.vTrans) {
      w.put(shape.vElemBytes);
      w.put(shape.nEmbdV);
    } else {
      w.put(shape.vRowBytes);
    }
    slots.v[l] = w.skip(shape.vRowBytes * cells);
  }
  for (uint32_t s = 1; s < streams; ++s) w.put(0u);
  return slots;
}

SeqStateSlots buildSeqState(std::span<uint8_t> out, const StateShape& shape, uint32_t cells,
                            uint32_t streams, int32_t seq, int32_t firstPos) {
  writeSeqHeader(out, seq);
  return writeKvSection(out, kSeqHeaderBytes, shape, cells, streams, seq, firstPos);
}

}  // namespace kvtier::llama
