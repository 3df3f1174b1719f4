#include "transport/socket_stream.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <iterator>

#include <kj/debug.h>

namespace kvtier {
namespace {

using FdObserver = kj::UnixEventPort::FdObserver;

// A failed socket call as KJ reports it: a peer that is gone is DISCONNECTED, anything else FAILED.
kj::Exception socketError(int error, const char* call) {
  const bool gone = error == ECONNRESET || error == EPIPE || error == ENOTCONN ||
                    error == ESHUTDOWN || error == ECONNABORTED;
  return kj::Exception(gone ? kj::Exception::Type::DISCONNECTED : kj::Exception::Type::FAILED,
                       __FILE__, __LINE__, kj::str(call, ": ", std::strerror(error)));
}

int nonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0 && (flags & O_NONBLOCK) == 0) (void)::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  return fd;
}

}  // namespace

SocketStream::SocketStream(kj::UnixEventPort& port, kj::AutoCloseFd fd)
    : port_(port),
      fd_(kj::mv(fd)),
      readObserver_(port, nonBlocking(fd_.get()), FdObserver::OBSERVE_READ) {}

SocketStream::~SocketStream() noexcept(false) {
  // Stop watching before the descriptors close.
  writeObserver_ = nullptr;
  writeFd_ = nullptr;
  writeDisconnected_ = nullptr;
}

kj::Promise<size_t> SocketStream::tryRead(void* buffer, size_t minBytes, size_t maxBytes) {
  return readMore(static_cast<kj::byte*>(buffer), minBytes, maxBytes, 0);
}

kj::Promise<size_t> SocketStream::readMore(kj::byte* buffer, size_t minBytes, size_t maxBytes,
                                           size_t done) {
  for (;;) {
    const ssize_t n = ::read(fd_.get(), buffer, maxBytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return socketError(errno, "read");
      return readObserver_.whenBecomesReadable().then(
          [=, this]() { return readMore(buffer, minBytes, maxBytes, done); });
    }
    if (n == 0) return done;  // the peer closed: fewer than minBytes
    const size_t got = static_cast<size_t>(n);
    done += got;
    if (got >= minBytes) return done;
    buffer += got;
    minBytes -= got;
    maxBytes -= got;
  }
}

kj::Promise<void> SocketStream::write(const void* buffer, size_t size) {
  const kj::ArrayPtr<const kj::byte> piece(static_cast<const kj::byte*>(buffer), size);
  return writeFrom(kj::arrayPtr(&piece, 1), 0, 0, nullptr);
}

kj::Promise<void> SocketStream::write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) {
  return writeFrom(pieces, 0, 0, nullptr);
}

kj::Promise<void> SocketStream::writeFrom(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces,
                                          size_t next, size_t offset,
                                          kj::Array<kj::ArrayPtr<const kj::byte>> owned) {
  for (;;) {
    while (next < pieces.size() && offset == pieces[next].size()) {
      ++next;
      offset = 0;
    }
    if (next == pieces.size()) return kj::READY_NOW;
    struct iovec iov[64];
    size_t count = 0;
    for (size_t i = next; i < pieces.size() && count < std::size(iov); ++i) {
      const size_t skip = i == next ? offset : 0;
      if (pieces[i].size() == skip) continue;
      iov[count].iov_base = const_cast<kj::byte*>(pieces[i].begin() + skip);
      iov[count].iov_len = pieces[i].size() - skip;
      ++count;
    }
    struct msghdr message {};
    message.msg_iov = iov;
    message.msg_iovlen = count;
    const ssize_t n = ::sendmsg(fd_.get(), &message, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return socketError(errno, "sendmsg");
      // Waiting: the pieces left are copied, unless they already were (the caller's list, and
      // write()'s one piece on the stack, need not outlive this call; the bytes do).
      if (owned == nullptr) {
        owned = kj::heapArray(pieces.slice(next, pieces.size()));
        next = 0;
      }
      return whenWritable().then([this, owned = kj::mv(owned), next, offset]() mutable {
        const auto left = owned.asPtr();
        return writeFrom(left, next, offset, kj::mv(owned));
      });
    }
    // Advance past what went out.
    size_t sent = static_cast<size_t>(n);
    while (sent > 0) {
      const size_t left = pieces[next].size() - offset;
      if (sent < left) {
        offset += sent;
        sent = 0;
      } else {
        sent -= left;
        ++next;
        offset = 0;
      }
    }
  }
}

kj::Promise<void> SocketStream::whenWritable() {
  // A wait left by a cancelled write goes first: one registration per descriptor.
  writeObserver_ = nullptr;
  writeFd_ = nullptr;
  const int dup = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
  if (dup < 0) return socketError(errno, "dup");
  writeFd_ = kj::AutoCloseFd(dup);
  // Registered now, watched until writable, then unregistered and closed again: no EPOLLOUT
  // wake-ups and no second descriptor while nothing waits to write. (Registering reports a socket
  // already writable at once.)
  writeObserver_ = kj::heap<FdObserver>(port_, writeFd_.get(), FdObserver::OBSERVE_WRITE);
  return writeObserver_->whenBecomesWritable().then([this]() {
    writeObserver_ = nullptr;
    writeFd_ = nullptr;
  });
}

kj::Promise<void> SocketStream::whenWriteDisconnected() {
  // May be called again without cancelling earlier promises: every caller gets a branch.
  KJ_IF_MAYBE (forked, writeDisconnected_) return forked->addBranch();
  auto forked = readObserver_.whenWriteDisconnected().fork();
  auto branch = forked.addBranch();
  writeDisconnected_ = kj::mv(forked);
  return branch;
}

void SocketStream::shutdownWrite() { KJ_SYSCALL(::shutdown(fd_.get(), SHUT_WR)); }

void SocketStream::abortRead() { (void)::shutdown(fd_.get(), SHUT_RD); }

void SocketStream::getsockopt(int level, int option, void* value, kj::uint* length) {
  socklen_t n = *length;
  KJ_SYSCALL(::getsockopt(fd_.get(), level, option, value, &n));
  *length = n;
}

void SocketStream::setsockopt(int level, int option, const void* value, kj::uint length) {
  KJ_SYSCALL(::setsockopt(fd_.get(), level, option, value, length));
}

void SocketStream::getsockname(struct sockaddr* addr, kj::uint* length) {
  socklen_t n = *length;
  KJ_SYSCALL(::getsockname(fd_.get(), addr, &n));
  *length = n;
}

void SocketStream::getpeername(struct sockaddr* addr, kj::uint* length) {
  socklen_t n = *length;
  KJ_SYSCALL(::getpeername(fd_.get(), addr, &n));
  *length = n;
}

kj::Own<kj::AsyncIoStream> readWatchedSocket(kj::UnixEventPort& port,
                                             kj::Own<kj::AsyncIoStream> stream) {
  KJ_IF_MAYBE (fd, stream->getFd()) {
    const int dup = ::fcntl(*fd, F_DUPFD_CLOEXEC, 0);
    if (dup < 0) return stream;
    stream = nullptr;  // stops KJ's watch and closes its descriptor; the socket stays open
    return kj::heap<SocketStream>(port, kj::AutoCloseFd(dup));
  }
  return stream;
}

}  // namespace kvtier
