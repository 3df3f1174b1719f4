// Names a client sends are opaque keys of the engine's maps, bounded, and never ill-formed Text
// (docs/security.md "Names and paths").
#include <gtest/gtest.h>

#include <string>

#include "store/engine.h"
#include "store/engine_test_util.h"

namespace kvtier {
namespace {

using namespace test_util;

class EngineNames : protected EngineHarness, public ::testing::Test {};

TEST_F(EngineNames, PathLikeNamesAreOpaqueKeys) {
  makeEngine(16);
  const auto tokens = toks(20, 1);
  for (const std::string name : {"../../x", "/etc/passwd", "..", "a/../b", "\n", "%s"}) {
    ASSERT_TRUE(putAndCommit(space_, name, 0, tokens, {}, kOwner)) << name;
    EXPECT_EQ(len(name), tokens.size()) << name;
  }
  EXPECT_EQ(len("x"), std::nullopt);
  EXPECT_EQ(len("b"), std::nullopt);
}

TEST_F(EngineNames, NulBytesAndOverlongNamesAreInvalidAndChangeNothing) {
  makeEngine(16);
  const auto tokens = toks(20, 1);
  const std::string nul("a\0b", 3), empty, huge(kMaxSeqNameBytes + 1, 'n');
  for (const std::string& name : {nul, empty, huge}) {
    auto g = engine_->put(kOwner, space_, name, 0, tokens, {}, {});
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(engine_->length(space_, name).code(), ErrorCode::kInvalidArgument);
    // Only looked up, never stored: no such sequence.
    EXPECT_FALSE(engine_->snapshot(space_, name, 0).ok());
  }
  EXPECT_EQ(len("a"), std::nullopt);
  EXPECT_EQ(used(), 0u);
  EXPECT_EQ(engine_->stats().writeLeases, 0u);
}

}  // namespace
}  // namespace kvtier
