// llama.cpp on kvtier, end to end: each engine a process of its own (kvtier_llama_worker) with the
// real llama.cpp, against a real kvtierd. A restored prefix gives the logits of a recompute bit
// for bit; whatever cannot be served exactly is a miss.
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "integrations/llama/llama_support.h"
#include "integrations/llama/llama_worker_fixture.h"

namespace kvtier::llama {
namespace {

using test::DaemonProcess;
using test::PeerProcess;

class LlamaIntegration : public WorkerTest {
 protected:
  static void SetUpTestSuite() {
    models_ = new test::TempDir();
    support::makeModel(models_->file("a.gguf"), "tiny", 1);
    support::makeModel(models_->file("b.gguf"), "tiny", 2);  // other weights, same shapes
  }
  static void TearDownTestSuite() { delete models_; }

  static std::string model(const char* name) { return models_->file(name); }

  Run worker(const std::string& mode, const std::string& logitsName, std::vector<std::string> extra,
             const std::string& modelPath = "") {
    return WorkerTest::worker(mode, modelPath.empty() ? model("a.gguf") : modelPath, logitsName,
                              std::move(extra));
  }

  static test::TempDir* models_;
};

test::TempDir* LlamaIntegration::models_ = nullptr;

// Block size 32 everywhere below (the worker's default). The storing processes evaluate their
// prompts in one batch; the process that restores, and the recompute it is compared with, split
// their batches at the restored prefix's end. llama.cpp's KV of a position depends on the batch
// boundaries before it (with flash attention), not on the tokens after it in its batch, so the
// prefix's KV is the same in all three: "the same batch split".

TEST_F(LlamaIntegration, APrefixOfWholeBlocksIsRestoredWithTheLogitsOfARecompute) {
  Run a = worker("store", "-", {"--prompt", "1:128"});
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_TRUE(has(a.out, "stored 128 cached 0")) << a.out;
  // Another process, a prompt sharing all four blocks: it evaluates only its own 40 tokens.
  Run b = worker("restore", "restored", {"--prompt", "1:128+2:40", "--split", "128"});
  ASSERT_EQ(b.code, 0) << b.out;
  EXPECT_TRUE(has(b.out, "restored 128 unavailable 0")) << b.out;
  Run c = worker("recompute", "recomputed", {"--prompt", "1:128+2:40", "--split", "128"});
  ASSERT_EQ(c.code, 0) << c.out;
  expectSameLogits("restored.0", "recomputed.0");
  // B stored its prompt after evaluating it: only its new whole block was written, and a third
  // process finds all five cached.
  EXPECT_TRUE(has(b.out, "store ok")) << b.out;
  Run d = worker("store", "-", {"--prompt", "1:128+2:40"});
  EXPECT_TRUE(has(d.out, "stored 0 cached 160")) << d.out;
}

TEST_F(LlamaIntegration, APromptEndingInsideABlockStoresAndRestoresItsWholeBlocks) {
  Run a = worker("store", "-", {"--prompt", "1:100"});
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_TRUE(has(a.out, "stored 96 cached 0")) << a.out;
  // The second prompt also ends inside a block; the first 100 tokens are A's.
  Run b = worker("restore", "restored", {"--prompt", "1:100+3:45", "--split", "96"});
  EXPECT_TRUE(has(b.out, "restored 96 unavailable 0")) << b.out;
  Run c = worker("recompute", "recomputed", {"--prompt", "1:100+3:45", "--split", "96"});
  ASSERT_EQ(c.code, 0) << c.out;
  expectSameLogits("restored.0", "recomputed.0");
}

TEST_F(LlamaIntegration, TwoSequencesOfOneContextEachGetTheirOwnPrefix) {
  Run a = worker("store", "-", {"--prompt", "1:64+3:40", "--prompt", "4:96"});
  ASSERT_EQ(a.code, 0) << a.out;
  const std::vector<std::string> prompts = {"--prompt", "1:64+3:40+5:20", "--prompt",
                                            "4:96+6:7", "--split",        "96"};
  Run b = worker("restore", "restored", prompts);
  ASSERT_EQ(b.code, 0) << b.out;
  // One line per sequence, each its own 96 tokens.
  EXPECT_NE(b.out.find("restored 96 unavailable 0\nrestored 96 unavailable 0\n"), std::string::npos)
      << b.out;
  Run c = worker("recompute", "recomputed", prompts);
  ASSERT_EQ(c.code, 0) << c.out;
  expectSameLogits("restored.0", "recomputed.0");
  expectSameLogits("restored.1", "recomputed.1");
}

TEST_F(LlamaIntegration, ARestoreIntoASequenceHoldingTokensIsRefusedAndChangesNothing) {
  ASSERT_EQ(worker("store", "-", {"--prompt", "1:64"}).code, 0);
  Run b = worker("nonempty", "-", {"--prompt", "1:64"});
  EXPECT_TRUE(has(b.out, "restore INVALID_ARGUMENT pos_max 7")) << b.out;
}

TEST_F(LlamaIntegration, OtherWeightsAnotherKvTypeOrFlashAttentionFlippedMiss) {
  ASSERT_EQ(worker("store", "-", {"--prompt", "1:128"}).code, 0);
  const std::vector<std::string> prompt = {"--prompt", "1:128+2:8", "--split", "128"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), prompt.begin(), prompt.end());
    return extra;
  };
  // The same shapes, other weights.
  Run w = worker("restore", "w", prompt, model("b.gguf"));
  EXPECT_TRUE(has(w.out, "restored 0 unavailable 0")) << w.out;
  Run wc = worker("recompute", "wc", prompt, model("b.gguf"));
  expectSameLogits("w.0", "wc.0");
  // Another K/V type, flash attention off: other bytes, never served.
  Run t = worker("restore", "t", with({"--type-k", "f32", "--type-v", "f32"}));
  EXPECT_TRUE(has(t.out, "restored 0 unavailable 0")) << t.out;
  Run q = worker("restore", "q", with({"--type-k", "q8_0"}));
  EXPECT_TRUE(has(q.out, "restored 0 unavailable 0")) << q.out;
  Run f = worker("restore", "f", with({"--fa", "off"}));
  EXPECT_TRUE(has(f.out, "restored 0 unavailable 0")) << f.out;
  // A context that applies an adapter (named in CacheOptions::adapters): other weights too.
  Run l = worker("restore", "l", with({"--adapters", "lora:5e1f@0.5"}));
  EXPECT_TRUE(has(l.out, "restored 0 unavailable 0")) << l.out;
  // The baseline: the same settings hit.
  Run same = worker("restore", "same", prompt);
  EXPECT_TRUE(has(same.out, "restored 128 unavailable 0")) << same.out;
}

