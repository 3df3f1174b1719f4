// The kvtier command line: numbers are parsed strictly (no sign wrap, no trailing junk), and a bad
// one is refused naming the argument, with nothing sent to the daemon.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "tests/test_support.h"
#include "tools/cli_numbers.h"
#include "tools/synthetic_kv.h"

namespace kvtier {
namespace {

TEST(CliNumbers, OnlyDecimalDigitsWithinTheRangeAreANumber) {
  EXPECT_EQ(cli::parseCount("0", "n").value(), 0u);
  EXPECT_EQ(cli::parseCount("18446744073709551615", "n").value(), UINT64_MAX);
  EXPECT_EQ(cli::parseCount("40", "n", 1, 40).value(), 40u);
  for (const char* bad :
       {"-5", "+5", " 5", "5 ", "5x", "0x10", "", "1e3", "18446744073709551616"}) {
    auto r = cli::parseCount(bad, "argument 2 of 'truncate'");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.code(), ErrorCode::kInvalidArgument);
    EXPECT_EQ(r.error().message(), std::string("argument 2 of 'truncate' wants a whole number from "
                                               "0 to 18446744073709551615, not '") +
                                       bad + "'");
  }
  EXPECT_FALSE(cli::parseCount("41", "n", 1, 40).ok());
  EXPECT_FALSE(cli::parseCount("0", "n", 1, 40).ok());
}

TEST(Cli, ANegativeOrMalformedPositionIsRefusedAndChangesNothing) {
  test::DaemonProcess daemon;
  auto client = daemon.connect();
  const Layout layout = test::testLayout();
  auto space = client->open(layout).value();
  std::vector<uint32_t> tokens(40);
  std::iota(tokens.begin(), tokens.end(), 7000u);
  const auto kv = synthetic::packedKv(layout, tokens, 0, 40);
  ASSERT_TRUE(
      space->put("cli-seq", 0, tokens, kv.data(), kv.size(), PutOptions{.detached = true}).ok());
  const std::string spec = "test/tiny:4:2:32:f16:16";
  auto cli = [&](std::vector<std::string> args, std::string* out) {
    args.insert(args.begin(), {"--socket", daemon.socket(), "--layout", spec});
    return test::runTool(args, out, /*withStderr=*/true);
  };
  std::string out;
  // std::stoull took "-5" as 18446744073709551611, a truncate past the end: {"ok": true}.
  EXPECT_EQ(cli({"truncate", "cli-seq", "-5"}, &out), 2) << out;
  EXPECT_NE(out.find("argument 2 of 'truncate' wants a whole number from 0 to "
                     "18446744073709551615, not '-5'"),
            std::string::npos)
      << out;
  EXPECT_EQ(cli({"truncate", "cli-seq", "12abc"}, &out), 2) << out;
  EXPECT_NE(out.find("not '12abc'"), std::string::npos) << out;
  // "-3" was a snapshot from 18446744073709551613: an empty one, made.
  EXPECT_EQ(cli({"snapshot", "cli-seq", "-3"}, &out), 2) << out;
  EXPECT_EQ(cli({"restore", "other", "-1", "4"}, &out), 2) << out;
  EXPECT_NE(out.find("the snapshot id wants a whole number"), std::string::npos) << out;
  EXPECT_EQ(client->stats().value().snapshots, 0u);
  EXPECT_EQ(space->length("cli-seq").value().value_or(0), 40u);
  // Good numbers still work.
  ASSERT_EQ(cli({"truncate", "cli-seq", "20"}, &out), 0) << out;
  EXPECT_EQ(space->length("cli-seq").value().value_or(0), 20u);
  // A layout with a bad number is refused naming the field.
  EXPECT_NE(test::runTool({"--socket", daemon.socket(), "--layout", "test/tiny:4:-2:32:f16:16",
                           "length", "cli-seq"},
                          &out, /*withStderr=*/true),
            0);
  EXPECT_NE(out.find("the layout's KV heads wants a whole number"), std::string::npos) << out;
}

}  // namespace
}  // namespace kvtier
