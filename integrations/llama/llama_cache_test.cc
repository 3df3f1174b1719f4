// PrefixCache's checks, in process with the real engine and no daemon: bad calls are typed errors
// that change nothing, and a cache without a daemon misses.
#include "kvtier/llama.h"

#include <gtest/gtest.h>

#include <sys/mman.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "integrations/llama/generated_model.h"
#include "integrations/llama/llama_support.h"
#include "tests/test_support.h"

namespace kvtier::llama {
namespace {

namespace sup = support;

class PrefixCacheChecks : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tiny_ = new sup::GeneratedModel("tiny", 1);
    model_ = tiny_->get();
  }
  static void TearDownTestSuite() { delete tiny_; }

  // A context of two sequences in a unified KV cache, and the options of a cache on it whose
  // daemon is not there.
  void SetUp() override {
    sup::ContextSettings s;
    s.nSeq = 2;
    params_ = sup::contextParams(s);
    params_.kv_unified = true;
    ctx_ = sup::makeContext(model_, params_);
    ASSERT_NE(ctx_, nullptr);
    options_.socketPath = tiny_->dir().file("no-daemon.sock");
    options_.modelPath = tiny_->path();
    options_.contextParams = params_;
  }

  // Opens a cache on a daemon of its own and stores `tokens` (evaluated in sequence 0); then the
  // daemon is killed and its pool removed. Returns its data directory, where a new daemon takes
  // the same socket.
  std::string storeThenKillTheDaemon(std::unique_ptr<PrefixCache>& cache,
                                     const std::vector<llama_token>& tokens) {
    EXPECT_TRUE(sup::decode(ctx_.get(), 0, tokens, 0, tokens.size()));
    auto first = std::make_unique<test::DaemonProcess>(64 << 20);
    const std::string dataDir = first->dataDir(), prefix = first->segmentPrefix();
    options_.socketPath = first->socket();
    auto opened = PrefixCache::open(ctx_.get(), options_);
    EXPECT_TRUE(opened.ok()) << opened.error();
    if (!opened.ok()) return dataDir;
    cache = std::move(opened).value();
    EXPECT_TRUE(cache->store(0, tokens.data(), tokens.size()).ok());
    first->stop(SIGKILL);
    for (const auto& name : test::shmSegments(prefix)) ::shm_unlink(("/" + name).c_str());
    return dataDir;
  }

  static sup::GeneratedModel* tiny_;
  static llama_model* model_;
  llama_context_params params_{};
  sup::ContextPtr ctx_;
  CacheOptions options_;
};

sup::GeneratedModel* PrefixCacheChecks::tiny_ = nullptr;
llama_model* PrefixCacheChecks::model_ = nullptr;

TEST_F(PrefixCacheChecks, BadOptionsAreRefused) {
  EXPECT_EQ(PrefixCache::open(nullptr, options_).code(), ErrorCode::kInvalidArgument);
  CacheOptions o = options_;
  o.blockTokens = 8;
  EXPECT_EQ(PrefixCache::open(ctx_.get(), o).code(), ErrorCode::kInvalidArgument);
  o = options_;
  o.modelPath.clear();
  EXPECT_EQ(PrefixCache::open(ctx_.get(), o).code(), ErrorCode::kInvalidArgument);
  o = options_;
  o.modelPath = tiny_->dir().file("missing.gguf");
  EXPECT_EQ(PrefixCache::open(ctx_.get(), o).code(), ErrorCode::kInvalidArgument);
  o = options_;
  o.scratchSeq = 2;  // not below n_seq_max
  EXPECT_EQ(PrefixCache::open(ctx_.get(), o).code(), ErrorCode::kInvalidArgument);
  o = options_;
  o.scratchSeq = 1;
  o.contextParams.kv_unified = false;  // a scratch sequence needs a unified KV cache
  EXPECT_EQ(PrefixCache::open(ctx_.get(), o).code(), ErrorCode::kInvalidArgument);
}

TEST_F(PrefixCacheChecks, WithoutADaemonRestoresMissAndStoresSayUnavailable) {
  auto cache = PrefixCache::open(ctx_.get(), options_);
  ASSERT_TRUE(cache.ok()) << cache.error();
  auto tokens = sup::randomTokens(model_, 3, 80);
  auto r = (*cache)->restore(0, tokens.data(), tokens.size());
  ASSERT_TRUE(r.ok()) << r.error();
  EXPECT_EQ(r->tokens, 0u);
  EXPECT_TRUE(r->unavailable);
  EXPECT_EQ(llama_memory_seq_pos_max(llama_get_memory(ctx_.get()), 0), -1);
  ASSERT_TRUE(sup::decode(ctx_.get(), 0, tokens, 0, tokens.size()));
  EXPECT_EQ((*cache)->store(0, tokens.data(), tokens.size()).code(), ErrorCode::kUnavailable);
  EXPECT_EQ((*cache)->stats().restoreMisses, 1u);
  EXPECT_EQ((*cache)->stats().storeFailures, 1u);
  // The layout names the model and the settings.
  EXPECT_EQ((*cache)->layout().modelId.rfind("llama.cpp/llama/f16-f16/", 0), 0u)
      << (*cache)->layout().modelId;
}

