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

TEST(DaemonConfig, AStopIsBoundedBy20SecondsAndTheDiskRateIsUnlimitedByDefault) {
  auto c = parseDaemonArgs({});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->shutdownTimeoutMs, 20000u);
  EXPECT_EQ(c->diskWriteBytesPerSecond, 0u);
  auto set = parseDaemonArgs({"--shutdown-timeout-ms", "5000", "--disk-write-rate", "200M"});
  ASSERT_TRUE(set.ok()) << set.error();
  EXPECT_EQ(set->shutdownTimeoutMs, 5000u);
  EXPECT_EQ(set->diskWriteBytesPerSecond, 200u << 20);
  for (const char* bad : {"999", "-5000", "+5000", "5000ms", "", "3600001"}) {
    auto r = parseDaemonArgs({"--shutdown-timeout-ms", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message().find("--shutdown-timeout-ms wants 1000 to 3600000"),
              std::string::npos)
        << r.error();
  }
  for (const char* bad : {"-1M", "fast", "1K"}) {
    auto r = parseDaemonArgs({"--disk-write-rate", bad});
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message().find("--disk-write-rate"), std::string::npos) << r.error();
  }
}

TEST(DaemonConfig, EvictionDefaultsToAdaptiveAndTakesEveryPolicy) {
  EXPECT_EQ(parseDaemonArgs({}).value().eviction, EvictionKind::kAdaptive);
  EXPECT_EQ(parseDaemonArgs({"--eviction", "lru"}).value().eviction, EvictionKind::kLru);
  EXPECT_EQ(parseDaemonArgs({"--eviction=arc"}).value().eviction, EvictionKind::kArc);
  EXPECT_EQ(parseDaemonArgs({"--eviction", "2q"}).value().eviction, EvictionKind::kTwoQ);
  EXPECT_EQ(parseDaemonArgs({"--eviction", "s3fifo"}).value().eviction, EvictionKind::kS3Fifo);
  EXPECT_EQ(parseDaemonArgs({"--eviction", "sieve"}).value().eviction, EvictionKind::kSieve);
  EXPECT_EQ(parseDaemonArgs({"--eviction", "adaptive"}).value().eviction, EvictionKind::kAdaptive);
  for (const char* bad : {"", "LRU", "fifo", "arc2", "S3-FIFO"}) {
    auto c = parseDaemonArgs({"--eviction", bad});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(c.error().message().find("--eviction"), std::string::npos) << bad;
  }
}

TEST(DaemonConfig, HugePagesDefaultToAutoAndTakeOnOrOff) {
  EXPECT_EQ(parseDaemonArgs({}).value().hugePages, HugePages::kAuto);
  EXPECT_EQ(parseDaemonArgs({"--huge-pages", "on"}).value().hugePages, HugePages::kOn);
  EXPECT_EQ(parseDaemonArgs({"--huge-pages=off"}).value().hugePages, HugePages::kOff);
  EXPECT_EQ(parseDaemonArgs({"--huge-pages", "off", "--huge-pages", "auto"}).value().hugePages,
            HugePages::kAuto);
  for (const char* bad : {"", "yes", "ON", "2M", "always"}) {
    auto c = parseDaemonArgs({"--huge-pages", bad});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(c.error().message().find("--huge-pages is auto, on or off"), std::string::npos)
        << bad;
  }
  EXPECT_NE(std::string(daemonUsage()).find("--huge-pages auto|on|off"), std::string::npos);
}

