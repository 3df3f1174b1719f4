// Every memory llama.cpp keeps, on kvtier, end to end with the real engine: a sliding-window
// model (gemma2: interleaved SWA), a recurrent one (mamba) and a hybrid (lfm2: short-convolution
// layers and attention; and lfm2 whose attention is windowed: hybrid-iSWA), each with flash
// attention on and off. Each engine is a process of its
// own (kvtier_llama_worker) against a real kvtierd; a restored prefix gives the logits of a
// recompute that split its batches at the same positions, bit for bit, and whatever cannot be
// served whole (KV without its state, a damaged state) is a miss.
#include <sys/mman.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <fstream>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "integrations/llama/llama_support.h"
#include "integrations/llama/llama_worker_fixture.h"
#include "tests/etcd_process.h"

namespace kvtier::llama {
namespace {

struct Family {
  const char* name;    // the generated model's preset
  const char* memory;  // what PrefixCache::memoryKind() says
  bool recurrent;
};

void PrintTo(const Family& f, std::ostream* os) { *os << f.name; }

const Family kGemma2{"gemma2-tiny", "iswa", false};
const Family kMamba{"mamba-tiny", "recurrent", true};
const Family kLfm2{"lfm2-tiny", "hybrid", true};
const Family kLfm2Swa{"lfm2-swa-tiny", "hybrid-iswa", true};

// Blocks of 32 tokens (the worker's default); the recurrent models store a state every 64
// tokens, the windowed one evaluates in chunks of its window (128): every prefill splits its
// batches at the multiples of kStep.
constexpr size_t kBlock = 32;
size_t stepOf(const Family& f) { return f.recurrent ? 64 : 128; }

// The batch boundaries of a prompt of `n` tokens whose prefix [0, restored) came from a prefill
// of the same prompt (chunks ending at multiples of `step`) and whose rest was prefilled from
// `restored` on: what a recompute must split at to compute the same bytes.
std::string splitsOf(size_t step, size_t restored, size_t n, std::vector<size_t> more = {}) {
  std::set<size_t> at(more.begin(), more.end());
  for (size_t p = step; p < n; p += step) at.insert(p);
  if (restored > 0) at.insert(restored);
  std::ostringstream out;
  for (size_t p : at) out << (out.tellp() > 0 ? "," : "") << p;
  return out.str();
}

class LlamaFamilies : public WorkerTest,
                      public ::testing::WithParamInterface<std::tuple<Family, bool>> {
 protected:
  LlamaFamilies() : WorkerTest(256 << 20, {"--eviction", "lru"}) {}

  static void SetUpTestSuite() {
    models_ = new test::TempDir();
    for (const Family& f : {kGemma2, kMamba, kLfm2, kLfm2Swa}) {
      support::makeModel(models_->file(std::string(f.name) + ".gguf"), f.name, 1);
    }
  }
  static void TearDownTestSuite() { delete models_; }

  const Family& family() const { return std::get<0>(GetParam()); }
  std::string model() const { return models_->file(std::string(family().name) + ".gguf"); }
  size_t step() const { return stepOf(family()); }
  // The worker's options for this family and flash-attention setting, after `args`.
  std::vector<std::string> with(std::vector<std::string> args) const {
    args.insert(args.end(), {"--fa", std::get<1>(GetParam()) ? "on" : "off"});
    if (family().recurrent) args.insert(args.end(), {"--checkpoint", std::to_string(step())});
    return args;
  }
  Run run(const std::string& mode, const std::string& logitsName, std::vector<std::string> args) {
    return worker(mode, model(), logitsName, with(std::move(args)));
  }
  // Where a prompt of `n` tokens prefilled from 0 can be restored from: the deepest state (at a
  // multiple of the step) for a recurrent model, the whole blocks for a windowed one.
  size_t restorable(size_t n) const {
    return family().recurrent ? (n - 1) / step() * step() : n / kBlock * kBlock;
  }

  static test::TempDir* models_;
};

test::TempDir* LlamaFamilies::models_ = nullptr;

// The models with a recurrent state: what only they do.
class LlamaRecurrentFamilies : public LlamaFamilies {};

TEST_P(LlamaFamilies, AnotherProcessRestoresThePrefixWithTheLogitsOfARecompute) {
  Run a = run("prefill", "-", {"--prompt", "1:300"});
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_NE(a.out.find(std::string("memory ") + family().memory + " state "), std::string::npos)
      << a.out;
  EXPECT_NE(a.out.find(" checkpoint " + std::to_string(step()) + "\n"), std::string::npos) << a.out;
  EXPECT_TRUE(has(a.out, "restored 0 unavailable 0")) << a.out;
  // Another process, a prompt that goes on from A's: it restores as far as kvtier holds A's
  // prompt whole, and evaluates from there (in batches of 64 and more: with flash attention, the
  // windowed rows must sit where a recompute puts them for a batch that long to be exact).
  const size_t p = restorable(300);
  Run b = run("prefill", "restored", {"--prompt", "1:300+2:100"});
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(has(b.out, "restored " + std::to_string(p) + " unavailable 0")) << b.out;
  EXPECT_NE(b.out.find("prefill evaluated " + std::to_string(400 - p) + " "), std::string::npos)
      << b.out;
  Run c = worker("recompute", model(), "recomputed",
                 with({"--prompt", "1:300+2:100", "--split", splitsOf(step(), p, 400)}));
  ASSERT_EQ(c.code, 0) << c.out;
  expectSameLogits("restored.0", "recomputed.0");
}

TEST_P(LlamaFamilies, TheDefaultChunkIsTheDocumentedOne) {
  // No --checkpoint: gemma2's window (128 tokens); a state of one block (mamba has no KV: 512
  // tokens; lfm2's 1,100-byte state takes one 8 KiB block): 4 sqrt(1) blocks of 32 tokens.
  Run a = worker("prefill", model(), "-",
                 {"--prompt", "1:40", "--fa", std::get<1>(GetParam()) ? "on" : "off"});
  ASSERT_EQ(a.code, 0) << a.out;
  const std::string memory = family().memory;
  const char* expected = memory == "iswa" ? "128" : memory == "recurrent" ? "512" : "128";
  EXPECT_NE(a.out.find(std::string(" checkpoint ") + expected + "\n"), std::string::npos) << a.out;
}

TEST_P(LlamaRecurrentFamilies, ADamagedStateIsAMissNeverFedToTheEngine) {
  ASSERT_EQ(run("prefill", "-", {"--prompt", "1:200"}).code, 0);
  // A stray write flips a byte deep in the deepest state (at 192) in the pool.
  Run x = run("corrupt", "-", {"--prompt", "1:200+2:10"});
  ASSERT_EQ(x.code, 0) << x.out;
  EXPECT_TRUE(has(x.out, "corrupted state at 192")) << x.out;
  Run b = run("prefill", "restored", {"--prompt", "1:200+2:10"});
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(has(b.out, "restored 0 unavailable 0")) << b.out;
  EXPECT_NE(b.out.find("stats restoreCorrupt 1 "), std::string::npos) << b.out;
  Run c = worker("recompute", model(), "recomputed",
                 with({"--prompt", "1:200+2:10", "--split", splitsOf(step(), 0, 210)}));
  expectSameLogits("restored.0", "recomputed.0");
}

TEST_P(LlamaRecurrentFamilies, WhenStatesAreEvictedTheDeepestLeftIsRestoredNeverKvWithoutOne) {
  // A pool too small for everything the prompts below store, the least recently used going
  // first: the first prompt's states and blocks go, some or all, as later prompts come. Whatever
  // is restored of it is a position with its state and every block before it: the logits then
  // equal a recompute that splits there. KV without its state would be off by ~0.4.
  stopDaemon(SIGTERM);
  daemon_ = std::make_unique<test::DaemonProcess>(2 << 20, "",
                                                  std::vector<std::string>{"--eviction", "lru"});
  ASSERT_EQ(run("prefill", "-", {"--prompt", "1:300"}).code, 0);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(run("prefill", "-", {"--prompt", std::to_string(100 + i) + ":2000"}).code, 0);
  }
  auto client = daemon_->connect();
  auto stats = client->stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->evictions, 0u);
  Run b = run("prefill", "restored", {"--prompt", "1:300+2:20"});
  ASSERT_EQ(b.code, 0) << b.out;
  const size_t at = b.out.find("restored ");
  ASSERT_NE(at, std::string::npos) << b.out;
  const size_t p = std::stoul(b.out.substr(at + 9));
  EXPECT_LT(p, restorable(300)) << "nothing of the first prompt was evicted: " << b.out;
  EXPECT_EQ(p % step(), 0u) << b.out;
  Run c = worker("recompute", model(), "recomputed",
                 with({"--prompt", "1:300+2:20", "--split", splitsOf(step(), p, 320)}));
  expectSameLogits("restored.0", "recomputed.0");
}

