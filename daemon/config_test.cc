#include "daemon/config.h"

#include <gtest/gtest.h>

namespace kvtier {
namespace {

TEST(DaemonConfig, GpusDefaultToEveryDeviceWithAOneGigabytePool) {
  auto c = parseDaemonArgs({});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->allGpus);
  EXPECT_TRUE(c->gpus.empty());
  EXPECT_EQ(c->gpuPoolBytes, uint64_t{1} << 30);
}

TEST(DaemonConfig, BusyPollingDefaultsTo50MicrosecondsAndCanBeOff) {
  EXPECT_EQ(parseDaemonArgs({}).value().busyPollMicros, 50u);
  EXPECT_EQ(parseDaemonArgs({"--busy-poll-us", "0"}).value().busyPollMicros, 0u);
  EXPECT_EQ(parseDaemonArgs({"--busy-poll-us=200"}).value().busyPollMicros, 200u);
  for (const char* bad : {"", "-1", "abc", "10001", "5us"}) {
    auto c = parseDaemonArgs({"--busy-poll-us", bad});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(c.error().message().find("--busy-poll-us"), std::string::npos) << bad;
  }
}

TEST(DaemonConfig, GpusTakeAllNoneOrAList) {
  auto none = parseDaemonArgs({"--gpus", "none"});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->allGpus);
  EXPECT_TRUE(none->gpus.empty());
  auto list = parseDaemonArgs({"--gpus=0,3", "--gpu-pool-bytes", "8G"});
  ASSERT_TRUE(list.ok());
  EXPECT_FALSE(list->allGpus);
  EXPECT_EQ(list->gpus, (std::vector<int>{0, 3}));
  EXPECT_EQ(list->gpuPoolBytes, uint64_t{8} << 30);
  // A later flag wins, as for every flag.
  auto later = parseDaemonArgs({"--gpus", "1", "--gpus", "all"});
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(later->allGpus);
  EXPECT_TRUE(later->gpus.empty());
}

TEST(DaemonConfig, BadGpuFlagsAreRefusedByName) {
  for (const char* bad : {"", "x", "0,", ",1", "-1", "1,a", "256", "0 1"}) {
    auto c = parseDaemonArgs({"--gpus", bad});
    ASSERT_FALSE(c.ok()) << "'" << bad << "'";
    EXPECT_EQ(c.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(c.error().message().find("--gpus"), std::string::npos) << c.error().message();
  }
  auto size = parseDaemonArgs({"--gpu-pool-bytes", "12Q"});
  ASSERT_FALSE(size.ok());
  EXPECT_NE(size.error().message().find("--gpu-pool-bytes"), std::string::npos);
}

}  // namespace
}  // namespace kvtier
