// Reference math shared by the RoPE tests (kernels/rope_test.cc) and the middle-removal tests
// (store/engine_shapes_test.cc): element encoding of the rotated dtypes, an independent rotation
// in double precision, and the tolerance a re-rotated element is held to.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "kernels/rope.h"
#include "kvtier/layout.h"

namespace kvtier::kernels::testing {

inline uint32_t elemBytes(DType d) { return d == DType::kFloat32 ? 4 : 2; }

inline void encode(DType d, double v, uint8_t* p) {
  const float f = static_cast<float>(v);
  if (d == DType::kFloat32) {
    std::memcpy(p, &f, 4);
    return;
  }
  const uint16_t h = d == DType::kFloat16 ? floatToHalf(f) : floatToBf16(f);
  std::memcpy(p, &h, 2);
}

inline double decode(DType d, const uint8_t* p) {
  if (d == DType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return d == DType::kFloat16 ? halfToFloat(h) : bf16ToFloat(h);
}

// One head's K (`x`, headDim values) rotated to position `pos`: each pair, as the complex number
// x_i + i x_j, times e^{i pos theta_d}, theta_d = base^(-2d / rotaryDims); pairs
// (d, d + rotaryDims/2) for NeoX, (2d, 2d + 1) for GPT-J.
inline std::vector<double> referenceRope(const RopeScheme& r, std::vector<double> x, double pos) {
  const uint32_t half = r.rotaryDims / 2;
  for (uint32_t d = 0; d < half; ++d) {
    const bool neox = r.style == RopeStyle::kNeox;
    const uint32_t i = neox ? d : 2 * d, j = neox ? d + half : 2 * d + 1;
    const double a = pos * std::pow(r.base, -2.0 * d / r.rotaryDims);
    const double xi = x[i], xj = x[j];
    x[i] = xi * std::cos(a) - xj * std::sin(a);
    x[j] = xi * std::sin(a) + xj * std::cos(a);
  }
  return x;
}

// The partner of dim `d` in its rotated pair.
inline uint32_t partner(const RopeScheme& r, uint32_t d) {
  const uint32_t half = r.rotaryDims / 2;
  if (r.style == RopeStyle::kNeox) return d < half ? d + half : d - half;
  return d ^ 1u;
}

// Error allowed on a rotated element, relative to the norm of its pair: a few of the format's
// roundings (unit roundoff: fp32 2^-24, fp16 2^-11, bf16 2^-8); K is rounded when stored and again
// after each rotation.
inline double tolerance(DType d) {
  return d == DType::kFloat32 ? 1e-5 : d == DType::kFloat16 ? 1.0 / 256 : 1.0 / 64;
}

}  // namespace kvtier::kernels::testing
