#include "kernels/rope.h"

#include <cmath>
#include <vector>

#include "kernels/rope_math.h"

namespace kvtier::kernels {

bool ropeSupports(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32;
}

float halfToFloat(uint16_t h) { return detail::halfToFloat(h); }
uint16_t floatToHalf(float f) { return detail::floatToHalf(f); }
float bf16ToFloat(uint16_t b) { return detail::bf16ToFloat(b); }
uint16_t floatToBf16(float f) { return detail::floatToBf16(f); }

void ropeTable(const RopeScheme& rope, int64_t delta, float* cosines, float* sines) {
  for (uint32_t d = 0; d < rope.rotaryDims / 2; ++d) {
    const double theta = std::pow(rope.base, -2.0 * d / rope.rotaryDims);
    const double angle = static_cast<double>(delta) * theta;
    cosines[d] = static_cast<float>(std::cos(angle));
    sines[d] = static_cast<float>(std::sin(angle));
  }
}

void rotateK(const Layout& layout, uint8_t* k, uint64_t tokens, int64_t delta) {
  const RopeScheme& rope = layout.rope;
  const uint32_t half = rope.rotaryDims / 2;
  const uint32_t eb = layout.dtype == DType::kFloat32 ? 4 : 2;  // ropeSupports: f32, f16, bf16
  const auto dtype = static_cast<uint32_t>(layout.dtype);
  std::vector<float> cosines(half), sines(half);
  ropeTable(rope, delta, cosines.data(), sines.data());
  const uint64_t heads = tokens * layout.numKvHeads;
  for (uint64_t h = 0; h < heads; ++h) {
    uint8_t* head = k + h * layout.headDim * eb;
    for (uint32_t d = 0; d < half; ++d) {
      const bool neox = rope.style == RopeStyle::kNeox;
      detail::rotatePair(dtype, head, eb, neox ? d : 2 * d, neox ? d + half : 2 * d + 1, cosines[d],
                         sines[d]);
    }
  }
}

}  // namespace kvtier::kernels