TEST_F(PrefixCacheChecks, BadCallsAreTypedErrorsAndChangeNothing) {
  CacheOptions o = options_;
  o.scratchSeq = 1;
  auto cache = PrefixCache::open(ctx_.get(), o);
  ASSERT_TRUE(cache.ok()) << cache.error();
  PrefixCache& c = **cache;
  auto tokens = sup::randomTokens(model_, 3, 80);
  llama_memory_t mem = llama_get_memory(ctx_.get());
  // Sequences out of range, or the cache's own scratch sequence.
  for (llama_seq_id seq : {-1, 1, 2}) {
    EXPECT_EQ(c.restore(seq, tokens.data(), tokens.size()).code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(c.store(seq, tokens.data(), tokens.size()).code(), ErrorCode::kInvalidArgument);
  }
  EXPECT_EQ(c.restore(0, nullptr, 5).code(), ErrorCode::kInvalidArgument);
  // A store of positions the sequence does not hold.
  ASSERT_TRUE(sup::decode(ctx_.get(), 0, tokens, 0, 40));
  EXPECT_EQ(c.store(0, tokens.data(), tokens.size()).code(), ErrorCode::kInvalidArgument);
  // A restore into a sequence that holds tokens.
  EXPECT_EQ(c.restore(0, tokens.data(), tokens.size()).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(llama_memory_seq_pos_max(mem, 0), 39);
  // A call from another thread than the one that opened the cache.
  ErrorCode fromOther = ErrorCode::kOk;
  std::thread([&] { fromOther = c.store(0, tokens.data(), 40).code(); }).join();
  EXPECT_EQ(fromOther, ErrorCode::kInvalidArgument);
  // The engine wrote into the scratch sequence: every call refuses until it is empty again.
  llama_memory_seq_rm(mem, 0, -1, -1);
  ASSERT_TRUE(sup::decode(ctx_.get(), 1, tokens, 0, 8));
  EXPECT_EQ(c.restore(0, tokens.data(), tokens.size()).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(llama_memory_seq_pos_max(mem, 1), 7);
  llama_memory_seq_rm(mem, 1, -1, -1);
  EXPECT_TRUE(c.restore(0, tokens.data(), tokens.size()).ok());
}

TEST_F(PrefixCacheChecks, TheCacheReconnectsToADaemonThatCameBack) {
  auto tokens = sup::randomTokens(model_, 5, 70);
  std::unique_ptr<PrefixCache> cache;
  const std::string dataDir = storeThenKillTheDaemon(cache, tokens);
  ASSERT_NE(cache, nullptr);
  PrefixCache& c = *cache;
  llama_memory_seq_rm(llama_get_memory(ctx_.get()), 0, -1, -1);
  auto gone = c.restore(0, tokens.data(), tokens.size());
  ASSERT_TRUE(gone.ok());
  EXPECT_TRUE(gone->unavailable);
  // A new daemon on the same socket: within the reconnect interval the cache finds it again (its
  // pool is new: a miss, then a store and a hit).
  test::DaemonProcess second(64 << 20, dataDir);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  Result<RestoreInfo> back = RestoreInfo{};
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a poll, not a wait
    back = c.restore(0, tokens.data(), tokens.size());
    ASSERT_TRUE(back.ok());
  } while (back->unavailable && std::chrono::steady_clock::now() < deadline);
  EXPECT_FALSE(back->unavailable);
  EXPECT_EQ(back->tokens, 0u);
  EXPECT_EQ(c.stats().reconnects, 1u);
  ASSERT_TRUE(sup::decode(ctx_.get(), 0, tokens, 0, tokens.size()));
  auto stored = c.store(0, tokens.data(), tokens.size());
  ASSERT_TRUE(stored.ok()) << stored.error();
  EXPECT_EQ(stored->storedTokens, 64u);
  llama_memory_seq_rm(llama_get_memory(ctx_.get()), 0, -1, -1);
  EXPECT_EQ(c.restore(0, tokens.data(), tokens.size())->tokens, 64u);
}

TEST_F(PrefixCacheChecks, AnEngineCallingWithoutPauseReconnectsWithinAboutASecond) {
  // A store loop that never pauses: every call while the daemon is gone fails at once, and none
  // of them may push the next attempt away.
  auto tokens = sup::randomTokens(model_, 6, 70);
  std::unique_ptr<PrefixCache> cache;
  const std::string dataDir = storeThenKillTheDaemon(cache, tokens);
  ASSERT_NE(cache, nullptr);
  PrefixCache& c = *cache;
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(c.store(0, tokens.data(), tokens.size()).code(), ErrorCode::kUnavailable);
  }
  test::DaemonProcess second(64 << 20, dataDir);
  const auto back = std::chrono::steady_clock::now();
  Result<StoreInfo> stored = makeError(ErrorCode::kUnavailable, "not yet");
  uint64_t calls = 0;
  while (!stored.ok() && std::chrono::steady_clock::now() - back < std::chrono::seconds(10)) {
    stored = c.store(0, tokens.data(), tokens.size());
    ++calls;
  }
  // (Attempts are a second apart at most: the one after the daemon came back is within about a
  // second of it. Before, each refused call pushed the next attempt a second away: none came.)
  ASSERT_TRUE(stored.ok()) << "no reconnection in 10 s of " << calls << " calls";
  EXPECT_EQ(c.stats().reconnects, 1u);
}

}  // namespace
}  // namespace kvtier::llama
