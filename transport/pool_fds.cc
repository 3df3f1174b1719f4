#include "transport/pool_fds.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/unix_connect.h"

namespace kvtier::pool_fds {

namespace {

using Clock = std::chrono::steady_clock;

// Sends `bytes` with `fds` attached to the first of them; what the socket did not take at once is
// sent after, without descriptors (a stream socket delivers them with the bytes they came with,
// in order).
Status sendChunk(int socket, const uint8_t* bytes, size_t size, std::span<const int> fds) {
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFdsPerMessage * sizeof(int))];
  size_t sent = 0;
  while (sent < size) {
    iovec iov{const_cast<uint8_t*>(bytes + sent), size - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (sent == 0 && !fds.empty()) {
      std::memset(control, 0, sizeof control);
      msg.msg_control = control;
      msg.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
      std::memcpy(CMSG_DATA(c), fds.data(), fds.size() * sizeof(int));
    }
    const ssize_t n = ::sendmsg(socket, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return makeError(ErrorCode::kUnavailable, "cannot send the pool's descriptors: ",
                       n < 0 ? std::strerror(errno) : "the socket took nothing");
    }
    sent += static_cast<size_t>(n);
  }
  return {};
}

}  // namespace

Status sendReply(int socket, ReplyStatus status, std::span<const ExtentFd> extents) {
  if (status != ReplyStatus::kAccepted) extents = {};
  if (extents.size() > kMaxExtents) {
    return makeError(ErrorCode::kInternal, "a pool of ", extents.size(), " extents is over the ",
                     kMaxExtents, " a reply may name");
  }
  std::vector<uint8_t> bytes(sizeof(ReplyHeader) + extents.size() * sizeof(Extent));
  const ReplyHeader header{static_cast<uint32_t>(status), static_cast<uint32_t>(extents.size())};
  std::memcpy(bytes.data(), &header, sizeof header);
  std::vector<int> fds;
  for (size_t i = 0; i < extents.size(); ++i) {
    const Extent e{extents[i].id, 0, extents[i].bytes};
    std::memcpy(bytes.data() + sizeof header + i * sizeof e, &e, sizeof e);
    fds.push_back(extents[i].fd);
  }
  // The header goes with the first chunk; each chunk carries its extents' descriptors.
  size_t from = 0;
  size_t next = 0;  // the next extent to send
  do {
    const size_t count = std::min(kMaxFdsPerMessage, extents.size() - next);
    const size_t to = sizeof header + (next + count) * sizeof(Extent);
    if (auto s = sendChunk(socket, bytes.data() + from, to - from,
                           std::span<const int>(fds).subspan(next, count));
        !s) {
      return s;
    }
    from = to;
    next += count;
  } while (next < extents.size());
  return {};
}

Result<std::vector<ReceivedExtent>> receiveReply(int socket, std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  std::vector<uint8_t> bytes;
  std::vector<kj::AutoCloseFd> fds;
  size_t want = sizeof(ReplyHeader);
  bool headerRead = false;
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFdsPerMessage * sizeof(int))];
  while (bytes.size() < want) {
    if (!waitReadable(socket, deadline)) {
      return makeError(ErrorCode::kUnavailable,
                       "kvtierd did not send the pool's descriptors within ", timeout.count(),
                       " ms");
    }
    uint8_t buffer[4096];
    iovec iov{buffer, std::min(sizeof buffer, want - bytes.size())};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n < 0) {
      return makeError(ErrorCode::kUnavailable,
                       "reading the pool's descriptors: ", std::strerror(errno));
    }
    // Descriptors first: whatever came is owned (and closed on error) before anything is checked.
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int fd;
        std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        fds.emplace_back(fd);
      }
    }
    if (msg.msg_flags & MSG_CTRUNC) {
      return makeError(ErrorCode::kProtocolMismatch, "kvtierd sent more descriptors at once than ",
                       kMaxFdsPerMessage);
    }
    if (n == 0) {
      return makeError(ErrorCode::kUnavailable,
                       "kvtierd closed the connection before the pool's descriptors");
    }
    bytes.insert(bytes.end(), buffer, buffer + n);
    if (!headerRead && bytes.size() >= sizeof(ReplyHeader)) {
      headerRead = true;
      ReplyHeader header;
      std::memcpy(&header, bytes.data(), sizeof header);
      if (header.status == static_cast<uint32_t>(ReplyStatus::kRefused)) {
        return makeError(ErrorCode::kPermissionDenied,
                         "kvtierd hands the pool's descriptors to its own user and root only");
      }
      if (header.status != static_cast<uint32_t>(ReplyStatus::kAccepted)) {
        return makeError(ErrorCode::kProtocolMismatch,
                         "kvtierd refused the pool descriptor request (status ", header.status,
                         ")");
      }
      if (header.extents > kMaxExtents) {
        return makeError(ErrorCode::kProtocolMismatch, "kvtierd names ", header.extents,
                         " extents, over the bound of ", kMaxExtents);
      }
      want = sizeof(ReplyHeader) + size_t{header.extents} * sizeof(Extent);
    }
  }
  const size_t count = (want - sizeof(ReplyHeader)) / sizeof(Extent);
  if (fds.size() != count) {
    return makeError(ErrorCode::kProtocolMismatch, "kvtierd sent ", fds.size(), " descriptors for ",
                     count, " extents");
  }
  std::vector<ReceivedExtent> out;
  for (size_t i = 0; i < count; ++i) {
    Extent e;
    std::memcpy(&e, bytes.data() + sizeof(ReplyHeader) + i * sizeof e, sizeof e);
    out.push_back({e.id, e.bytes, kj::mv(fds[i])});
  }
  return out;
}

Result<std::vector<ReceivedExtent>> request(const std::string& socketPath,
                                            std::chrono::milliseconds timeout) {
  auto fd = connectUnixSocket(socketPath, Clock::now() + timeout);
  if (!fd) return fd.error();
  const Request req;
  if (::send(fd->get(), &req, sizeof req, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof req)) {
    return makeError(ErrorCode::kUnavailable,
                     "cannot ask kvtierd for the pool's descriptors: ", std::strerror(errno));
  }
  return receiveReply(fd->get(), timeout);
}

}  // namespace kvtier::pool_fds
