#include "store/eviction.h"

namespace kvtier {

void LruEvictionPolicy::insert(BlockId id, uint32_t sizeClass, bool first) {
  if (id >= nodes_.size()) nodes_.resize(id + 1);
  if (sizeClass >= lists_.size()) lists_.resize(sizeClass + 1);
  Node& n = nodes_[id];
  if (n.linked) erase(id);
  List& l = lists_[sizeClass];
  if (first) {
    n = Node{kNoBlock, l.head, sizeClass, true};
    if (l.head != kNoBlock) nodes_[l.head].prev = id;
    l.head = id;
    if (l.tail == kNoBlock) l.tail = id;
  } else {
    n = Node{l.tail, kNoBlock, sizeClass, true};
    if (l.tail != kNoBlock) nodes_[l.tail].next = id;
    l.tail = id;
    if (l.head == kNoBlock) l.head = id;
  }
  ++size_;
}

void LruEvictionPolicy::erase(BlockId id) {
  if (id >= nodes_.size() || !nodes_[id].linked) return;
  Node& n = nodes_[id];
  List& l = lists_[n.sizeClass];
  if (n.prev != kNoBlock)
    nodes_[n.prev].next = n.next;
  else
    l.head = n.next;
  if (n.next != kNoBlock)
    nodes_[n.next].prev = n.prev;
  else
    l.tail = n.prev;
  n = Node{};
  --size_;
}

BlockId LruEvictionPolicy::victim(uint32_t sizeClass) const {
  return sizeClass < lists_.size() ? lists_[sizeClass].head : kNoBlock;
}

void LruEvictionPolicy::oldest(uint32_t sizeClass, size_t max, std::vector<BlockId>& out) const {
  for (BlockId id = victim(sizeClass); id != kNoBlock && max > 0; id = nodes_[id].next, --max) {
    out.push_back(id);
  }
}

}  // namespace kvtier
