// SocketStream: a socket stream for the KJ event loop that watches its descriptor for reading only.
//
// KJ's own socket streams register their descriptor with epoll for reading and writing at once
// (edge-triggered EPOLLIN | EPOLLOUT). On a Unix socket every read by the peer frees send-buffer
// space and raises EPOLLOUT, so a thread asleep in its event loop waiting for an answer was woken
// each time the peer read one of its messages, to find nothing to do. The wake-up is a "sync" one:
// the kernel puts the woken thread on the reader's core, where it preempts the reader in the
// middle of the call it just read (kvtierd's event loop, after reading a lookup), and a busy core
// may then give the reader's turn to a background thread until the next tick (measured in
// docs/performance.md: 2-4 ms waits of a runnable event loop under spill). Both ends of every
// kvtier connection paid this, twice per call.
//
// SocketStream asks epoll for readability only. Writability is watched only while a write is
// blocked on a full socket buffer, through a duplicate descriptor registered for that wait alone
// (epoll keys registrations by descriptor, so the duplicate does not disturb the read watch).
// Everything else is KJ's usual contract: tryRead returns at least minBytes unless the peer
// closed; writes complete whole or fail; a vanished peer is a DISCONNECTED exception (never
// SIGPIPE).
#pragma once

#include <kj/async-io.h>
#include <kj/async-unix.h>
#include <kj/io.h>

namespace kvtier {

class SocketStream final : public kj::AsyncIoStream {
 public:
  // Takes `fd`, a connected stream socket (made non-blocking here).
  SocketStream(kj::UnixEventPort& port, kj::AutoCloseFd fd);
  ~SocketStream() noexcept(false);

  kj::Promise<size_t> tryRead(void* buffer, size_t minBytes, size_t maxBytes) override;
  kj::Promise<void> write(const void* buffer, size_t size) override;
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override;
  kj::Promise<void> whenWriteDisconnected() override;
  void shutdownWrite() override;
  void abortRead() override;
  void getsockopt(int level, int option, void* value, kj::uint* length) override;
  void setsockopt(int level, int option, const void* value, kj::uint length) override;
  void getsockname(struct sockaddr* addr, kj::uint* length) override;
  void getpeername(struct sockaddr* addr, kj::uint* length) override;
  kj::Maybe<int> getFd() const override { return fd_.get(); }

 private:
  kj::Promise<size_t> readMore(kj::byte* buffer, size_t minBytes, size_t maxBytes, size_t done);
  // Writes pieces[next..] from `offset` bytes into pieces[next]; waits whenever the socket is full.
  // `owned`, when not null, is the array `pieces` points into (a copy made for an earlier wait).
  kj::Promise<void> writeFrom(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces, size_t next,
                              size_t offset, kj::Array<kj::ArrayPtr<const kj::byte>> owned);
  kj::Promise<void> whenWritable();

  kj::UnixEventPort& port_;
  kj::AutoCloseFd fd_;
  kj::UnixEventPort::FdObserver readObserver_;
  // One watch of the peer hanging up, shared by every whenWriteDisconnected() caller.
  kj::Maybe<kj::ForkedPromise<void>> writeDisconnected_;
  // Only while a write waits for room: a duplicate of fd_ and its watch for writability.
  kj::AutoCloseFd writeFd_;
  kj::Own<kj::UnixEventPort::FdObserver> writeObserver_;
};

// A SocketStream over a duplicate of `stream`'s descriptor, `stream` itself closed. A stream with
// no descriptor, or whose descriptor cannot be duplicated, comes back as it is.
kj::Own<kj::AsyncIoStream> readWatchedSocket(kj::UnixEventPort& port,
                                             kj::Own<kj::AsyncIoStream> stream);

}  // namespace kvtier
