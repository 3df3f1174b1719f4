// The arithmetic of RoPE re-rotation, shared by the CPU kernel (rope.cc) and the CUDA kernel
// (cuda/kernels.cu) so that both give the same bits: the same float conversions (integer code,
// round to nearest even) and the same fp32 operations in the same order, with no fused
// multiply-add (the CUDA side uses the _rn intrinsics, which the compiler never contracts).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace kvtier::kernels::detail {

KVTIER_HD uint32_t floatBits(float f) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(f);
#else
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  return x;
#endif
}

KVTIER_HD float bitsFloat(uint32_t x) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(x);
#else
  float f;
  std::memcpy(&f, &x, sizeof f);
  return f;
#endif
}

KVTIER_HD float halfToFloat(uint16_t h) {
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
  return bitsFloat(bits);
}

KVTIER_HD uint16_t floatToHalf(float f) {
  const uint32_t x = floatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf, nan
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow
  if (absx < 0x38800000u) {                                               // subnormal or 0
    if (absx < 0x33000000u) return sign;
    const uint32_t mant = (absx & 0x7fffffu) | 0x800000u;
    const int shift = 113 - static_cast<int>(absx >> 23);
    uint32_t h = mant >> (shift + 13);
    const uint32_t rem = mant & ((1u << (shift + 13)) - 1), half = 1u << (shift + 12);
    if (rem > half || (rem == half && (h & 1u))) ++h;  // round to nearest even
    return static_cast<uint16_t>(sign | h);
  }
  uint32_t h = ((absx >> 23) - 127 + 15) << 10 | ((absx >> 13) & 0x3ffu);
  const uint32_t rem = absx & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

KVTIER_HD float bf16ToFloat(uint16_t b) { return bitsFloat(uint32_t{b} << 16); }

KVTIER_HD uint16_t floatToBf16(float f) {
  uint32_t x = floatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(x >> 16);
}

// Element codes for the rotated dtypes: 0 fp16, 1 bf16, 2 fp32 (DType's values).
KVTIER_HD float loadElem(uint32_t dtype, const uint8_t* p) {
  if (dtype == 2) {
    float f;
    memcpy(&f, p, 4);
    return f;
  }
  uint16_t v;
  memcpy(&v, p, 2);
  return dtype == 0 ? halfToFloat(v) : bf16ToFloat(v);
}

KVTIER_HD void storeElem(uint32_t dtype, uint8_t* p, float f) {
  if (dtype == 2) {
    memcpy(p, &f, 4);
    return;
  }
  const uint16_t v = dtype == 0 ? floatToHalf(f) : floatToBf16(f);
  memcpy(p, &v, 2);
}

KVTIER_HD float mulRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KVTIER_HD float addRn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Rotates the pair of elements at i and j of one head by the angle whose cosine and sine are c, s.
KVTIER_HD void rotatePair(uint32_t dtype, uint8_t* head, uint32_t eb, uint32_t i, uint32_t j,
                          float c, float s) {
  const float x = loadElem(dtype, head + i * eb), y = loadElem(dtype, head + j * eb);
  storeElem(dtype, head + i * eb, addRn(mulRn(x, c), -mulRn(y, s)));
  storeElem(dtype, head + j * eb, addRn(mulRn(x, s), mulRn(y, c)));
}

}  // namespace kvtier::kernels::detail
