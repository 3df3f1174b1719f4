// CPU re-rotation of K under rotary position embeddings (RoPE).
//
// RoPE rotates each pair of K's first `rotaryDims` dims by the angle pos * theta_d, with
// theta_d = base^(-2d / rotaryDims). Rotations compose, so K computed at position p becomes K at
// position p + delta by one more rotation of delta * theta_d: this is how a middle removal moves
// tokens down without recomputing them. V is not rotated. The CUDA version (GPU issue) must match.
#pragma once

#include <cstdint>

#include "kvtier/layout.h"
#include "store/key_rotator.h"

namespace kvtier::kernels {

// True for the dtypes whose K can be rotated and stored back (fp16, bf16, fp32).
bool ropeSupports(DType dtype);

// Rotates `tokens` tokens of K, packed [token][kvHead][headDim] of `layout.dtype`, by `delta`
// positions. Computes in fp32 with one sin/cos table per call (every token moves by the same
// delta). Requires layout.rope.style != kNone and ropeSupports(layout.dtype).
void rotateK(const Layout& layout, uint8_t* k, uint64_t tokens, int64_t delta);

// The CPU KeyRotator the daemon gives its engine.
class CpuKeyRotator final : public KeyRotator {
 public:
  bool supports(const Layout& layout) const override {
    return layout.rope.style != RopeStyle::kNone && ropeSupports(layout.dtype);
  }
  void rotate(const Layout& layout, uint8_t* k, uint64_t tokens, int64_t delta) const override {
    rotateK(layout, k, tokens, delta);
  }
};

// cos and sin of delta * theta_d for d in [0, rotaryDims / 2): the table rotateK (and the CUDA
// kernel) rotate by, computed in double and rounded to float.
void ropeTable(const RopeScheme& rope, int64_t delta, float* cosines, float* sines);

// Float conversions of the supported dtypes (exposed for tests and reference code).
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bf16ToFloat(uint16_t b);
uint16_t floatToBf16(float f);

}  // namespace kvtier::kernels
