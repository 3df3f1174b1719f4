#include "store/block_pool.h"

#include <algorithm>
#include <cassert>
#include <stdexcept>

namespace kvtier {
namespace {

// Blocks of a page or more start on a page boundary (cheaper to map and copy); smaller ones on a
// cache line.
uint64_t alignmentFor(uint32_t blockBytes) { return blockBytes >= 4096 ? 4096 : 64; }

uint64_t alignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

BlockPool::BlockPool(std::vector<Extent> extents) : extents_(std::move(extents)) {
  for (const auto& e : extents_) {
    if (e.bytes >= (uint64_t{1} << 48) || e.id >= (1u << 16))
      throw std::invalid_argument("pool extent too large");
    bytesTotal_ += e.bytes;
    if (e.tier == 0) largestExtent_ = std::max(largestExtent_, e.bytes);
    if (cursors_.size() <= e.tier) cursors_.resize(size_t{e.tier} + 1);
    cursors_[e.tier].present = true;
  }
}

BlockId BlockPool::find(uint32_t extent, uint64_t offset) const {
  if (extent >= runs_.size()) return kNoBlock;
  const std::vector<Run>& runs = runs_[extent];
  // The last run starting at or before `offset`.
  auto it = std::upper_bound(runs.begin(), runs.end(), offset,
                             [](uint64_t o, const Run& r) { return o < r.offset; });
  if (it == runs.begin()) return kNoBlock;
  const Run& r = *--it;
  const uint64_t delta = offset - r.offset;
  if (delta % r.stride != 0 || delta / r.stride >= r.count) return kNoBlock;
  return r.first + static_cast<BlockId>(delta / r.stride);
}

uint32_t BlockPool::sizeClass(uint32_t blockBytes, uint8_t tier) {
  for (uint32_t i = 0; i < classes_.size(); ++i) {
    if (classes_[i].blockBytes == blockBytes && classes_[i].tier == tier) return i;
  }
  classes_.push_back(SizeClass{blockBytes, tier});
  return static_cast<uint32_t>(classes_.size() - 1);
}

BlockId BlockPool::carve(uint32_t cls) {
  const uint32_t bytes = classes_[cls].blockBytes;
  const uint64_t align = alignmentFor(bytes);
  const uint8_t tier = classes_[cls].tier;
  if (tier >= cursors_.size()) return kNoBlock;
  Cursor& cur = cursors_[tier];
  while (cur.extent < extents_.size()) {
    if (extents_[cur.extent].tier != tier) {
      ++cur.extent;
      continue;
    }
    const uint64_t offset = alignUp(cur.offset, align);
    if (offset + bytes <= extents_[cur.extent].bytes) {
      if (blocks_.size() >= kNoBlock) return kNoBlock;  // ids are 32-bit
      cur.offset = offset + bytes;
      const auto id = static_cast<BlockId>(blocks_.size());
      const uint32_t extentId = extents_[cur.extent].id;
      BlockMeta meta;
      meta.extent = extentId;
      meta.offset = offset;
      meta.sizeClass = cls;
      blocks_.push_back(meta);
      sums_.push_back(0);
      classes_[cls].carved++;
      // Extend the extent's last run when this block follows its last one at its stride.
      if (runs_.size() <= extentId) runs_.resize(size_t{extentId} + 1);
      std::vector<Run>& runs = runs_[extentId];
      const uint64_t stride = alignUp(bytes, align);
      if (!runs.empty()) {
        Run& last = runs.back();
        if (last.stride == stride && last.first + last.count == id &&
            last.offset + uint64_t{last.count} * stride == offset) {
          ++last.count;
          return id;
        }
      }
      runs.push_back(Run{offset, stride, id, 1});
      return id;
    }
    // A block never straddles two extents: the tail of this one stays unused.
    ++cur.extent;
    cur.offset = 0;
  }
  return kNoBlock;
}

BlockId BlockPool::allocate(uint32_t cls, TenantId tenant) {
  SizeClass& c = classes_[cls];
  BlockId id = c.freeHead;
  if (id != kNoBlock) {
    c.freeHead = blocks_[id].nextFree;
  } else {
    id = carve(cls);
    if (id == kNoBlock) return kNoBlock;
  }
  BlockMeta& m = blocks_[id];
  assert(m.state == BlockState::kFree && m.refs == 0 && m.pins == 0);
  m.state = BlockState::kWriting;
  m.nextFree = kNoBlock;
  c.used++;
  used_++;
  bytesUsed_ += c.blockBytes;
  setTenant(id, tenant);
  return id;
}

void BlockPool::setTenant(BlockId id, TenantId tenant) {
  BlockMeta& m = blocks_[id];
  const SizeClass& c = classes_[m.sizeClass];
  if (c.tier != 0) return;  // tenants are charged for the host pool only
  if (m.tenant != kNoTenant) tenantBytes_[m.tenant] -= c.blockBytes;
  m.tenant = tenant;
  if (tenant == kNoTenant) return;
  if (tenant >= tenantBytes_.size()) tenantBytes_.resize(size_t{tenant} + 1, 0);
  tenantBytes_[tenant] += c.blockBytes;
}

void BlockPool::release(BlockId id) {
  BlockMeta& m = blocks_[id];
  assert(m.state != BlockState::kFree && m.refs == 0 && m.pins == 0);
  assert(!m.tenantLinked);
  setTenant(id, kNoTenant);
  SizeClass& c = classes_[m.sizeClass];
  m.state = BlockState::kFree;
  m.generation++;
  m.key = {};
  m.entry = false;
  m.onDisk = false;
  m.spilling = false;
  m.replicaSettles = 0;
  m.summed = false;
  m.corrupt = false;
  m.nextFree = c.freeHead;
  c.freeHead = id;
  c.used--;
  used_--;
  bytesUsed_ -= c.blockBytes;
}

BlockLocation BlockPool::location(BlockId id) const {
  const BlockMeta& m = blocks_[id];
  return BlockLocation{static_cast<uint32_t>(m.extent), m.offset, classes_[m.sizeClass].blockBytes,
                       m.generation};
}

uint64_t BlockPool::carvableBlocks(uint32_t blockBytes, uint8_t tier) const {
  if (tier >= cursors_.size()) return 0;
  const Cursor& cur = cursors_[tier];
  const uint64_t align = alignmentFor(blockBytes);
  const uint64_t stride = alignUp(blockBytes, align);
  uint64_t n = 0;
  for (size_t e = cur.extent; e < extents_.size(); ++e) {
    if (extents_[e].tier != tier) continue;
    const uint64_t offset = alignUp(e == cur.extent ? cur.offset : 0, align);
    if (offset + blockBytes <= extents_[e].bytes)
      n += (extents_[e].bytes - offset - blockBytes) / stride + 1;
  }
  return n;
}

uint64_t BlockPool::blocksTotal(uint32_t cls) const {
  return classes_[cls].carved + carvableBlocks(classes_[cls].blockBytes, classes_[cls].tier);
}

HeapBlockMemory::HeapBlockMemory(const std::vector<BlockPool::Extent>& extents) {
  uint32_t maxId = 0;
  for (const auto& e : extents) maxId = std::max(maxId, e.id);
  extents_.resize(maxId + 1);
  for (const auto& e : extents) extents_[e.id].resize(e.bytes);
}

std::vector<BlockCopy> coalesceCopies(std::vector<BlockCopy> copies,
                                      std::span<const MemoryRange> ranges) {
  auto rangeOf = [&](const uint8_t* p, uint64_t bytes) -> size_t {
    for (size_t i = 0; i < ranges.size(); ++i) {
      const MemoryRange& r = ranges[i];
      if (p >= r.base && p + bytes <= r.base + r.bytes) return i;
    }
    return ranges.size();  // in none
  };
  std::sort(copies.begin(), copies.end(),
            [](const BlockCopy& a, const BlockCopy& b) { return a.src < b.src; });
  std::vector<BlockCopy> out;
  out.reserve(copies.size());
  size_t lastSrc = ranges.size(), lastDst = ranges.size();
  for (const BlockCopy& c : copies) {
    const size_t src = rangeOf(c.src, c.bytes), dst = rangeOf(c.dst, c.bytes);
    if (!out.empty() && src < ranges.size() && dst < ranges.size() && src == lastSrc &&
        dst == lastDst && out.back().src + out.back().bytes == c.src &&
        out.back().dst + out.back().bytes == c.dst) {
      out.back().bytes += c.bytes;
    } else {
      out.push_back(c);
    }
    lastSrc = src;
    lastDst = dst;
  }
  return out;
}

}  // namespace kvtier