TEST_P(LlamaRecurrentFamilies,
       AChatsSecondTurnRestoresTheFirstTurnWholeAndEvaluatesOnlyTheNewMessage) {
  // Turn 1: the prompt (prefilled: states at 64 and 128), an answer of 21 tokens decoded one at
  // a time, and the turn's end stored: blocks to 160 and the state at 171.
  Run t1 = run("chat", "-", {"--prompt", "1:150", "--answer", "3:21"});
  ASSERT_EQ(t1.code, 0) << t1.out;
  const bool kv = std::string(family().memory) != "recurrent";
  EXPECT_TRUE(
      has(t1.out, std::string("turn stored ") + (kv ? "32 cached 128" : "0 cached 0") + " state 1"))
      << t1.out;
  // Turn 2, another process: the conversation so far and a new message.
  Run t2 = run("prefill", "restored", {"--prompt", "1:150+3:21+4:40"});
  ASSERT_EQ(t2.code, 0) << t2.out;
  EXPECT_TRUE(has(t2.out, "restored 171 unavailable 0")) << t2.out;
  EXPECT_NE(t2.out.find("prefill evaluated 40 "), std::string::npos) << t2.out;
  // The recompute evaluates turn 1 as it was: the prompt in chunks, the answer token by token.
  std::vector<size_t> answer;
  for (size_t p = 150; p <= 171; ++p) answer.push_back(p);
  Run c =
      worker("recompute", model(), "recomputed",
             with({"--prompt", "1:150+3:21+4:40", "--split", splitsOf(step(), 171, 211, answer)}));
  ASSERT_EQ(c.code, 0) << c.out;
  expectSameLogits("restored.0", "recomputed.0");
}