TEST_F(LlamaIntegration, FlashAttentionOffAndQuantizedKeysRestoreExactlyToo) {
  // V transposed (no flash attention), and q8_0 K rows whose bytes are not a multiple of a head.
  for (const std::vector<std::string>& settings :
       {std::vector<std::string>{"--fa", "off"}, std::vector<std::string>{"--type-k", "q8_0"}}) {
    SCOPED_TRACE(settings[0]);
    auto with = [&](std::vector<std::string> args) {
      args.insert(args.end(), settings.begin(), settings.end());
      return args;
    };
    ASSERT_EQ(worker("store", "-", with({"--prompt", "7:64+8:10"})).code, 0);
    Run b = worker("restore", "r", with({"--prompt", "7:64+9:30", "--split", "64"}));
    EXPECT_TRUE(has(b.out, "restored 64 unavailable 0")) << b.out;
    Run c = worker("recompute", "c", with({"--prompt", "7:64+9:30", "--split", "64"}));
    expectSameLogits("r.0", "c.0");
  }
}

TEST_F(LlamaIntegration, AScratchSequenceMovesTheSameKvAFewBlocksAtATime) {
  // Stored a few blocks at a time through the scratch sequence (the tiny model's blocks of 16
  // tokens are 4 KiB, a staged step 256 of them: 4,992 tokens take two steps), restored the same
  // way: exact.
  const std::vector<std::string> scratch = {"--scratch", "on", "--block", "16", "--ctx", "6144"};
  auto with = [&](std::vector<std::string> args, bool withScratch = true) {
    args.insert(args.end(), scratch.begin() + (withScratch ? 0 : 2), scratch.end());
    return args;
  };
  Run a = worker("store", "-", with({"--prompt", "1:5000"}));
  ASSERT_EQ(a.code, 0) << a.out;
  EXPECT_TRUE(has(a.out, "stored 4992 cached 0")) << a.out;
  Run b = worker("restore", "r", with({"--prompt", "1:5000+2:20", "--split", "4992"}));
  EXPECT_TRUE(has(b.out, "restored 4992 unavailable 0")) << b.out;
  // b stored its own prompt after it (one more block, bound after the cached ones).
  EXPECT_TRUE(has(b.out, "store ok")) << b.out;
  Run c = worker("recompute", "c", with({"--prompt", "1:5000+2:20", "--split", "4992"}));
  ASSERT_EQ(c.code, 0) << c.out;
  expectSameLogits("r.0", "c.0");
  // The same blocks serve a context without a scratch sequence (the bytes do not depend on it).
  // Block [4992, 5008) is b's, which began a batch at 4992: so does the recompute.
  Run d = worker("restore", "d", with({"--prompt", "1:5000+2:30", "--split", "4992,5008"}, false));
  EXPECT_TRUE(has(d.out, "restored 5008 unavailable 0")) << d.out;
  Run e =
      worker("recompute", "e", with({"--prompt", "1:5000+2:30", "--split", "4992,5008"}, false));
  expectSameLogits("d.0", "e.0");
}

