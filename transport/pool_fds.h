// Pool descriptors: how a client gets the host pool's anonymous segments (hugetlb memfds, which
// have no name to open) — their file descriptors, passed over kvtierd's Unix socket (SCM_RIGHTS).
//
// The client connects to the daemon's socket once more and sends a Request ("KVPM", version 1).
// The daemon tells it from a Cap'n Proto connection and from a fast lane by those first four bytes
// (a Cap'n Proto message cannot start with them: it would declare over a billion segments). It
// checks the peer's kernel credentials as it does before it hands out a segment name (root or the
// daemon's user: the segments map the whole pool, every tenant's blocks; daemon/access.h), answers
// a Reply — a status, then one Extent per anonymous segment, the segments' descriptors attached in
// order, at most kMaxFdsPerMessage to a message — and closes the connection. Integers are
// little-endian, the only byte order kvtier runs on.
#pragma once

#include <kj/io.h>

#include <bit>
#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kvtier/error.h"

namespace kvtier::pool_fds {

static_assert(std::endian::native == std::endian::little,
              "pool descriptor replies are little-endian");

inline constexpr uint32_t kMagic = 0x4D50564B;  // the bytes "KVPM"
inline constexpr uint32_t kVersion = 1;
// Descriptors attached to one message (the kernel takes up to 253).
inline constexpr size_t kMaxFdsPerMessage = 64;
// The most extents a reply may name: a pool of 4 TiB in the default 1 GiB extents. A client
// refuses a reply that names more, before it reads them.
inline constexpr uint32_t kMaxExtents = 4096;

struct Request {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
};
static_assert(sizeof(Request) == 8);

enum class ReplyStatus : uint32_t {
  kAccepted = 0,
  kRefused = 1,         // the peer may not map the pool (not root, not the daemon's user)
  kUnknownVersion = 2,  // a request of another version
};

struct ReplyHeader {
  uint32_t status = 0;
  uint32_t extents = 0;  // Extents that follow (0 unless accepted)
};
static_assert(sizeof(ReplyHeader) == 8);

struct Extent {
  uint32_t id = 0;     // the extent's id, as Session.open names it
  uint32_t flags = 0;  // 0
  uint64_t bytes = 0;  // the bytes to map
};
static_assert(sizeof(Extent) == 16);

// An extent and its descriptor, as the daemon sends it (`fd` borrowed).
struct ExtentFd {
  uint32_t id = 0;
  uint64_t bytes = 0;
  int fd = -1;
};

// An extent and its descriptor, as the client receives it (`fd` owned).
struct ReceivedExtent {
  uint32_t id = 0;
  uint64_t bytes = 0;
  kj::AutoCloseFd fd;
};

// The daemon's side: writes the reply to connected socket `socket` (the descriptors of `extents`
// attached; none unless `status` is kAccepted) without blocking (MSG_DONTWAIT: a reply is a few
// KiB, it fits an empty socket buffer). UNAVAILABLE when the socket takes it not whole.
Status sendReply(int socket, ReplyStatus status, std::span<const ExtentFd> extents);

// The client's side over connected socket `socket`, after its Request: reads the reply until
// complete or `timeout` passes. PERMISSION_DENIED when refused; PROTOCOL_MISMATCH for a reply that
// does not parse (or names over kMaxExtents, or has a descriptor short or over); UNAVAILABLE when
// the connection ends or the time passes first. Every received descriptor is closed on error.
Result<std::vector<ReceivedExtent>> receiveReply(int socket, std::chrono::milliseconds timeout);

// Connects to kvtierd's socket at `socketPath`, sends a Request and receives the reply.
Result<std::vector<ReceivedExtent>> request(const std::string& socketPath,
                                            std::chrono::milliseconds timeout);

}  // namespace kvtier::pool_fds
