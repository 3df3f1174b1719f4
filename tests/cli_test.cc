// The command lines of kvtier and kvtierd: numbers are parsed strictly (no sign wrap, no trailing
// junk), and a bad one is refused naming the argument, with nothing sent to the daemon; `kvtier
// put` and `lookup` make and find sequences with their options; both print their version.
#include <gtest/gtest.h>

#include <fstream>
#include <numeric>
#include <vector>

#include "tests/temp_dir.h"
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

void writeText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

void writeBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

// `kvtier put` creates a sequence as Space::put does, with its window or chunk, and stores the
// bytes given; `kvtier lookup` finds the prefix and can bind it to a sequence.
TEST(Cli, PutCreatesASequenceWithItsOptionsAndLookupFindsIt) {
  test::DaemonProcess daemon;
  test::TempDir dir;
  auto client = daemon.connect();
  const Layout layout = test::testLayout();
  auto space = client->open(layout).value();
  std::vector<uint32_t> tokens(64);
  std::iota(tokens.begin(), tokens.end(), 9000u);
  std::string list;
  for (size_t i = 0; i < tokens.size(); ++i) {
    list += std::to_string(tokens[i]) + (i % 8 == 7 ? "\n" : i % 2 ? ", " : " ");
  }
  writeText(dir.file("tokens.txt"), list);
  const auto kv = synthetic::packedKv(layout, tokens, 0, tokens.size());
  writeBytes(dir.file("kv.bin"), kv);
  auto cli = [&](std::vector<std::string> args, std::string* out) {
    args.insert(args.begin(), {"--socket", daemon.socket(), "--layout", "test/tiny:4:2:32:f16:16"});
    return test::runTool(args, out, /*withStderr=*/true);
  };
  std::string out;
  // A window of 32 tokens: after 64 tokens, positions before 32 are released.
  ASSERT_EQ(
      cli({"put", "windowed", "0", dir.file("tokens.txt"), dir.file("kv.bin"), "--window", "32"},
          &out),
      0)
      << out;
  EXPECT_NE(out.find("{\"length\": 64, \"sealed_blocks\": 4}"), std::string::npos) << out;
  ASSERT_EQ(cli({"put", "whole", "0", dir.file("tokens.txt"), dir.file("kv.bin")}, &out), 0) << out;
  EXPECT_EQ(space->length("windowed").value().value_or(0), 64u);
  EXPECT_TRUE(space->canResume("windowed", 64).value());
  EXPECT_FALSE(space->canResume("windowed", 40).value()) << "the window did not apply";
  EXPECT_TRUE(space->canResume("whole", 40).value());
  // The bytes are the file's.
  auto read = space->get("whole", 0, 64).value();
  std::vector<uint8_t> got(kv.size());
  ASSERT_TRUE(read.copyTo(0, 64, got.data(), got.size()).ok());
  EXPECT_EQ(got, kv);
  read.release();
  // A second put appends (a decode step), a chunked sequence keeps only its current chunk.
  writeText(dir.file("next.txt"), std::to_string(tokens[0]));
  const auto kvNext = synthetic::packedKv(layout, tokens, 0, 1);
  writeBytes(dir.file("next.bin"), kvNext);
  ASSERT_EQ(cli({"put", "whole", "64", dir.file("next.txt"), dir.file("next.bin")}, &out), 0)
      << out;
  EXPECT_EQ(space->length("whole").value().value_or(0), 65u);
  ASSERT_EQ(
      cli({"put", "chunked", "0", dir.file("tokens.txt"), dir.file("kv.bin"), "--chunk", "48"},
          &out),
      0)
      << out;
  EXPECT_FALSE(space->canResume("chunked", 40).value()) << "the chunk did not apply";

  // lookup: the longest cached prefix, and with --bind a sequence holding it.
  ASSERT_EQ(cli({"lookup", dir.file("tokens.txt")}, &out), 0) << out;
  EXPECT_NE(out.find("{\"matched_tokens\": 64, \"blocks\": 4}"), std::string::npos) << out;
  ASSERT_EQ(cli({"lookup", dir.file("tokens.txt"), "--bind", "bound"}, &out), 0) << out;
  EXPECT_NE(out.find("\"bound\": \"bound\""), std::string::npos) << out;
  EXPECT_EQ(space->length("bound").value().value_or(0), 64u);

  // Bad input is refused, naming it, and creates nothing.
  writeBytes(dir.file("short.bin"), std::vector<uint8_t>(kv.begin(), kv.end() - 1));
  EXPECT_EQ(cli({"put", "bad", "0", dir.file("tokens.txt"), dir.file("short.bin")}, &out), 1);
  EXPECT_NE(out.find("INVALID_ARGUMENT"), std::string::npos) << out;
  writeText(dir.file("negative.txt"), "1 2 -3");
  EXPECT_EQ(cli({"put", "bad", "0", dir.file("negative.txt"), dir.file("kv.bin")}, &out), 1);
  EXPECT_NE(out.find("token 2 of " + dir.file("negative.txt") + " wants a whole number"),
            std::string::npos)
      << out;
  EXPECT_EQ(
      cli({"put", "bad", "0", dir.file("tokens.txt"), dir.file("kv.bin"), "--window", "-1"}, &out),
      2);
  EXPECT_NE(out.find("--window wants a whole number"), std::string::npos) << out;
  EXPECT_EQ(
      cli({"put", "bad", "0", dir.file("tokens.txt"), dir.file("kv.bin"), "--bind", "x"}, &out), 2);
  EXPECT_NE(out.find("'put' takes no --bind"), std::string::npos) << out;
  EXPECT_FALSE(space->length("bad").value().has_value());
  // The commands are in the help.
  ASSERT_EQ(test::runTool({"--help"}, &out), 0);
  EXPECT_NE(out.find("put SEQ BEGIN TOKENS KV [--window W] [--chunk C]"), std::string::npos) << out;
  EXPECT_NE(out.find("lookup TOKENS [--bind SEQ"), std::string::npos) << out;
}

// `kvtierd --version` and `kvtier --version` print the project's version and exit 0, and the
// daemon answers a client's hello with the same text.
TEST(Cli, BothProgramsPrintTheProjectsVersion) {
  const std::string expected = std::string("kvtierd ") + KVTIER_VERSION + "\n";
  test::PeerProcess daemonVersion({"--version"}, KVTIER_DAEMON_PATH, /*withStderr=*/true);
  EXPECT_EQ(daemonVersion.wait(), 0);
  EXPECT_EQ(daemonVersion.output(), expected);
  std::string out;
  EXPECT_EQ(test::runTool({"--version"}, &out, /*withStderr=*/true), 0);
  EXPECT_EQ(out, std::string("kvtier ") + KVTIER_VERSION + "\n");
  test::DaemonProcess daemon;
  EXPECT_EQ(daemon.connect()->daemonVersion() + "\n", expected);
}

}  // namespace
}  // namespace kvtier
