// HugePageAllocator: an allocator for the engine's per-block arrays (BlockMeta, the prefix index,
// the eviction lists), which hold tens of millions of entries read at random.
//
// With 4 KiB pages, 10 M blocks of metadata span ~250,000 pages: nearly every access at random is
// a TLB miss as well as a cache miss, and the page walk's own reads miss too, which prefetching
// cannot fully hide (issue 18: lookup latency flat from 10 k to 10 M blocks). Allocations of 2 MiB
// or more are therefore mapped on their own, 2 MiB-aligned, and advised MADV_HUGEPAGE, so that the
// kernel backs them with transparent huge pages where it allows them (Debian's default is
// "madvise": only such regions get them). Smaller ones come from operator new as usual. Memory is
// committed as pages are touched, as with malloc: a vector's unused capacity costs no RSS beyond
// the huge page it ends in.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

namespace kvtier {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Maps `bytes` (a multiple of kHugePageBytes) at a kHugePageBytes boundary, advised for huge
// pages; throws std::bad_alloc when the mapping fails.
inline void* mapHugeRegion(size_t bytes) {
  const size_t span = bytes + kHugePageBytes;
  void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  // Trim the unaligned head and the tail beyond `bytes`.
  const auto base = reinterpret_cast<uintptr_t>(p);
  const uintptr_t aligned = (base + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  if (aligned > base) ::munmap(p, aligned - base);
  const uintptr_t end = base + span;
  if (end > aligned + bytes)
    ::munmap(reinterpret_cast<void*>(aligned + bytes), end - aligned - bytes);
  ::madvise(reinterpret_cast<void*>(aligned), bytes, MADV_HUGEPAGE);  // a hint: failure is fine
  return reinterpret_cast<void*>(aligned);
}

template <typename T>
struct HugePageAllocator {
  using value_type = T;

  HugePageAllocator() = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}

  static size_t regionBytes(size_t n) {
    return (n * sizeof(T) + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  }

  T* allocate(size_t n) {
    if (n * sizeof(T) < kHugePageBytes) return std::allocator<T>().allocate(n);
    return static_cast<T*>(mapHugeRegion(regionBytes(n)));
  }
  void deallocate(T* p, size_t n) noexcept {
    if (n * sizeof(T) < kHugePageBytes) {
      std::allocator<T>().deallocate(p, n);
    } else {
      ::munmap(p, regionBytes(n));
    }
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace kvtier