TEST_P(LlamaFamilies, SeveralProcessesStoreAndRestoreAtOnce) {
  std::vector<std::unique_ptr<test::PeerProcess>> procs;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> args = {"prefill",
                                     "--model",
                                     model(),
                                     "--socket",
                                     daemon_->socket(),
                                     "--prompt",
                                     "1:160+" + std::to_string(10 + i) + ":90"};
    args = with(args);
    procs.push_back(std::make_unique<test::PeerProcess>(args, KVTIER_LLAMA_WORKER_PATH));
  }
  for (auto& p : procs) {
    EXPECT_EQ(p->wait(), 0) << p->output();
    EXPECT_TRUE(has(p->output(), "done")) << p->output();
  }
  // Whoever stored the shared prefix first, its bytes are those every process computed.
  const size_t p = restorable(250);
  Run b = run("prefill", "restored", {"--prompt", "1:160+12:90+5:30"});
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(has(b.out, "restored " + std::to_string(p) + " unavailable 0")) << b.out;
  Run c = worker("recompute", model(), "recomputed",
                 with({"--prompt", "1:160+12:90+5:30", "--split", splitsOf(step(), p, 280)}));
  expectSameLogits("restored.0", "recomputed.0");
}

TEST_P(LlamaFamilies, AProcessKilledWhilePrefillingLeaksNothing) {
  auto client = daemon_->connect();
  test::PeerProcess p(with({"prefill-loop", "--model", model(), "--socket", daemon_->socket(),
                            "--prompt", "1:100"}),
                      KVTIER_LLAMA_WORKER_PATH);
  p.waitForLine("prefilled 2 ok");
  p.kill(SIGKILL);
  p.wait();
  Stats s = test::waitForStats(*client, [](const Stats& s) {
    return s.clients == 1 && s.readLeases == 0 && s.writeLeases == 0 && s.blocksPinned == 0 &&
           s.sequences == 0;
  });
  EXPECT_EQ(s.readLeases, 0u);
  EXPECT_EQ(s.writeLeases, 0u);
  EXPECT_EQ(s.blocksPinned, 0u);
  EXPECT_EQ(s.sequences, 0u);
  // What it stored before is served.
  Run b = run("prefill", "-", {"--prompt", "1:100+1000:200+9:5"});
  EXPECT_TRUE(has(b.out, "restored " + std::to_string(restorable(300)) + " unavailable 0"))
      << b.out;
}

TEST_P(LlamaFamilies, APrefixAndItsStateSurviveADaemonRestartOnTheColdTier) {
  // A daemon with a cold tier in a directory of the test's: stopped, its blocks and states are
  // on disk; started again, it serves them.
  stopDaemon(SIGTERM);
  const std::string data = dir_.file("daemon");
  const std::vector<std::string> args = {"--cold-tier", "on", "--eviction", "lru"};
  daemon_ = std::make_unique<test::DaemonProcess>(256 << 20, data, args);
  ASSERT_EQ(run("prefill", "-", {"--prompt", "1:300"}).code, 0);
  stopDaemon(SIGTERM);
  daemon_ = std::make_unique<test::DaemonProcess>(256 << 20, data, args);
  const size_t p = restorable(300);
  Run b = run("prefill", "restored", {"--prompt", "1:300+2:100"});
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(has(b.out, "restored " + std::to_string(p) + " unavailable 0")) << b.out;
  Run c = worker("recompute", model(), "recomputed",
                 with({"--prompt", "1:300+2:100", "--split", splitsOf(step(), p, 400)}));
  expectSameLogits("restored.0", "recomputed.0");
}

