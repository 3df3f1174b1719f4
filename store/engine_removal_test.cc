// Engine unit tests of middle removal with K re-rotation, for every RoPE style and type
// (engine_shapes_test_fixture.h). Real BlockPool + HeapBlockMemory + Engine, in-process.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "kernels/rope.h"
#include "kernels/rope_test_util.h"
#include "store/engine.h"
#include "store/engine_shapes_test_fixture.h"

namespace kvtier {

namespace {

using namespace shapes_test;  // ShapesTest, Harness, slice, blob and test_util
using kernels::testing::decode;
using kernels::testing::elemBytes;
using kernels::testing::encode;
using kernels::testing::partner;
using kernels::testing::referenceRope;
using kernels::testing::tolerance;

// =============================================================================================
// Middle removal with K re-rotation

// The layouts of the removal tests: 2 layers, 2 KV heads, head dim 8, RoPE.
struct RopeCase {
  DType dtype;
  RopeStyle style;
  uint32_t rotaryDims;
};

std::string caseName(const ::testing::TestParamInfo<RopeCase>& info) {
  const RopeCase& c = info.param;
  const char* dt = c.dtype == DType::kFloat16    ? "F16"
                   : c.dtype == DType::kBFloat16 ? "BF16"
                                                 : "F32";
  return std::string(dt) + (c.style == RopeStyle::kNeox ? "Neox" : "Gptj") + "Rot" +
         std::to_string(c.rotaryDims);
}

uint64_t mix(uint64_t x) {  // splitmix64
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A token's unrotated K element: uniform in [-m, m], m in 1..4 by token.
double unrotatedK(uint32_t token, uint32_t layer, uint32_t head, uint32_t dim) {
  const uint64_t h = mix(uint64_t{token} << 32 | layer << 16 | head << 8 | dim);
  const double u = static_cast<double>(h >> 11) / static_cast<double>(1ull << 53);
  return (2 * u - 1) * (1 + token % 4);
}

// A token's V byte: any bits, moved unchanged.
uint8_t vByte(uint32_t token, uint32_t layer, uint64_t index) {
  return static_cast<uint8_t>(mix(uint64_t{token} << 24 | layer << 20 | index) >> 17);
}

// Whether dim `dim` takes part in the rotation.
bool rotates(const RopeScheme& r, uint32_t dim) { return dim < r.rotaryDims; }

class RemovalTest : public ::testing::TestWithParam<RopeCase>, protected Harness {
 protected:
  void SetUp() override {
    layout_ = ropeLayout(GetParam());
    rotator_ = &cpuRotator_;
    makeEngine(16);
  }

  static Layout ropeLayout(const RopeCase& c) {
    Layout l;
    l.modelId = "rope-model";
    l.numLayers = 2;
    l.numKvHeads = 2;
    l.headDim = 8;
    l.dtype = c.dtype;
    l.blockTokens = kBt;
    l.rope = RopeScheme{c.style, c.rotaryDims, 10000.0};
    return l;
  }

  // K of `token` as stored at position pos: the reference rotation, in the layout's dtype.
  std::vector<uint8_t> kAt(uint32_t token, uint32_t layer, uint64_t pos) const {
    const uint32_t eb = elemBytes(layout_.dtype);
    std::vector<uint8_t> out(layout_.tokenBytes());
    for (uint32_t h = 0; h < layout_.numKvHeads; ++h) {
      std::vector<double> x(layout_.headDim);
      for (uint32_t d = 0; d < layout_.headDim; ++d) x[d] = unrotatedK(token, layer, h, d);
      const auto y = referenceRope(layout_.rope, x, static_cast<double>(pos));
      for (uint32_t d = 0; d < layout_.headDim; ++d) {
        encode(layout_.dtype, y[d], out.data() + (h * layout_.headDim + d) * eb);
      }
    }
    return out;
  }
  std::vector<uint8_t> vOf(uint32_t token, uint32_t layer) const {
    std::vector<uint8_t> out(layout_.tokenBytes());
    for (uint64_t i = 0; i < out.size(); ++i) out[i] = vByte(token, layer, i);
    return out;
  }

  // put + K rotated at each position and V of each token + commit.
  ::testing::AssertionResult writeKv(std::string_view seq, uint64_t begin,
                                     const std::vector<uint32_t>& tokens,
                                     const SeqOptions& options = {}) {
    auto g = engine_->put(kOwner, space_, seq, begin, tokens, {}, options);
    if (!g.ok()) return ::testing::AssertionFailure() << "put: " << g.error();
    for (size_t i = 0; i < tokens.size(); ++i) {
      const uint64_t pos = begin + i;
      uint8_t* block = at(g->blocks[(pos - g->firstPosition) / kBt]);
      for (uint32_t layer = 0; layer < layout_.numLayers; ++layer) {
        const auto k = kAt(tokens[i], layer, pos);
        const auto v = vOf(tokens[i], layer);
        std::memcpy(block + layout_.slotOffset(layer, 0, pos % kBt), k.data(), k.size());
        std::memcpy(block + layout_.slotOffset(layer, 1, pos % kBt), v.data(), v.size());
      }
    }
    auto c = engine_->commit(g->lease, kEnd);
    if (!c.ok()) return ::testing::AssertionFailure() << "commit: " << c.error();
    return ::testing::AssertionSuccess();
  }

  // Checks every position q of seq against `tokens`: V exactly the token's; K exactly as written
  // at q for q < exactBelow, and for q >= exactBelow within tolerance of the reference rotation of
  // the token's K to q (each rotated pair's error scaled by its norm; dims past rotaryDims exact).
  void checkKv(std::string_view seq, const std::vector<uint32_t>& tokens, uint64_t exactBelow) {
    SCOPED_TRACE(::testing::Message() << "sequence '" << seq << "'");
    ASSERT_EQ(len(seq), tokens.size());
    auto g = engine_->get(space_, seq, 0, kEnd);
    ASSERT_TRUE(g.ok()) << g.error();
    const uint32_t eb = elemBytes(layout_.dtype);
    const double tol = tolerance(layout_.dtype);
    int failures = 0;
    for (uint64_t q = 0; q < tokens.size() && failures < 10; ++q) {
      const uint8_t* block = at(g->blocks[q / kBt]);
      for (uint32_t layer = 0; layer < layout_.numLayers; ++layer) {
        const uint8_t* k = block + layout_.slotOffset(layer, 0, q % kBt);
        const uint8_t* v = block + layout_.slotOffset(layer, 1, q % kBt);
        const auto wantV = vOf(tokens[q], layer);
        if (std::memcmp(v, wantV.data(), wantV.size()) != 0) {
          ADD_FAILURE() << "V of position " << q << " (token " << tokens[q] << "), layer " << layer
                        << " differs";
          ++failures;
        }
        const auto written = kAt(tokens[q], layer, q);
        if (q < exactBelow) {
          if (std::memcmp(k, written.data(), written.size()) != 0) {
            ADD_FAILURE() << "K of untouched position " << q << ", layer " << layer << " changed";
            ++failures;
          }
          continue;
        }
        for (uint32_t h = 0; h < layout_.numKvHeads; ++h) {
          std::vector<double> x(layout_.headDim);
          for (uint32_t d = 0; d < layout_.headDim; ++d) x[d] = unrotatedK(tokens[q], layer, h, d);
          const auto want = referenceRope(layout_.rope, x, static_cast<double>(q));
          for (uint32_t d = 0; d < layout_.headDim; ++d) {
            const uint64_t off = (h * layout_.headDim + d) * eb;
            if (!rotates(layout_.rope, d)) {
              if (std::memcmp(k + off, written.data() + off, eb) != 0) {
                ADD_FAILURE() << "K dim " << d << " (not rotary) of position " << q << " changed";
                ++failures;
              }
              continue;
            }
            const double got = decode(layout_.dtype, k + off);
            const double norm = std::hypot(want[d], want[partner(layout_.rope, d)]);
            if (!(std::fabs(got - want[d]) <= tol * norm + 1e-30)) {
              ADD_FAILURE() << "K of position " << q << " (token " << tokens[q] << "), layer "
                            << layer << ", head " << h << ", dim " << d << ": " << got
                            << ", reference " << want[d] << " (pair norm " << norm << ")";
              ++failures;
            }
          }
        }
      }
    }
    EXPECT_TRUE(engine_->releaseRead(g->lease).ok());
  }

  kernels::CpuKeyRotator cpuRotator_;
};

TEST_P(RemovalTest, MiddleRemovalMovesVAndReRotatesKToTheNewPositions) {
  const auto t = toks(70, 1000);
  ASSERT_TRUE(writeKv("s", 0, t));
  checkKv("s", t, 70);
  // Others share s's blocks: a copy of the whole, a snapshot of the whole and one of the range.
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "s", "c", 70, SeqOptions{}).ok());
  const auto whole = snap("s", 0);
  const auto inside = snap("s", 24);

