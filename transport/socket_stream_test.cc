#include "transport/socket_stream.h"

#include <gtest/gtest.h>
#include <kj/debug.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace kvtier {
namespace {

struct SocketPair {
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = kj::AutoCloseFd(fds[0]);
    b = kj::AutoCloseFd(fds[1]);
  }
  kj::AutoCloseFd a, b;
};

std::vector<kj::byte> pattern(size_t n, uint32_t seed) {
  std::vector<kj::byte> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<kj::byte>((i * 2654435761u + seed) >> 13);
  return out;
}

// Reads `bytes` bytes from `from` while `writing` goes on, both bounded (a lost readiness edge
// would hang: bounded, it fails instead), and returns them.
std::vector<kj::byte> receive(kj::AsyncIoContext& io, SocketStream& from, size_t bytes,
                              kj::Promise<void> writing) {
  std::vector<kj::byte> got(bytes);
  auto reading = from.read(got.data(), got.size(), got.size());
  auto& timer = io.provider->getTimer();
  timer.timeoutAfter(10 * kj::SECONDS, kj::mv(writing)).wait(io.waitScope);
  EXPECT_EQ(timer.timeoutAfter(10 * kj::SECONDS, kj::mv(reading)).wait(io.waitScope), got.size());
  return got;
}

TEST(SocketStream, BytesWrittenInPiecesArriveWholeAndInOrder) {
  auto io = kj::setupAsyncIo();
  SocketPair p;
  SocketStream left(io.unixEventPort, kj::mv(p.a));
  SocketStream right(io.unixEventPort, kj::mv(p.b));
  const auto one = pattern(100, 1), two = pattern(7, 2), three = pattern(4000, 3);
  const kj::ArrayPtr<const kj::byte> pieces[] = {
      kj::arrayPtr(one.data(), one.size()), kj::arrayPtr(two.data(), 0),
      kj::arrayPtr(two.data(), two.size()), kj::arrayPtr(three.data(), three.size())};
  left.write(kj::arrayPtr(pieces, 4)).wait(io.waitScope);
  left.write(one.data(), one.size()).wait(io.waitScope);

  std::vector<kj::byte> got(one.size() + two.size() + three.size() + one.size());
  EXPECT_EQ(right.read(got.data(), got.size(), got.size()).wait(io.waitScope), got.size());
  std::vector<kj::byte> want;
  for (const auto* v : {&one, &two, &three, &one}) want.insert(want.end(), v->begin(), v->end());
  EXPECT_EQ(got, want);
}

TEST(SocketStream, AWriteLargerThanTheSocketBufferWaitsForRoomAndArrivesWhole) {
  auto io = kj::setupAsyncIo();
  SocketPair p;
  SocketStream left(io.unixEventPort, kj::mv(p.a));
  SocketStream right(io.unixEventPort, kj::mv(p.b));
  const auto sent = pattern(16 << 20, 7);  // far beyond a Unix socket's buffer
  EXPECT_TRUE(receive(io, right, sent.size(), left.write(sent.data(), sent.size())) == sent);
}

TEST(SocketStream, APieceListNeedNotOutliveAWriteThatWaitsForRoom) {
  auto io = kj::setupAsyncIo();
  SocketPair p;
  SocketStream left(io.unixEventPort, kj::mv(p.a));
  SocketStream right(io.unixEventPort, kj::mv(p.b));
  const auto one = pattern(5 << 20, 21), two = pattern(6 << 20, 22);
  kj::Promise<void> writing = nullptr;
  {
    // Gone once write() returns (KJ's contract keeps only the bytes alive).
    const kj::ArrayPtr<const kj::byte> pieces[] = {kj::arrayPtr(one.data(), one.size()),
                                                   kj::arrayPtr(two.data(), 0),
                                                   kj::arrayPtr(two.data(), two.size())};
    writing = left.write(kj::arrayPtr(pieces, 3));
  }
  std::vector<kj::byte> want(one);
  want.insert(want.end(), two.begin(), two.end());
  EXPECT_TRUE(receive(io, right, want.size(), kj::mv(writing)) == want);
}

