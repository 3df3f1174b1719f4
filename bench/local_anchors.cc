// The local suite's anchors from other programs (bench/local_anchors.h).
#include "bench/local_anchors.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kvtier/block_key.h"
#include "tools/synthetic_kv.h"

namespace kvtier::bench {

namespace {

std::string redisKey(uint32_t i) { return "kvtier-bench:" + std::to_string(i); }

}  // namespace

Result<double> timeRedisSet(redisContext* c, std::span<const uint8_t> kv, uint32_t chunks) {
  const size_t chunk = kv.size() / chunks;
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i < chunks; ++i) {
    const std::string key = redisKey(i);
    if (redisAppendCommand(c, "SET %b %b", key.data(), key.size(), kv.data() + i * chunk, chunk) !=
        REDIS_OK) {
      return unavailable("redis: ", c->errstr);
    }
  }
  for (uint32_t i = 0; i < chunks; ++i) {
    void* raw = nullptr;
    if (redisGetReply(c, &raw) != REDIS_OK) return unavailable("redis: ", c->errstr);
    RedisReplyPtr reply(static_cast<redisReply*>(raw));
    if (reply->type != REDIS_REPLY_STATUS) {
      return unavailable("redis SET answered type ", reply->type);
    }
  }
  return secondsSince(t0);
}

Result<double> timeRedisGet(redisContext* c, std::span<const uint8_t> kv, uint32_t chunks,
                            bool verify) {
  const size_t chunk = kv.size() / chunks;
  const auto t0 = Clock::now();
  for (uint32_t i = 0; i < chunks; ++i) {
    const std::string key = redisKey(i);
    if (redisAppendCommand(c, "GET %b", key.data(), key.size()) != REDIS_OK) {
      return unavailable("redis: ", c->errstr);
    }
  }
  for (uint32_t i = 0; i < chunks; ++i) {
    void* raw = nullptr;
    if (redisGetReply(c, &raw) != REDIS_OK) return unavailable("redis: ", c->errstr);
    RedisReplyPtr reply(static_cast<redisReply*>(raw));
    if (reply->type != REDIS_REPLY_STRING || static_cast<size_t>(reply->len) != chunk) {
      return unavailable("redis GET ", redisKey(i), " answered type ", reply->type, " of ",
                         reply->len, " bytes");
    }
    if (verify && std::memcmp(reply->str, kv.data() + i * chunk, chunk) != 0) {
      return unavailable("redis GET ", redisKey(i), " returned different bytes");
    }
  }
  return secondsSince(t0);
}

// The key chain of a 128k-token prompt: 8,192 blocks of 16 tokens.
namespace {
constexpr size_t kHashPromptTokens = 128 * 1024;
constexpr int kHashRounds = 16;
}  // namespace

double chainedSha256TokensPerSecond(const Layout& layout) {
  static const std::vector<uint32_t> tokens = synthetic::tokens(4242, kHashPromptTokens);
  const size_t bt = layout.blockTokens;
  std::vector<double> rounds;
  Key128 last;
  for (int r = 0; r < kHashRounds; ++r) {
    BlockKeyHasher hasher(layout.fingerprint(), saltFor("bench"));
    const auto t0 = Clock::now();
    Key128 key = hasher.next(nullptr, std::span(tokens).subspan(0, bt));
    for (size_t b = 1; b < tokens.size() / bt; ++b) {
      key = hasher.next(&key, std::span(tokens).subspan(b * bt, bt));
    }
    rounds.push_back(tokens.size() / secondsSince(t0));
    last = key;
  }
  asm volatile("" : : "r"(last.bytes.data()) : "memory");
  return medianOf(rounds);
}

Result<double> opensslSha256TokensPerSecond(const std::string& openssl, const TempDir& dir) {
  auto child =
      ChildProcess::spawn({openssl, "speed", "-evp", "sha256", "-bytes", "64", "-seconds", "1"},
                          dir.file("openssl-speed.log"), true);
  if (!child) return child.error();
  auto line = child->waitForLine("sha256", std::chrono::seconds(30));
  if (!line) return line.error();
  // "sha256          346322.80k": thousands of bytes per second.
  const char* digits = line->c_str() + 6;
  char* end = nullptr;
  const double kbytes = std::strtod(digits, &end);
  if (end == digits || *end != 'k' || kbytes <= 0) {
    return unavailable("cannot read openssl speed's line '", *line, "'");
  }
  return kbytes * 1000 / 4;
}

}  // namespace kvtier::bench
