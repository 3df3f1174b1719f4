// Tests of the CPU RoPE re-rotation (kernels/rope.h) and of its fp16 / bf16 conversions, against
// reference code written here (format definitions, nearest-value searches, complex rotations).
#include "kernels/rope.h"

#include "kernels/rope_test_util.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace kvtier::kernels {
namespace {

using testing::decode;
using testing::elemBytes;
using testing::encode;
using testing::partner;
using testing::tolerance;

uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float floatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
bool halfIsNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }
bool bf16IsNan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu) != 0; }

// The value of a half bit pattern from the format's definition: (-1)^s 2^(e-15) 1.m for normal
// numbers, (-1)^s 2^-14 0.m for subnormal ones.
double halfValue(uint16_t h) {
  const double sign = (h >> 15) ? -1.0 : 1.0;
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  if (exp == 0x1f) return mant ? std::numeric_limits<double>::quiet_NaN() : sign * HUGE_VAL;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// The half nearest to a finite float, ties to even, by a search over the finite halves.
uint16_t nearestHalf(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;  // at or past the midpoint of 65504 and 2^16
  uint16_t lo = 0, hi = 0x7bff;            // magnitudes increase with the bits
  while (lo < hi) {                        // the largest magnitude <= a
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (halfValue(mid) <= a) {
      lo = mid;
    } else {
      hi = static_cast<uint16_t>(mid - 1);
    }
  }
  uint16_t best = lo;
  if (lo < 0x7bff) {
    const double below = a - halfValue(lo), above = halfValue(lo + 1) - a;
    if (above < below || (above == below && (lo & 1))) best = static_cast<uint16_t>(lo + 1);
  }
  return sign | best;
}

// The value of a bf16 pattern: the float with those 16 high bits.
double bf16Value(uint16_t b) { return floatOf(uint32_t{b} << 16); }

// The bf16 nearest to a finite float, ties to even: its truncation or the next one out.
uint16_t nearestBf16(float f) {
  const uint16_t down = static_cast<uint16_t>(bitsOf(f) >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const double a = std::fabs(static_cast<double>(f));
  const double lo = std::fabs(bf16Value(down));
  // Past the largest finite bf16 the next value out is 2^128 (it rounds to infinity).
  const double hi = (up & 0x7fffu) == 0x7f80u ? std::ldexp(1.0, 128) : std::fabs(bf16Value(up));
  const double below = a - lo, above = hi - a;
  if (above < below || (above == below && (down & 1))) return up;
  return down;
}

// A float with a random sign, exponent in [minExp, maxExp] and mantissa.
float randomFloat(std::mt19937_64& rng, int minExp, int maxExp) {
  std::uniform_int_distribution<int> exp(minExp + 127, maxExp + 127);
  const uint32_t bits = static_cast<uint32_t>(rng() & 0x807fffffu) | uint32_t(exp(rng)) << 23;
  return floatOf(bits);
}

// ---------------------------------------------------------------------------------------------
// fp16

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(halfToFloat(0x0000), 0.0f);
  EXPECT_TRUE(std::signbit(halfToFloat(0x8000)));
  EXPECT_EQ(halfToFloat(0x8000), 0.0f);
  EXPECT_EQ(halfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(halfToFloat(0xc000), -2.0f);
  EXPECT_EQ(halfToFloat(0x3555), 0.25f * (1 + 0x155 / 1024.0f));
  EXPECT_EQ(halfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(halfToFloat(0x0400), std::ldexp(1.0f, -14)) << "smallest normal";
  EXPECT_EQ(halfToFloat(0x03ff), std::ldexp(1023.0f, -24)) << "largest subnormal";
  EXPECT_EQ(halfToFloat(0x0001), std::ldexp(1.0f, -24)) << "smallest subnormal";
  EXPECT_EQ(halfToFloat(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(halfToFloat(0x0200), std::ldexp(1.0f, -15));
  EXPECT_EQ(halfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(halfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(halfToFloat(0x7e00)));
  EXPECT_TRUE(std::isnan(halfToFloat(0xfc01)));

  EXPECT_EQ(floatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(floatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(floatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14)), 0x0400);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(floatToHalf(-std::ldexp(1023.0f, -24)), 0x83ff);
  EXPECT_EQ(floatToHalf(0.0f), 0x0000);
  EXPECT_EQ(floatToHalf(-0.0f), 0x8000);
}

TEST(HalfTest, EveryPatternDecodesToItsDefinitionAndRoundTrips) {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = halfToFloat(h);
    if (halfIsNan(h)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(halfIsNan(floatToHalf(f))) << std::hex << h << " -> " << floatToHalf(f);
      continue;
    }
    ASSERT_EQ(static_cast<double>(f), halfValue(h)) << std::hex << "0x" << h;
    ASSERT_EQ(std::signbit(f), (h & 0x8000) != 0) << std::hex << "0x" << h;
    ASSERT_EQ(floatToHalf(f), h) << std::hex << "0x" << h << " (" << f << ")";
  }
}

TEST(HalfTest, FloatToHalfRoundsToNearestEven) {
  const float ulp1 = std::ldexp(1.0f, -10);  // spacing of halves in [1, 2)
  EXPECT_EQ(floatToHalf(1.0f + ulp1 / 2), 0x3c00) << "tie to even (down)";
  EXPECT_EQ(floatToHalf(1.0f + 3 * ulp1 / 2), 0x3c02) << "tie to even (up)";
  EXPECT_EQ(floatToHalf(1.0f + ulp1 / 2 + ulp1 / 64), 0x3c01);
  EXPECT_EQ(floatToHalf(1.0f + ulp1 / 2 - ulp1 / 64), 0x3c00);
  EXPECT_EQ(floatToHalf(2.0f - ulp1 / 4), 0x4000) << "carries into the exponent";
  // Subnormal results.
  const float tiny = std::ldexp(1.0f, -24);  // the smallest subnormal half
  EXPECT_EQ(floatToHalf(tiny / 2), 0x0000) << "tie to even: zero";
  EXPECT_EQ(floatToHalf(-tiny / 2), 0x8000);
  EXPECT_EQ(floatToHalf(tiny * 0.5001f), 0x0001);
  EXPECT_EQ(floatToHalf(tiny * 1.5f), 0x0002) << "tie to even";
  EXPECT_EQ(floatToHalf(tiny * 2.5f), 0x0002) << "tie to even";
  EXPECT_EQ(floatToHalf(tiny / 4), 0x0000);
  EXPECT_EQ(floatToHalf(1e-10f), 0x0000);
  EXPECT_EQ(floatToHalf(std::ldexp(1.0f, -14) - tiny / 2), 0x0400) << "rounds up to normal";
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::denorm_min()), 0x0000);
  // Overflow and specials.
  EXPECT_EQ(floatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(floatToHalf(65520.0f), 0x7c00) << "the midpoint to 2^16 rounds to even: inf";
  EXPECT_EQ(floatToHalf(1e6f), 0x7c00);
  EXPECT_EQ(floatToHalf(-1e30f), 0xfc00);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::max()), 0x7c00);
  EXPECT_EQ(floatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(floatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(halfIsNan(floatToHalf(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(halfIsNan(floatToHalf(floatOf(0x7f800001u)))) << "a NaN never becomes inf";
  EXPECT_EQ(halfToFloat(floatToHalf(std::numeric_limits<float>::infinity())),
            std::numeric_limits<float>::infinity());

  // Random floats across the whole half range (and past both ends) against the search.
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100000; ++i) {
    const float f = randomFloat(rng, -27, 16);
    ASSERT_EQ(floatToHalf(f), nearestHalf(f)) << f << " (0x" << std::hex << bitsOf(f) << ")";
  }
#ifdef __FLT16_MANT_DIG__
  // And against the compiler's own _Float16 conversion, where it has one.
  for (int i = 0; i < 100000; ++i) {
    const float f = randomFloat(rng, -27, 16);
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t bits;
    std::memcpy(&bits, &h, sizeof bits);
    ASSERT_EQ(floatToHalf(f), bits) << f;
  }
#endif
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(Bf16Test, EveryPatternRoundTrips) {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const uint16_t b = static_cast<uint16_t>(i);
    const float f = bf16ToFloat(b);
    if (bf16IsNan(b)) {
      EXPECT_TRUE(std::isnan(f));
      EXPECT_TRUE(bf16IsNan(floatToBf16(f))) << std::hex << b;
      continue;
    }
    ASSERT_EQ(bitsOf(f), uint32_t{b} << 16);
    ASSERT_EQ(floatToBf16(f), b) << std::hex << "0x" << b;
  }
}

TEST(Bf16Test, FloatToBf16RoundsToNearestEven) {
  EXPECT_EQ(floatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(floatToBf16(floatOf(0x3f808000u)), 0x3f80) << "tie to even (down)";
  EXPECT_EQ(floatToBf16(floatOf(0x3f818000u)), 0x3f82) << "tie to even (up)";
  EXPECT_EQ(floatToBf16(floatOf(0x3f808001u)), 0x3f81);
  EXPECT_EQ(floatToBf16(floatOf(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(floatToBf16(floatOf(0x00008000u)), 0x0000) << "subnormal tie to even";
  EXPECT_EQ(floatToBf16(floatOf(0x00018000u)), 0x0002);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::max()), 0x7f80) << "rounds to inf";
  EXPECT_EQ(floatToBf16(floatOf(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(floatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(floatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(bf16IsNan(floatToBf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(bf16IsNan(floatToBf16(floatOf(0x7f800001u)))) << "a NaN never becomes inf";
  EXPECT_TRUE(bf16IsNan(floatToBf16(floatOf(0xff800001u))));

  std::mt19937_64 rng(2);
  for (int i = 0; i < 200000; ++i) {
    const float f = randomFloat(rng, -126, 127);
    ASSERT_EQ(floatToBf16(f), nearestBf16(f)) << f << " (0x" << std::hex << bitsOf(f) << ")";
  }
}

// ---------------------------------------------------------------------------------------------
// Re-rotation

Layout ropeLayout(DType dtype, RopeStyle style, uint32_t heads, uint32_t headDim,
                  uint32_t rotaryDims, double base = 10000.0) {
  Layout l;
  l.modelId = "rope";
  l.numLayers = 1;
  l.numKvHeads = heads;
  l.headDim = headDim;
  l.dtype = dtype;
  l.blockTokens = 16;
  l.rope = RopeScheme{style, rotaryDims, base};
  return l;
}

std::vector<double> decodeAll(const Layout& l, const std::vector<uint8_t>& k) {
  const uint32_t eb = elemBytes(l.dtype);
  std::vector<double> out(k.size() / eb);
  for (size_t i = 0; i < out.size(); ++i) out[i] = decode(l.dtype, k.data() + i * eb);
  return out;
}

// K of `tokens` tokens with random values; each head has its own magnitude (0.001 .. 300).
std::vector<uint8_t> randomK(const Layout& l, uint64_t tokens, uint64_t seed) {
  static const double kScales[] = {1.0, 0.001, 300.0, 0.05};
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  const uint32_t eb = elemBytes(l.dtype);
  std::vector<uint8_t> k(tokens * l.tokenBytes());
  for (uint64_t t = 0; t < tokens; ++t) {
    for (uint32_t h = 0; h < l.numKvHeads; ++h) {
      const double scale = kScales[(t + h) % 4];
      for (uint32_t d = 0; d < l.headDim; ++d) {
        encode(l.dtype, scale * u(rng), k.data() + ((t * l.numKvHeads + h) * l.headDim + d) * eb);
      }
    }
  }
  return k;
}

// Reference RoPE of every head (testing::referenceRope) by `delta` positions.
std::vector<double> referenceRotate(const Layout& l, std::vector<double> x, double delta) {
  for (size_t h = 0; h < x.size() / l.headDim; ++h) {
    const auto first = x.begin() + static_cast<ptrdiff_t>(h * l.headDim);
    const auto head =
        testing::referenceRope(l.rope, std::vector<double>(first, first + l.headDim), delta);
    std::copy(head.begin(), head.end(), first);
  }
  return x;
}

// Checks rotated K `got` against reference values `want` (dims past rotaryDims: exactly `orig`).
void expectClose(const Layout& l, const std::vector<uint8_t>& got, const std::vector<double>& want,
                 const std::vector<uint8_t>& orig, double tol) {
  const uint32_t eb = elemBytes(l.dtype);
  int failures = 0;
  for (size_t i = 0; i < want.size() && failures < 10; ++i) {
    const uint32_t d = static_cast<uint32_t>(i % l.headDim);
    if (d >= l.rope.rotaryDims) {
      if (std::memcmp(got.data() + i * eb, orig.data() + i * eb, eb) != 0) {
        ADD_FAILURE() << "element " << i << " (dim " << d << ") is not rotary but changed";
        ++failures;
      }
      continue;
    }
    const double norm = std::hypot(want[i], want[i - d + partner(l.rope, d)]);
    const double g = decode(l.dtype, got.data() + i * eb);
    if (!(std::fabs(g - want[i]) <= tol * norm + 1e-30)) {
      ADD_FAILURE() << "element " << i << " (dim " << d << "): " << g << ", reference " << want[i]
                    << " (pair norm " << norm << ", error " << std::fabs(g - want[i]) / norm
                    << " of it)";
      ++failures;
    }
  }
}

struct RopeCase {
  DType dtype;
  RopeStyle style;
  uint32_t headDim;
  uint32_t rotaryDims;
  double base;
};

std::string caseName(const ::testing::TestParamInfo<RopeCase>& info) {
  const RopeCase& c = info.param;
  const char* dt = c.dtype == DType::kFloat16    ? "F16"
                   : c.dtype == DType::kBFloat16 ? "BF16"
                                                 : "F32";
  return std::string(dt) + (c.style == RopeStyle::kNeox ? "Neox" : "Gptj") + "Dim" +
         std::to_string(c.headDim) + "Rot" + std::to_string(c.rotaryDims) + "Base" +
         std::to_string(static_cast<int>(c.base));
}

class RotateTest : public ::testing::TestWithParam<RopeCase> {
 protected:
  Layout layout() const {
    const RopeCase& c = GetParam();
    return ropeLayout(c.dtype, c.style, 3, c.headDim, c.rotaryDims, c.base);
  }
};

TEST_P(RotateTest, MatchesTheReferenceRotation) {
  const Layout l = layout();
  for (int64_t delta : {1, -1, 17, -300, 4096, -70000}) {
    SCOPED_TRACE(::testing::Message() << "delta " << delta);
    const auto orig = randomK(l, 5, static_cast<uint64_t>(delta + 100000));
    auto k = orig;
    rotateK(l, k.data(), 5, delta);
    expectClose(l, k, referenceRotate(l, decodeAll(l, orig), static_cast<double>(delta)), orig,
                tolerance(l.dtype));
  }
}

TEST_P(RotateTest, RotatingByDAndThenByMinusDGivesBackTheOriginal) {
  const Layout l = layout();
  for (int64_t delta : {1, 7, 100, 1000, 65536}) {
    SCOPED_TRACE(::testing::Message() << "delta " << delta);
    const auto orig = randomK(l, 7, static_cast<uint64_t>(delta));
    auto k = orig;
    rotateK(l, k.data(), 7, delta);
    EXPECT_NE(k, orig);
    rotateK(l, k.data(), 7, -delta);
    expectClose(l, k, decodeAll(l, orig), orig, tolerance(l.dtype));
  }
}

TEST_P(RotateTest, RotationsCompose) {
  const Layout l = layout();
  const auto orig = randomK(l, 4, 42);
  auto twice = orig, once = orig;
  rotateK(l, twice.data(), 4, 30);
  rotateK(l, twice.data(), 4, -12);
  rotateK(l, once.data(), 4, 18);
  expectClose(l, twice, decodeAll(l, once), orig, tolerance(l.dtype));
}

TEST_P(RotateTest, DeltaZeroChangesNoBit) {
  const Layout l = layout();
  const auto orig = randomK(l, 6, 7);
  auto k = orig;
  rotateK(l, k.data(), 6, 0);
  EXPECT_EQ(k, orig);
}

TEST_P(RotateTest, EveryHeadOfEveryTokenRotatesOnItsOwn) {
  // A batch of tokens and heads gives, head by head, what rotating that head alone gives.
  const Layout l = layout();
  const Layout one =
      ropeLayout(l.dtype, l.rope.style, 1, l.headDim, l.rope.rotaryDims, l.rope.base);
  const auto orig = randomK(l, 4, 9);
  auto k = orig;
  rotateK(l, k.data(), 4, 11);
  const uint64_t headBytes = one.tokenBytes();
  for (uint64_t h = 0; h < 4 * l.numKvHeads; ++h) {
    std::vector<uint8_t> alone(orig.begin() + h * headBytes, orig.begin() + (h + 1) * headBytes);
    rotateK(one, alone.data(), 1, 11);
    EXPECT_EQ(0, std::memcmp(alone.data(), k.data() + h * headBytes, headBytes)) << "head " << h;
  }
  // Zero tokens: nothing is touched.
  auto none = orig;
  rotateK(l, none.data(), 0, 11);
  EXPECT_EQ(none, orig);
}

TEST_P(RotateTest, TheKeyRotatorIsRotateK) {
  const Layout l = layout();
  CpuKeyRotator rotator;
  EXPECT_TRUE(rotator.supports(l));
  const auto orig = randomK(l, 3, 5);
  auto a = orig, b = orig;
  rotator.rotate(l, a.data(), 3, -9);
  rotateK(l, b.data(), 3, -9);
  EXPECT_EQ(a, b);
}

INSTANTIATE_TEST_SUITE_P(
    Rope, RotateTest,
    ::testing::Values(RopeCase{DType::kFloat32, RopeStyle::kNeox, 8, 8, 10000.0},
                      RopeCase{DType::kFloat32, RopeStyle::kGptj, 8, 8, 10000.0},
                      RopeCase{DType::kFloat16, RopeStyle::kNeox, 8, 8, 10000.0},
                      RopeCase{DType::kFloat16, RopeStyle::kGptj, 8, 8, 10000.0},
                      RopeCase{DType::kBFloat16, RopeStyle::kNeox, 8, 8, 10000.0},
                      RopeCase{DType::kBFloat16, RopeStyle::kGptj, 8, 8, 10000.0},
                      RopeCase{DType::kFloat32, RopeStyle::kNeox, 64, 64, 500000.0},
                      RopeCase{DType::kFloat16, RopeStyle::kGptj, 64, 64, 10000.0},
                      RopeCase{DType::kFloat32, RopeStyle::kNeox, 16, 8, 10000.0},
                      RopeCase{DType::kFloat16, RopeStyle::kGptj, 12, 6, 100.0},
                      RopeCase{DType::kBFloat16, RopeStyle::kNeox, 10, 2, 10000.0}),
    caseName);

TEST(RotatePairingTest, NeoxAndGptjPairDifferentDims) {
  // Unit vectors show which dims form a pair: NeoX (d, d + 4), GPT-J (2d, 2d + 1), head dim 8.
  const Layout neox = ropeLayout(DType::kFloat32, RopeStyle::kNeox, 1, 8, 8);
  const Layout gptj = ropeLayout(DType::kFloat32, RopeStyle::kGptj, 1, 8, 8);
  const double theta1 = std::pow(10000.0, -2.0 / 8);  // pair 1's frequency; pair 0's is 1
  auto rotated = [](const Layout& l, uint32_t dim) {
    std::vector<float> v(8, 0.0f);
    v[dim] = 1.0f;
    rotateK(l, reinterpret_cast<uint8_t*>(v.data()), 1, 1);
    return v;
  };
  auto expectVector = [](const std::vector<float>& got, std::vector<double> want) {
    for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "dim " << i;
  };
  const double c0 = std::cos(1.0), s0 = std::sin(1.0), c1 = std::cos(theta1), s1 = std::sin(theta1);
  expectVector(rotated(neox, 0), {c0, 0, 0, 0, s0, 0, 0, 0});
  expectVector(rotated(gptj, 0), {c0, s0, 0, 0, 0, 0, 0, 0});
  expectVector(rotated(neox, 1), {0, c1, 0, 0, 0, s1, 0, 0});
  expectVector(rotated(gptj, 1), {-s0, c0, 0, 0, 0, 0, 0, 0});
  expectVector(rotated(neox, 4), {-s0, 0, 0, 0, c0, 0, 0, 0});
  expectVector(rotated(gptj, 2), {0, 0, c1, s1, 0, 0, 0, 0});

  // The same K rotated under the two styles differs.
  const Layout neoxF16 = ropeLayout(DType::kFloat16, RopeStyle::kNeox, 2, 8, 8);
  const Layout gptjF16 = ropeLayout(DType::kFloat16, RopeStyle::kGptj, 2, 8, 8);
  const auto orig = randomK(neoxF16, 2, 3);
  auto a = orig, b = orig;
  rotateK(neoxF16, a.data(), 2, 5);
  rotateK(gptjF16, b.data(), 2, 5);
  EXPECT_NE(a, b);
}

TEST(RotateSupportTest, DtypesAndSchemes) {
  EXPECT_TRUE(ropeSupports(DType::kFloat16));
  EXPECT_TRUE(ropeSupports(DType::kBFloat16));
  EXPECT_TRUE(ropeSupports(DType::kFloat32));
  EXPECT_FALSE(ropeSupports(DType::kFloat8E4M3));
  EXPECT_FALSE(ropeSupports(DType::kFloat8E5M2));
  EXPECT_FALSE(ropeSupports(DType::kInt8));
  CpuKeyRotator rotator;
  EXPECT_TRUE(rotator.supports(ropeLayout(DType::kBFloat16, RopeStyle::kGptj, 1, 8, 8)));
  EXPECT_FALSE(rotator.supports(ropeLayout(DType::kFloat16, RopeStyle::kNone, 1, 8, 0)));
  EXPECT_FALSE(rotator.supports(ropeLayout(DType::kInt8, RopeStyle::kNeox, 1, 8, 8)));
  EXPECT_FALSE(rotator.supports(ropeLayout(DType::kFloat8E4M3, RopeStyle::kNeox, 1, 8, 8)));
}

}  // namespace
}  // namespace kvtier::kernels