TEST(SocketStream, AWriteAfterACancelledBlockedOneCanWaitForRoomAgain) {
  auto io = kj::setupAsyncIo();
  auto& timer = io.provider->getTimer();
  SocketPair p;
  SocketStream left(io.unixEventPort, kj::mv(p.a));
  const auto big = pattern(16 << 20, 8);
  {
    auto blocked = left.write(big.data(), big.size());
    EXPECT_FALSE(blocked.poll(io.waitScope));  // the socket is full: it waits for room
  }                                            // cancelled while waiting
  // Another large write, drained by a reader: it must be able to wait for room again.
  std::atomic<size_t> drained{0};
  std::thread reader([&] {
    std::vector<kj::byte> buffer(1 << 16);
    for (;;) {
      const ssize_t n = ::read(p.b.get(), buffer.data(), buffer.size());
      if (n <= 0) return;
      drained += static_cast<size_t>(n);
    }
  });
  KJ_IF_MAYBE (e, kj::runCatchingExceptions([&] {
                 timer.timeoutAfter(10 * kj::SECONDS, left.write(big.data(), big.size()))
                     .wait(io.waitScope);
               })) {
    ADD_FAILURE() << e->getDescription().cStr();
  }
  left.shutdownWrite();  // the reader sees the end
  reader.join();
  EXPECT_GE(drained.load(), big.size());
}

TEST(SocketStream, EveryWhenWriteDisconnectedPromiseResolvesWhenThePeerCloses) {
  auto io = kj::setupAsyncIo();
  auto& timer = io.provider->getTimer();
  SocketPair p;
  SocketStream left(io.unixEventPort, kj::mv(p.a));
  auto first = left.whenWriteDisconnected();
  auto second = left.whenWriteDisconnected();  // does not cancel the first
  EXPECT_FALSE(first.poll(io.waitScope));
  p.b = nullptr;
  timer.timeoutAfter(10 * kj::SECONDS, kj::mv(first)).wait(io.waitScope);
  timer.timeoutAfter(10 * kj::SECONDS, kj::mv(second)).wait(io.waitScope);
}

TEST(SocketStream, APeerThatClosesEndsTheStream) {
  auto io = kj::setupAsyncIo();
  SocketPair p;
  SocketStream left(io.unixEventPort, kj::mv(p.a));
  const auto last = pattern(10, 9);
  ASSERT_EQ(::write(p.b.get(), last.data(), last.size()), ssize_t(last.size()));
  p.b = nullptr;
  kj::byte buffer[64];
  // What was sent before the close is read; then a read finds the end (fewer than asked, 0).
  EXPECT_EQ(left.tryRead(buffer, sizeof buffer, sizeof buffer).wait(io.waitScope), last.size());
  EXPECT_EQ(std::memcmp(buffer, last.data(), last.size()), 0);
  EXPECT_EQ(left.tryRead(buffer, 1, sizeof buffer).wait(io.waitScope), 0u);
}

TEST(SocketStream, WritingToAVanishedPeerIsDisconnectedNotSigpipe) {
  auto io = kj::setupAsyncIo();
  SocketPair p;
  SocketStream left(io.unixEventPort, kj::mv(p.a));
  p.b = nullptr;
  const auto bytes = pattern(1000, 4);
  // With SIGPIPE's default action this process would die here.
  KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                      [&] { left.write(bytes.data(), bytes.size()).wait(io.waitScope); })) {
    EXPECT_EQ(e->getType(), kj::Exception::Type::DISCONNECTED) << e->getDescription().cStr();
  } else {
    ADD_FAILURE() << "a write to a closed peer succeeded";
  }
}

TEST(SocketStream, ReportsItsSocketsOptionsAndDescriptor) {
  auto io = kj::setupAsyncIo();
  SocketPair p;
  const int fd = p.a.get();
  SocketStream left(io.unixEventPort, kj::mv(p.a));
  EXPECT_EQ(KJ_ASSERT_NONNULL(left.getFd()), fd);
  struct ucred cred {};
  kj::uint length = sizeof cred;
  left.getsockopt(SOL_SOCKET, SO_PEERCRED, &cred, &length);  // what kvtierd asks of a client
  EXPECT_EQ(cred.pid, ::getpid());
}