  ASSERT_TRUE(engine_->remove(space_, "s", 20, 37).ok());
  const auto shortened = cat(head(t, 20), slice(t, 37, 70));
  checkKv("s", shortened, 20);

  // The sharers are untouched, byte for byte.
  checkKv("c", t, 70);
  ASSERT_TRUE(restore("r", whole.id, 70).ok());
  checkKv("r", t, 70);
  ASSERT_TRUE(writeKv("r2", 0, head(t, 24)));
  ASSERT_TRUE(restore("r2", inside.id, 70).ok());
  checkKv("r2", t, 70);

  // The moved KV is not a prefill of the shortened tokens: a lookup stops before begin's block,
  // now and after more tokens are appended.
  EXPECT_EQ(matched(shortened), 16u);
  EXPECT_EQ(matched(t), 64u) << "the original blocks are still indexed";
  const auto more = toks(30, 5000);
  ASSERT_TRUE(writeKv("s", 53, more));
  EXPECT_EQ(matched(cat(shortened, more)), 16u);
  checkKv("s", cat(shortened, more), 20);

  // A second removal re-rotates tokens that moved before.
  ASSERT_TRUE(engine_->remove(space_, "s", 40, 45).ok());
  const auto twice = cat(head(cat(shortened, more), 40), slice(cat(shortened, more), 45, 83));
  checkKv("s", twice, 20);
  EXPECT_EQ(matched(twice), 16u);
}

TEST_P(RemovalTest, RemovalFromTheStartAndOfWholeBlocks) {
  const auto t = toks(50, 2000);
  ASSERT_TRUE(writeKv("a", 0, t));
  ASSERT_TRUE(engine_->remove(space_, "a", 0, 5).ok());
  checkKv("a", slice(t, 5, 50), 0);
  EXPECT_EQ(held(), 3u) << "a holds its three new blocks; the old ones are cached or freed";
  EXPECT_EQ(used(), 6u) << "a's three old sealed blocks stay cached, its old partial one is freed";
  EXPECT_EQ(matched(slice(t, 5, 50)), 0u);

  ASSERT_TRUE(writeKv("b", 0, t));
  ASSERT_TRUE(engine_->remove(space_, "b", 16, 32).ok());
  const auto shortened = cat(head(t, 16), slice(t, 32, 50));
  checkKv("b", shortened, 16);
  EXPECT_EQ(matched(shortened), 16u);

  // One token removed just before the end; and a range whose end is the end is a plain cut.
  ASSERT_TRUE(writeKv("c", 0, t));
  ASSERT_TRUE(engine_->remove(space_, "c", 48, 49).ok());
  checkKv("c", cat(head(t, 48), slice(t, 49, 50)), 48);
  ASSERT_TRUE(engine_->remove(space_, "c", 30, 49).ok());
  checkKv("c", head(t, 30), 30);
}

TEST_P(RemovalTest, LaterWritesToTheSequenceAndItsCopiesAreNeverIndexed) {
  const auto t = toks(64, 3000);
  ASSERT_TRUE(writeKv("s", 0, t));
  ASSERT_TRUE(engine_->remove(space_, "s", 20, 26).ok());
  const auto shortened = cat(head(t, 20), slice(t, 26, 64));
  // A replacement from inside begin's block, whose slots 20..24 hold moved tokens: the blocks it
  // completes hold moved KV, so they must not be indexed either.
  const auto fresh = toks(40, 7000);
  ASSERT_TRUE(writeKv("s", 25, fresh));
  const auto now = cat(head(shortened, 25), fresh);
  checkKv("s", now, 20);
  EXPECT_EQ(matched(now), 16u);

  // Nor are copies, snapshots or restores of it, however they continue.
  const auto more = toks(20, 8000);
  ASSERT_TRUE(engine_->copyPrefix(kOwner, space_, "s", "c", 65, SeqOptions{}).ok());
  ASSERT_TRUE(writeKv("c", 65, more));
  EXPECT_EQ(matched(cat(now, more)), 16u);
  const auto sn = snap("s", 0);
  ASSERT_TRUE(restore("r", sn.id, 65).ok());
  ASSERT_TRUE(writeKv("r", 65, more));
  EXPECT_EQ(matched(cat(now, more)), 16u);
  checkKv("r", cat(now, more), 20);
}

TEST_P(RemovalTest, FullPoolAnswersFullAndChangesNothing) {
  makeEngine(5);
  const auto t = toks(70, 1000);  // five blocks: the whole pool
  ASSERT_TRUE(writeKv("s", 0, t));
  EXPECT_EQ(engine_->remove(space_, "s", 20, 37).code(), ErrorCode::kFull);
  checkKv("s", t, 70);
  EXPECT_EQ(used(), 5u);
  EXPECT_EQ(matched(t), 64u);
}

TEST_P(RemovalTest, WithoutARotatorItIsNotSupportedAndChangesNothing) {
  rotator_ = nullptr;
  makeEngine(16);
  const auto t = toks(40, 1000);
  ASSERT_TRUE(writeKv("s", 0, t));
  const uint64_t before = used();
  EXPECT_EQ(engine_->remove(space_, "s", 10, 20).code(), ErrorCode::kNotSupported);
  checkKv("s", t, 40);
  EXPECT_EQ(used(), before);
  EXPECT_EQ(matched(t), 32u);
}

TEST_P(RemovalTest, BeforeTheWindowIsInvalid) {
  const auto t = toks(40, 1000);
  ASSERT_TRUE(writeKv("w", 0, t, SeqOptions{.window = 16}));
  EXPECT_EQ(engine_->remove(space_, "w", 10, 30).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(len("w"), 40u);
}

INSTANTIATE_TEST_SUITE_P(Rope, RemovalTest,
                         ::testing::Values(RopeCase{DType::kFloat16, RopeStyle::kNeox, 8},
                                           RopeCase{DType::kFloat16, RopeStyle::kGptj, 8},
                                           RopeCase{DType::kBFloat16, RopeStyle::kNeox, 8},
                                           RopeCase{DType::kBFloat16, RopeStyle::kGptj, 8},
                                           RopeCase{DType::kFloat32, RopeStyle::kNeox, 8},
                                           RopeCase{DType::kFloat32, RopeStyle::kGptj, 8},
                                           RopeCase{DType::kFloat16, RopeStyle::kNeox, 4},
                                           RopeCase{DType::kFloat32, RopeStyle::kGptj, 6}),
                         caseName);

// A rotator but no declared scheme: a middle removal is NOT_SUPPORTED and changes nothing.
TEST(RemovalWithoutSchemeTest, IsNotSupportedAndChangesNothing) {
  struct Fixture : Harness {
    void run() {
      rotator_ = &rotator;
      makeEngine(16);
      const auto t = toks(40, 1000);
      ASSERT_TRUE(write("s", 0, t));
      const uint64_t before = used();
      EXPECT_EQ(engine_->remove(space_, "s", 10, 20).code(), ErrorCode::kNotSupported);
      EXPECT_EQ(engine_->remove(space_, "s", 0, 39).code(), ErrorCode::kNotSupported);
      EXPECT_EQ(read("s"), tagsOf(t));
      EXPECT_EQ(used(), before);
      EXPECT_EQ(matched(t), 32u);
    }
    kernels::CpuKeyRotator rotator;
  } f;
  f.run();
}

}  // namespace
}  // namespace kvtier
