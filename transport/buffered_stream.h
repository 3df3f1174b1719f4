// BufferedIoStream: an AsyncIoStream whose reads are served from a buffer.
//
// Cap'n Proto 0.9 reads each message in two or three small reads (segment table, then segments).
// Over a Unix socket each read is a syscall, and on small VMs a syscall costs microseconds: a
// buffer turns the reads of a message (often of several) into one. Large reads bypass the buffer.
// Writes pass straight through. Reads that return bytes tell an optional BusyPoller that a message
// arrived.
#pragma once

#include <kj/async-io.h>
#include <kj/debug.h>

#include "transport/busy_poll.h"

namespace kvtier {

class BufferedIoStream final : public kj::AsyncIoStream {
 public:
  static constexpr size_t kDefaultBufferBytes = 64 << 10;

  // `poller`, when given, is borrowed and must outlive the stream.
  explicit BufferedIoStream(kj::Own<kj::AsyncIoStream> inner, BusyPoller* poller = nullptr,
                            size_t bufferBytes = kDefaultBufferBytes);

  kj::Promise<size_t> tryRead(void* buffer, size_t minBytes, size_t maxBytes) override;
  // Gives back the last `n` bytes read, for the next read to return again: at most the bytes the
  // last read took from the buffer (a small read; large ones bypass it).
  void unread(size_t n) {
    KJ_REQUIRE(n <= begin_, "unread more than the buffer holds");
    begin_ -= n;
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    return inner_->write(buffer, size);
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    return inner_->write(pieces);
  }
  kj::Promise<void> whenWriteDisconnected() override { return inner_->whenWriteDisconnected(); }
  void shutdownWrite() override { inner_->shutdownWrite(); }
  void abortRead() override { inner_->abortRead(); }
  void getsockopt(int level, int option, void* value, kj::uint* length) override {
    inner_->getsockopt(level, option, value, length);
  }
  void setsockopt(int level, int option, const void* value, kj::uint length) override {
    inner_->setsockopt(level, option, value, length);
  }
  kj::Maybe<int> getFd() const override { return inner_->getFd(); }

 private:
  void arrived() {
    if (poller_ != nullptr) poller_->arrived();
  }

  kj::Own<kj::AsyncIoStream> inner_;
  BusyPoller* poller_;
  kj::Array<kj::byte> buffer_;
  size_t begin_ = 0;  // unread bytes are buffer_[begin_, end_)
  size_t end_ = 0;
};

}  // namespace kvtier