// Clients map the pool extent by extent (a descriptor each on huge pages, in one reply of at most
// 4,096): a pool of more extents is refused at start, not a pool clients silently cannot map.
TEST(DaemonConfig, APoolOfTooManyExtentsIsRefused) {
  EXPECT_TRUE(parseDaemonArgs({"--host-pool-bytes", "8G", "--extent-bytes", "2M"}).ok());
  auto c = parseDaemonArgs({"--extent-bytes", "2M", "--host-pool-bytes", "10G"});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(c.error().message().find("5120 extents, over 4096"), std::string::npos)
      << c.error().message();
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

// Expects `args` refused with INVALID_ARGUMENT and a message that names `flag`.
void expectRefused(const std::vector<std::string>& args, const std::string& flag) {
  std::string line;
  for (const auto& a : args) line += "'" + a + "' ";
  auto c = parseDaemonArgs(args);
  ASSERT_FALSE(c.ok()) << line;
  EXPECT_EQ(c.error().code(), ErrorCode::kInvalidArgument) << line;
  EXPECT_NE(c.error().message().find(flag), std::string::npos)
      << line << "-> " << c.error().message();
}

TEST(DaemonConfig, ClusterIsOffByDefault) {
  auto c = parseDaemonArgs({});
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->listen.empty());
  EXPECT_TRUE(c->advertise.empty());
  EXPECT_TRUE(c->peers.empty());
  EXPECT_TRUE(c->etcd.empty());
  EXPECT_EQ(c->cluster, "kvtier");
  EXPECT_TRUE(c->nodeId.empty());
  EXPECT_EQ(c->peerTimeoutMs, 2000u);
  EXPECT_EQ(c->pinLeaseMs, 5000u);
  EXPECT_EQ(c->etcdLeaseTtlSeconds, 5u);
}

TEST(DaemonConfig, StaticClusterFlagsAreParsed) {
  auto c = parseDaemonArgs({"--listen", "0.0.0.0:7000", "--advertise=10.0.0.1:7000", "--peers",
                            "10.0.0.2:7000,[::1]:7001", "--cluster-token-file", "/etc/kvtier/token",
                            "--node-id", "node-1.a_b", "--peer-timeout-ms", "1",
                            "--pin-lease-ms=600000"});
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->listen, "0.0.0.0:7000");
  EXPECT_EQ(c->advertise, "10.0.0.1:7000");
  EXPECT_EQ(c->peers, (std::vector<std::string>{"10.0.0.2:7000", "[::1]:7001"}));
  EXPECT_EQ(c->clusterTokenFile, "/etc/kvtier/token");
  EXPECT_EQ(c->nodeId, "node-1.a_b");
  EXPECT_EQ(c->peerTimeoutMs, 1u);
  EXPECT_EQ(c->pinLeaseMs, 600000u);
}

TEST(DaemonConfig, EtcdClusterFlagsAreParsed) {
  auto c = parseDaemonArgs({"--listen", "127.0.0.1:0", "--etcd", "http://127.0.0.1:2379",
                            "--cluster", std::string(64, 'c'), "--etcd-lease-ttl", "30"});
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->listen, "127.0.0.1:0");
  EXPECT_EQ(c->etcd, "http://127.0.0.1:2379");
  EXPECT_EQ(c->cluster, std::string(64, 'c'));
  EXPECT_TRUE(c->peers.empty());
  EXPECT_EQ(c->etcdLeaseTtlSeconds, 30u);
}

TEST(DaemonConfig, ListenAndAdvertiseWantHostAndPort) {
  for (const char* flag : {"--listen", "--advertise"}) {
    for (const char* bad : {"", "localhost", "localhost:"}) {
      expectRefused({flag, bad}, flag);
    }
  }
}

TEST(DaemonConfig, BadPeersAreRefusedByName) {
  for (const char* bad : {"a", "a:1,b", "a:1,b:", "a:1,,b:2", ",a:1"}) {
    expectRefused({"--listen", "127.0.0.1:0", "--peers", bad}, "--peers");
  }
}

TEST(DaemonConfig, EtcdWantsAnHttpUrl) {
  for (const char* bad : {"", "127.0.0.1:2379", "https://127.0.0.1:2379", "HTTP://h:1"}) {
    expectRefused({"--listen", "127.0.0.1:0", "--etcd", bad}, "--etcd");
  }
}