TEST_F(LlamaIntegration, ADamagedBlockNeverReachesTheEngineThePrefixBeforeItIsRestored) {
  // A stray write flips a byte of one block in the pool (in the middle: a K or V row). The
  // restore checks every block against its writer's checksum as it copies it: it restores the
  // blocks before the damaged one, the engine computes the rest, and its logits are a
  // recompute's. The daemon is told and drops the block; the restoring process stores its prompt
  // whole again, so a third process restores it all. In one step (flash attention on and off)
  // and in steps through a scratch sequence (pipelined, and on one thread), the damaged block in
  // the second step or the first.
  struct Case {
    const char* name;
    std::vector<std::string> settings;
    std::string stored, asked;
    int damaged;
    size_t before, all;
  };
  const std::vector<Case> cases = {
      {"one step", {}, "1:128", "1:128+2:8", 2, 64, 128},
      {"V transposed", {"--fa", "off"}, "3:128", "3:128+2:8", 1, 32, 128},
      {"staged",
       {"--scratch", "on", "--block", "16", "--ctx", "6144"},
       "4:5000",
       "4:5000+2:20",
       300,
       4800,
       5008},
      // The same on one thread, and damaged in the first step (the second step already built
      // by the pipeline's worker when the first fails: nothing of it is loaded).
      {"staged, one thread",
       {"--scratch", "on", "--block", "16", "--ctx", "6144", "--pipeline", "off"},
       "5:5000",
       "5:5000+2:20",
       300,
       4800,
       5008},
      {"staged, damaged in the first step",
       {"--scratch", "on", "--block", "16", "--ctx", "6144"},
       "6:5000",
       "6:5000+2:20",
       100,
       1600,
       5008},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    auto with = [&](std::vector<std::string> args) {
      args.insert(args.end(), k.settings.begin(), k.settings.end());
      return args;
    };
    ASSERT_EQ(worker("store", "-", with({"--prompt", k.stored})).code, 0);
    Run x = worker("corrupt", "-",
                   with({"--prompt", k.asked, "--corrupt-block", std::to_string(k.damaged)}));
    ASSERT_EQ(x.code, 0) << x.out;
    EXPECT_TRUE(has(x.out, "corrupted block " + std::to_string(k.damaged))) << x.out;
    const std::string before = std::to_string(k.before), all = std::to_string(k.all);
    Run b = worker("restore", "r", with({"--prompt", k.asked, "--split", before}));
    ASSERT_EQ(b.code, 0) << b.out;
    EXPECT_TRUE(has(b.out, "restored " + before + " unavailable 0")) << b.out;
    EXPECT_TRUE(has(b.out, "stats restoreCorrupt 1")) << b.out;
    Run c = worker("recompute", "c", with({"--prompt", k.asked, "--split", before}));
    ASSERT_EQ(c.code, 0) << c.out;
    expectSameLogits("r.0", "c.0");
    // b's store put its own, good, bytes where the dropped block was.
    EXPECT_TRUE(has(b.out, "store ok")) << b.out;
    Run d = worker("restore", "d", with({"--prompt", k.asked, "--split", before + "," + all}));
    EXPECT_TRUE(has(d.out, "restored " + all + " unavailable 0")) << d.out;
    EXPECT_TRUE(has(d.out, "stats restoreCorrupt 0")) << d.out;
    Run e = worker("recompute", "e", with({"--prompt", k.asked, "--split", before + "," + all}));
    expectSameLogits("d.0", "e.0");
  }
}