// Two daemons in a cluster (static membership on loopback): a prefix one node's engine stored is
// a remote hit on the other, blocks and state together.
class LlamaFamiliesCluster : public LlamaFamilies {
 protected:
  void SetUp() override {
    stopDaemon(SIGTERM);  // the fixture's lone daemon: this test runs two of its own
    ports_[0] = test::freePort();
    do ports_[1] = test::freePort();
    while (ports_[1] == ports_[0]);
    token_ = dir_.file("token");
    std::ofstream(token_) << "kvtier-llama-cluster-test-token";
    for (int i = 0; i < 2; ++i) {
      const std::vector<std::string> args = {"--listen",
                                             "127.0.0.1:" + std::to_string(ports_[i]),
                                             "--node-id",
                                             "n" + std::to_string(i),
                                             "--cluster-token-file",
                                             token_,
                                             "--peer-timeout-ms",
                                             "2000",
                                             "--peers",
                                             "127.0.0.1:" + std::to_string(ports_[1 - i])};
      nodes_[i] = std::make_unique<test::DaemonProcess>(256 << 20, "", args);
    }
    for (auto& node : nodes_) {
      auto client = node->connect();
      test::waitForStats(*client, [](const Stats& s) { return s.clusterMembersUp == 2; });
    }
  }
  void TearDown() override {
    for (auto& node : nodes_) {
      const std::string prefix = node->segmentPrefix();
      node.reset();
      for (const auto& name : test::shmSegments(prefix)) ::shm_unlink(("/" + name).c_str());
    }
  }
  // A worker of this family on node `node`, to its end.
  Run on(int node, const std::string& mode, const std::string& logitsName,
         std::vector<std::string> args) {
    std::vector<std::string> all = {mode,
                                    "--model",
                                    model(),
                                    "--socket",
                                    nodes_[node]->socket(),
                                    "--logits",
                                    dir_.file(logitsName)};
    all.insert(all.end(), args.begin(), args.end());
    test::PeerProcess p(with(all), KVTIER_LLAMA_WORKER_PATH);
    Run r;
    r.code = p.wait();
    r.out = p.output();
    return r;
  }

  uint16_t ports_[2] = {};
  std::string token_;
  std::unique_ptr<test::DaemonProcess> nodes_[2];
};

TEST_P(LlamaFamiliesCluster, AnotherNodeRestoresThePrefixWithItsStateFromTheFirst) {
  ASSERT_EQ(on(0, "prefill", "-", {"--prompt", "1:300"}).code, 0);
  // Node 0 has told the directory what it holds.
  auto first = nodes_[0]->connect();
  test::waitForStats(*first, [](const Stats& s) { return s.publishBacklog == 0; });
  const size_t p = restorable(300);
  Run b = on(1, "prefill", "restored", {"--prompt", "1:300+2:100"});
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(has(b.out, "restored " + std::to_string(p) + " unavailable 0")) << b.out;
  auto second = nodes_[1]->connect();
  EXPECT_GT(second->stats().value().remoteHitBlocks, 0u);
  Run c = worker("recompute", model(), "recomputed",
                 with({"--prompt", "1:300+2:100", "--split", splitsOf(step(), p, 400)}));
  expectSameLogits("restored.0", "recomputed.0");
}

std::string nameOf(const ::testing::TestParamInfo<std::tuple<Family, bool>>& info) {
  std::string name = std::get<0>(info.param).memory;
  std::replace(name.begin(), name.end(), '-', '_');
  return name + (std::get<1>(info.param) ? "_FlashAttention" : "_NoFlashAttention");
}

INSTANTIATE_TEST_SUITE_P(Memories, LlamaFamilies,
                         ::testing::Combine(::testing::Values(kGemma2, kMamba, kLfm2, kLfm2Swa),
                                            ::testing::Bool()),
                         nameOf);
INSTANTIATE_TEST_SUITE_P(Memories, LlamaFamiliesCluster,
                         ::testing::Combine(::testing::Values(kGemma2, kMamba, kLfm2, kLfm2Swa),
                                            ::testing::Bool()),
                         nameOf);
INSTANTIATE_TEST_SUITE_P(Memories, LlamaRecurrentFamilies,
                         ::testing::Combine(::testing::Values(kMamba, kLfm2, kLfm2Swa),
                                            ::testing::Bool()),
                         nameOf);

}  // namespace
}  // namespace kvtier::llama
