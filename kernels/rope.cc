#include "kernels/rope.h"

#include <cmath>
#include <cstring>
#include <vector>

namespace kvtier::kernels {

bool ropeSupports(DType dtype) {
  return dtype == DType::kFloat16 || dtype == DType::kBFloat16 || dtype == DType::kFloat32;
}

float halfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0);  // inf, nan
  if (absx >= 0x477ff000u) return sign | 0x7c00u;                                      // overflow
  if (absx < 0x38800000u) {  // subnormal or 0
    if (absx < 0x33000000u) return sign;
    const uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const int shift = 113 - static_cast<int>(absx >> 23);
    uint32_t h = mant >> (shift + 13);
    const uint32_t rem = mant & ((1u << (shift + 13)) - 1), half = 1u << (shift + 12);
    if (rem > half || (rem == half && (h & 1u))) ++h;  // round to nearest even
    return sign | static_cast<uint16_t>(h);
  }
  uint32_t h = ((absx >> 23) - 127 + 15) << 10 | ((absx >> 13) & 0x3ffu);
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return sign | static_cast<uint16_t>(h);
}

float bf16ToFloat(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

uint16_t floatToBf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

namespace {

float load(DType dtype, const uint8_t* p) {
  switch (dtype) {
    case DType::kFloat16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return halfToFloat(h);
    }
    case DType::kBFloat16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return bf16ToFloat(b);
    }
    default: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
  }
}

void store(DType dtype, uint8_t* p, float v) {
  switch (dtype) {
    case DType::kFloat16: {
      const uint16_t h = floatToHalf(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t b = floatToBf16(v);
      std::memcpy(p, &b, 2);
      break;
    }
    default:
      std::memcpy(p, &v, 4);
  }
}

}  // namespace

void rotateK(const Layout& layout, uint8_t* k, uint64_t tokens, int64_t delta) {
  const RopeScheme& rope = layout.rope;
  const uint32_t half = rope.rotaryDims / 2;
  const uint32_t eb = layout.dtype == DType::kFloat32 ? 4 : 2;  // ropeSupports: f32, f16, bf16
  std::vector<float> cosines(half), sines(half);
  for (uint32_t d = 0; d < half; ++d) {
    const double theta = std::pow(rope.base, -2.0 * d / rope.rotaryDims);
    const double angle = static_cast<double>(delta) * theta;
    cosines[d] = static_cast<float>(std::cos(angle));
    sines[d] = static_cast<float>(std::sin(angle));
  }
  const uint64_t heads = tokens * layout.numKvHeads;
  for (uint64_t h = 0; h < heads; ++h) {
    uint8_t* head = k + h * layout.headDim * eb;
    for (uint32_t d = 0; d < half; ++d) {
      const uint32_t i = rope.style == RopeStyle::kNeox ? d : 2 * d;
      const uint32_t j = rope.style == RopeStyle::kNeox ? d + half : 2 * d + 1;
      const float x = load(layout.dtype, head + i * eb), y = load(layout.dtype, head + j * eb);
      store(layout.dtype, head + i * eb, x * cosines[d] - y * sines[d]);
      store(layout.dtype, head + j * eb, x * sines[d] + y * cosines[d]);
    }
  }
}

}  // namespace kvtier::kernels
