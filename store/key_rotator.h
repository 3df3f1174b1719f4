// KeyRotator: re-rotates K under the namespace's RoPE scheme, for middle removals.
//
// The engine calls it; kernels/ implements it (CpuKeyRotator, and the CUDA one of the GPU issue).
// An engine without one answers NOT_SUPPORTED to middle removals.
#pragma once

#include <cstdint>

#include "kvtier/layout.h"

namespace kvtier {

class KeyRotator {
 public:
  virtual ~KeyRotator() = default;
  // Whether K of this layout can be rotated (a RoPE scheme is declared, the dtype is supported).
  virtual bool supports(const Layout& layout) const = 0;
  // Rotates `tokens` tokens of K, packed [token][kvHead][headDim], by `delta` positions.
  virtual void rotate(const Layout& layout, uint8_t* k, uint64_t tokens, int64_t delta) const = 0;
};

}  // namespace kvtier
