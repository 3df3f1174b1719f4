// The sequence-state codec against the engine itself: states llama.cpp writes parse, states we
// build load, and anything else is refused.
#include "integrations/llama/seq_state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "integrations/llama/generated_model.h"
#include "integrations/llama/llama_support.h"

namespace kvtier::llama {
namespace {

namespace sup = support;

class SeqStateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tiny_ = new sup::GeneratedModel("tiny", 1);
    model_ = tiny_->get();
  }
  static void TearDownTestSuite() { delete tiny_; }

  static std::vector<uint8_t> stateOf(llama_context* ctx, llama_seq_id seq) {
    std::vector<uint8_t> out(llama_state_seq_get_size(ctx, seq));
    out.resize(llama_state_seq_get_data(ctx, out.data(), out.size(), seq));
    return out;
  }

  // A context holding `n` tokens in `seq`.
  static sup::ContextPtr evaluated(const sup::ContextSettings& s, llama_seq_id seq, size_t n) {
    sup::ContextPtr ctx = sup::makeContext(model_, sup::contextParams(s));
    auto tokens = sup::randomTokens(model_, 7, n);
    EXPECT_TRUE(sup::decode(ctx.get(), seq, tokens, 0, n));
    return ctx;
  }

  static sup::GeneratedModel* tiny_;
  static llama_model* model_;
};

sup::GeneratedModel* SeqStateTest::tiny_ = nullptr;
llama_model* SeqStateTest::model_ = nullptr;

// The tiny model: 2 layers, 1 KV head of 32 dims.
constexpr uint64_t kTinyRowF16 = 2 * 16 * 2;

TEST_F(SeqStateTest, ParsesWhatTheEngineWrites) {
  for (bool fa : {true, false}) {
    SCOPED_TRACE(fa ? "flash attention" : "no flash attention");
    sup::ContextSettings s;
    s.flashAttn = fa;
    auto ctx = evaluated(s, 0, 40);
    auto state = stateOf(ctx.get(), 0);
    auto view = parseSeqState(state, 1);
    ASSERT_TRUE(view.ok()) << view.error();
    EXPECT_EQ(view->cellCount, 40u);
    for (uint32_t i = 0; i < 40; ++i) EXPECT_EQ(view->positions[i], static_cast<int32_t>(i));
    EXPECT_EQ(view->shape.nLayer, 2u);
    EXPECT_EQ(view->shape.kType, GGML_TYPE_F16);
    EXPECT_EQ(view->shape.kRowBytes, kTinyRowF16);
    EXPECT_EQ(view->shape.vRowBytes, kTinyRowF16);
    EXPECT_EQ(view->shape.vTrans, !fa);
    if (!fa) {
      EXPECT_EQ(view->shape.vElemBytes, 2u);
      EXPECT_EQ(view->shape.nEmbdV, 32u);
    }
    EXPECT_EQ(seqStateBytes(view->shape, 40, 1), state.size());
    // Another stream count than the context's is refused.
    EXPECT_FALSE(parseSeqState(state, 2).ok());
  }
}

