#include "transport/buffered_stream.h"

#include <algorithm>
#include <cstring>

namespace kvtier {

BufferedIoStream::BufferedIoStream(kj::Own<kj::AsyncIoStream> inner, BusyPoller* poller,
                                   size_t bufferBytes)
    : inner_(kj::mv(inner)), poller_(poller), buffer_(kj::heapArray<kj::byte>(bufferBytes)) {}

kj::Promise<size_t> BufferedIoStream::tryRead(void* buffer, size_t minBytes, size_t maxBytes) {
  auto* dst = static_cast<kj::byte*>(buffer);
  const size_t buffered = std::min(maxBytes, end_ - begin_);
  // memcpy wants valid pointers even for 0 bytes, and a reader may pass none for an empty read
  // (capnp does, for a message that declares an empty segment).
  if (buffered > 0) std::memcpy(dst, buffer_.begin() + begin_, buffered);
  begin_ += buffered;
  if (buffered >= minBytes) return buffered;
  dst += buffered;
  minBytes -= buffered;
  maxBytes -= buffered;
  if (maxBytes >= buffer_.size()) {
    // Large reads (inline KV) go straight into the caller's memory.
    return inner_->tryRead(dst, minBytes, maxBytes).then([this, buffered](size_t n) {
      if (n > 0) arrived();
      return buffered + n;
    });
  }
  return inner_->tryRead(buffer_.begin(), minBytes, buffer_.size())
      .then([this, dst, maxBytes, buffered](size_t n) {
        if (n > 0) arrived();
        const size_t take = std::min(n, maxBytes);
        if (take > 0) std::memcpy(dst, buffer_.begin(), take);
        begin_ = take;
        end_ = n;
        return buffered + take;
      });
}

}  // namespace kvtier
