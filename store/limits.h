// Bounds on everything a client sends. Each is checked where it is used; a call over a bound fails
// with INVALID_ARGUMENT and changes nothing.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier {

// Sequence names are client-chosen identifiers (request ids), not payloads.
inline constexpr size_t kMaxSeqNameBytes = 256;
// Tokens in one put or lookup: 1M tokens is beyond today's longest contexts and a 4 MiB message.
inline constexpr size_t kMaxTokensPerCall = size_t{1} << 20;
// Blocks one lease may grant or pin: 64K blocks of 16 tokens cover a 1M-token context.
inline constexpr size_t kMaxBlocksPerLease = size_t{1} << 16;
// Bytes carried inline in one RPC message (inline get/put/read for clients that cannot map pools).
inline constexpr uint64_t kMaxInlineBytesPerCall = uint64_t{256} << 20;
// References in one inline read.
inline constexpr size_t kMaxRefsPerRead = 4096;

}  // namespace kvtier
