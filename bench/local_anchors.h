// The local suite's anchors that are other programs' work on the same bytes: redis-server's
// pipelined SET and GET of a prefix's chunks, and SHA-256 as OpenSSL computes it beside the chained
// block keys kvtier computes (bench/suite_local.cc measures kvtier against them).
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "bench/harness.h"
#include "kvtier/layout.h"

namespace kvtier::bench {

// `kv` as `chunks` equal chunks SET under kvtier-bench:<i>, pipelined: every command appended,
// then every reply read. Seconds.
Result<double> timeRedisSet(redisContext* c, std::span<const uint8_t> kv, uint32_t chunks);
// GET of the same chunks, pipelined; with `verify` each reply is compared with `kv`'s chunk. The
// bytes end in hiredis' reply buffers and are not copied further, which favours redis: kvtier's
// figure includes the copy into the reader's own buffer. Seconds.
Result<double> timeRedisGet(redisContext* c, std::span<const uint8_t> kv, uint32_t chunks,
                            bool verify);
// Tokens per second of the chained keys of a 128k-token prompt (each key SHA-256 of the previous
// key and the block's tokens: BlockKeyHasher, as lookup and put compute them): the median of 16
// rounds.
double chainedSha256TokensPerSecond(const Layout& layout);
// The anchor for key hashing: `openssl speed -evp sha256 -bytes 64 -seconds 1`, in tokens per
// second (a 64-byte message is 16 tokens of 4 bytes).
Result<double> opensslSha256TokensPerSecond(const std::string& openssl, const TempDir& dir);

}  // namespace kvtier::bench