TEST(ReadWatchedSocket, ReplacesAKjSocketStreamAndLeavesOthersAlone) {
  auto io = kj::setupAsyncIo();
  SocketPair p;
  auto kjStream =
      io.lowLevelProvider->wrapSocketFd(p.a.release(), kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
  auto stream = readWatchedSocket(io.unixEventPort, kj::mv(kjStream));
  // A duplicate descriptor of the same socket, the KJ stream's own closed (and maybe reused).
  EXPECT_NE(dynamic_cast<SocketStream*>(stream.get()), nullptr);
  EXPECT_NE(KJ_ASSERT_NONNULL(stream->getFd()), -1);
  const auto bytes = pattern(32, 5);
  stream->write(bytes.data(), bytes.size()).wait(io.waitScope);
  std::vector<kj::byte> got(bytes.size());
  ASSERT_EQ(::read(p.b.get(), got.data(), got.size()), ssize_t(got.size()));
  EXPECT_EQ(got, bytes);

  // A stream with no descriptor (an in-process pipe) comes back as it is.
  auto pipe = kj::newTwoWayPipe();
  kj::AsyncIoStream* before = pipe.ends[0].get();
  auto same = readWatchedSocket(io.unixEventPort, kj::mv(pipe.ends[0]));
  EXPECT_EQ(same.get(), before);
}

// The voluntary context switches of thread `tid` so far (each is the thread going to sleep).
long voluntarySwitches(pid_t tid) {
  std::ifstream status("/proc/self/task/" + std::to_string(tid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("voluntary_ctxt_switches:", 0) == 0) return std::stol(line.substr(24));
  }
  return -1;
}

// A thread sends a request on its stream and sleeps in its event loop for the answer; this
// thread reads the request and, only later, answers. Returns how many times the waiting thread
// went back to sleep while the request was being read: each one a wake-up for nothing.
long wakeUpsWhileThePeerReads(bool kjStream) {
  SocketPair p;
  std::atomic<pid_t> tid{0};
  std::atomic<bool> waiting{false};
  std::thread asker([&] {
    auto io = kj::setupAsyncIo();
    kj::Own<kj::AsyncIoStream> stream =
        kjStream ? io.lowLevelProvider->wrapSocketFd(p.a.release(),
                                                     kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP)
                 : kj::heap<SocketStream>(io.unixEventPort, kj::mv(p.a));
    tid = static_cast<pid_t>(::syscall(SYS_gettid));
    const auto request = pattern(64, 11);
    stream->write(request.data(), request.size()).wait(io.waitScope);
    kj::byte answer[8];
    auto reading = stream->read(answer, sizeof answer);
    waiting = true;
    reading.wait(io.waitScope);
  });
  while (!waiting) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // asleep in epoll_wait by now
  const long before = voluntarySwitches(tid);
  kj::byte request[64];
  EXPECT_EQ(::read(p.b.get(), request, sizeof request), ssize_t(sizeof request));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const long after = voluntarySwitches(tid);
  const kj::byte answer[8] = {};
  EXPECT_EQ(::write(p.b.get(), answer, sizeof answer), ssize_t(sizeof answer));
  asker.join();
  return after - before;
}

TEST(SocketStream, APeerReadingTheRequestDoesNotWakeTheThreadWaitingForTheAnswer) {
  // On Linux a Unix socket's reader raises EPOLLOUT at the writer, which wakes a KJ socket
  // stream's loop (it watches reading and writing at once). Where the kernel does not, there is
  // nothing to show.
  if (wakeUpsWhileThePeerReads(true) == 0) {
    GTEST_SKIP() << "this kernel does not wake a writer's epoll when its peer reads";
  }
  EXPECT_EQ(wakeUpsWhileThePeerReads(false), 0);
}

}  // namespace
}  // namespace kvtier