TEST_F(LlamaIntegration, TheEngineGoesOnComputingWhenTheDaemonStopsMidRun) {
  ASSERT_EQ(worker("store", "-", {"--prompt", "1:128"}).code, 0);
  const std::string fifo = dir_.file("go");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  PeerProcess b(
      {"restore", "--model", model("a.gguf"), "--socket", daemon_->socket(), "--logits",
       dir_.file("restored"), "--prompt", "1:128+2:40", "--split", "128", "--wait-fifo", fifo},
      KVTIER_LLAMA_WORKER_PATH);
  b.waitForLine("waiting");  // connected, the namespace open
  stopDaemon(SIGKILL);
  {
    std::ofstream go(fifo);
    go << 'x';
  }
  EXPECT_EQ(b.wait(), 0) << b.output();
  EXPECT_TRUE(has(b.output(), "restored 0 unavailable 1")) << b.output();
  EXPECT_TRUE(has(b.output(), "store UNAVAILABLE")) << b.output();
  Run c = worker("recompute", "recomputed", {"--prompt", "1:128+2:40", "--split", "128"});
  expectSameLogits("restored.0", "recomputed.0");
}

TEST_F(LlamaIntegration, AStoringProcessKilledLeaksNothing) {
  auto client = daemon_->connect();
  for (int round = 0; round < 3; ++round) {
    PeerProcess p({"store-loop", "--model", model("a.gguf"), "--socket", daemon_->socket(),
                   "--prompt", "1:" + std::to_string(64 + 32 * round)},
                  KVTIER_LLAMA_WORKER_PATH);
    p.waitForLine("stored " + std::to_string(2 + round) + " ok");
    p.kill(SIGKILL);
    p.wait();
    Stats s = test::waitForStats(*client, [](const Stats& s) {
      return s.clients == 1 && s.readLeases == 0 && s.writeLeases == 0 && s.blocksPinned == 0 &&
             s.sequences == 0;
    });
    EXPECT_EQ(s.clients, 1u);
    EXPECT_EQ(s.readLeases, 0u);
    EXPECT_EQ(s.writeLeases, 0u);
    EXPECT_EQ(s.blocksPinned, 0u);
    EXPECT_EQ(s.sequences, 0u);
  }
  // The daemon still serves what the killed processes stored.
  Run b = worker("restore", "restored", {"--prompt", "1:128+2:8"});
  EXPECT_TRUE(has(b.out, "restored 128 unavailable 0")) << b.out;
}

}  // namespace
}  // namespace kvtier::llama