TEST_F(SeqStateTest, ABuiltStateLoadsAndTheEngineWritesItBackTheSame) {
  for (bool fa : {true, false}) {
    SCOPED_TRACE(fa ? "flash attention" : "no flash attention");
    sup::ContextSettings s;
    s.flashAttn = fa;
    auto src = evaluated(s, 0, 40);
    auto original = stateOf(src.get(), 0);
    auto view = parseSeqState(original, 1).value();

    // The first 32 cells, rebuilt from the parsed rows as a restore builds them from blocks.
    const uint32_t cells = 32;
    std::vector<uint8_t> built(seqStateBytes(view.shape, cells, 1));
    SeqStateSlots slots = buildSeqState(built, view.shape, cells, 1, 0);
    for (uint32_t l = 0; l < view.shape.nLayer; ++l) {
      std::memcpy(slots.k[l], view.k[l], cells * view.shape.kRowBytes);
      if (view.shape.vTrans) {
        const uint32_t el = view.shape.vElemBytes;
        for (uint32_t j = 0; j < view.shape.nEmbdV; ++j) {
          std::memcpy(slots.v[l] + j * cells * el, view.v[l] + j * view.cellCount * el, cells * el);
        }
      } else {
        std::memcpy(slots.v[l], view.v[l], cells * view.shape.vRowBytes);
      }
    }
    auto dst = sup::makeContext(model_, sup::contextParams(s));
    ASSERT_EQ(llama_state_seq_set_data(dst.get(), built.data(), built.size(), 0), built.size());
    EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(dst.get()), 0), 31);
    EXPECT_EQ(stateOf(dst.get(), 0), built);
  }
}

TEST_F(SeqStateTest, TwoStreamsAndAnotherSequence) {
  sup::ContextSettings s;
  s.nSeq = 2;  // not unified: one stream per sequence
  auto ctx = evaluated(s, 1, 20);
  auto state = stateOf(ctx.get(), 1);
  auto view = parseSeqState(state, 2);
  ASSERT_TRUE(view.ok()) << view.error();
  EXPECT_EQ(view->cellCount, 20u);
  // The same cells, built for sequence 1 of a fresh two-stream context, load there.
  std::vector<uint8_t> built(seqStateBytes(view->shape, 16, 2));
  SeqStateSlots slots = buildSeqState(built, view->shape, 16, 2, 1);
  for (uint32_t l = 0; l < view->shape.nLayer; ++l) {
    std::memcpy(slots.k[l], view->k[l], 16 * view->shape.kRowBytes);
    std::memcpy(slots.v[l], view->v[l], 16 * view->shape.vRowBytes);
  }
  auto dst = sup::makeContext(model_, sup::contextParams(s));
  ASSERT_EQ(llama_state_seq_set_data(dst.get(), built.data(), built.size(), 1), built.size());
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(dst.get()), 1), 15);
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(dst.get()), 0), -1);
}

TEST_F(SeqStateTest, EveryTruncationAndExtensionIsRefused) {
  auto ctx = evaluated({}, 0, 17);
  auto state = stateOf(ctx.get(), 0);
  ASSERT_TRUE(parseSeqState(state, 1).ok());
  for (size_t n = 0; n < state.size(); ++n) {
    EXPECT_FALSE(parseSeqState(std::span(state.data(), n), 1).ok()) << n;
  }
  auto longer = state;
  longer.push_back(0);
  EXPECT_FALSE(parseSeqState(longer, 1).ok());
  auto wrongMagic = state;
  wrongMagic[0] ^= 1;
  EXPECT_FALSE(parseSeqState(wrongMagic, 1).ok());
  // A cell naming another sequence than the state's (offset: magic, seq, n_stream, cell_count,
  // then the first cell's pos and n_seq_id).
  auto otherSeq = state;
  otherSeq[4 * 6] ^= 1;
  EXPECT_FALSE(parseSeqState(otherSeq, 1).ok());
  // A cell count the bytes cannot hold (offset 12) is refused before anything is sized by it.
  auto huge = state;
  const uint32_t cells = UINT32_MAX;
  std::memcpy(huge.data() + 12, &cells, sizeof cells);
  EXPECT_EQ(parseSeqState(huge, 1).code(), ErrorCode::kInvalidArgument);
}

TEST_F(SeqStateTest, AnEmptySequenceHasNoCells) {
  auto ctx = sup::makeContext(model_, sup::contextParams({}));
  auto state = stateOf(ctx.get(), 0);
  auto view = parseSeqState(state, 1);
  ASSERT_TRUE(view.ok()) << view.error();
  EXPECT_EQ(view->cellCount, 0u);
}

}  // namespace
}  // namespace kvtier::llama