TEST(DaemonConfig, ClusterNameAndNodeIdAreShortAndPlain) {
  for (const char* flag : {"--cluster", "--node-id"}) {
    for (const std::string& bad :
         {std::string(), std::string(65, 'n'), std::string("a b"), std::string("a/b"),
          std::string("a:b"), std::string("\xc3\xa9")}) {
      expectRefused({flag, bad}, flag);
    }
  }
}

TEST(DaemonConfig, ClusterDurationsWant1To600000) {
  for (const char* flag : {"--peer-timeout-ms", "--pin-lease-ms", "--etcd-lease-ttl"}) {
    for (const char* bad : {"", "0", "600001", "-1", "abc", "10ms", "4294967297"}) {
      expectRefused({flag, bad}, flag);
    }
    EXPECT_TRUE(parseDaemonArgs({flag, "1"}).ok()) << flag;
    EXPECT_TRUE(parseDaemonArgs({flag, "600000"}).ok()) << flag;
  }
}

TEST(DaemonConfig, MembershipNeedsListenAndOnlyOneKind) {
  expectRefused({"--peers", "10.0.0.2:7000"}, "--listen");
  expectRefused({"--peers", "10.0.0.2:7000"}, "--peers");
  expectRefused({"--etcd", "http://127.0.0.1:2379"}, "--listen");
  expectRefused({"--etcd", "http://127.0.0.1:2379"}, "--etcd");
  for (const char* flag : {"--peers", "--etcd"}) {
    expectRefused(
        {"--listen", "127.0.0.1:0", "--peers", "10.0.0.2:7000", "--etcd", "http://127.0.0.1:2379"},
        flag);
  }
  // A listener alone is a cluster of one.
  EXPECT_TRUE(parseDaemonArgs({"--listen", "127.0.0.1:0"}).ok());
}

}  // namespace
}  // namespace kvtier

namespace kvtier {
namespace {

TEST(DaemonConfig, AllowGroupTakesANameOrGidAndDefaultsToNone) {
  EXPECT_EQ(parseDaemonArgs({}).value().allowGroup, "");
  EXPECT_EQ(parseDaemonArgs({"--allow-group", "kvtier"}).value().allowGroup, "kvtier");
  EXPECT_EQ(parseDaemonArgs({"--allow-group=1001"}).value().allowGroup, "1001");
  auto c = parseDaemonArgs({"--allow-group="});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.error().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(c.error().message().find("--allow-group"), std::string::npos);
}

TEST(DaemonConfig, TenantQuotaTakesASizeOrAPercentageOfTheHostPool) {
  auto none = parseDaemonArgs({});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->effectiveTenantQuota(), 0u);
  auto bytes = parseDaemonArgs({"--tenant-quota", "256M"});
  ASSERT_TRUE(bytes.ok()) << bytes.error();
  EXPECT_EQ(bytes->effectiveTenantQuota(), uint64_t{256} << 20);
  auto pct = parseDaemonArgs({"--host-pool-bytes", "4G", "--tenant-quota=25%"});
  ASSERT_TRUE(pct.ok()) << pct.error();
  EXPECT_EQ(pct->tenantQuotaPercent, 25u);
  EXPECT_EQ(pct->effectiveTenantQuota(), uint64_t{1} << 30);
  // The percentage is of the pool, whichever order the flags come in.
  EXPECT_EQ(parseDaemonArgs({"--tenant-quota=50%", "--host-pool-bytes=1000"})
                .value()
                .effectiveTenantQuota(),
            500u);
  for (const char* bad : {"", "0", "0%", "101%", "-5%", "%", "ten", "5x", "12.5%"}) {
    auto c = parseDaemonArgs({"--tenant-quota", bad});
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_EQ(c.error().code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(c.error().message().find("--tenant-quota"), std::string::npos) << bad;
  }
}

}  // namespace
}  // namespace kvtier
