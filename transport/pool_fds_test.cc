#include "transport/pool_fds.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "transport/shm_segment.h"

namespace kvtier::pool_fds {
namespace {

using std::chrono::milliseconds;

// Descriptors open in this process now.
size_t openFds() {
  size_t n = 0;
  if (DIR* dir = ::opendir("/proc/self/fd")) {
    while (dirent* e = ::readdir(dir)) n += e->d_name[0] != '.';
    ::closedir(dir);
  }
  return n;
}

struct SocketPair {
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    daemon = kj::AutoCloseFd(fds[0]);
    client = kj::AutoCloseFd(fds[1]);
  }
  kj::AutoCloseFd daemon, client;
};

// An ordinary memfd of one page whose first bytes say `id`.
kj::AutoCloseFd memfdSaying(uint32_t id) {
  kj::AutoCloseFd fd(::memfd_create("pool-fds-test", MFD_CLOEXEC));
  EXPECT_EQ(::ftruncate(fd.get(), 4096), 0);
  EXPECT_EQ(::pwrite(fd.get(), &id, sizeof id, 0), static_cast<ssize_t>(sizeof id));
  return fd;
}

TEST(PoolFds, EveryExtentArrivesWithItsOwnDescriptorInOrder) {
  // More than fit one message: three messages carry them.
  constexpr uint32_t kCount = 2 * kMaxFdsPerMessage + 5;
  std::vector<kj::AutoCloseFd> files;
  std::vector<ExtentFd> extents;
  for (uint32_t i = 0; i < kCount; ++i) {
    files.push_back(memfdSaying(1000 + i));
    extents.push_back({i + 7, 4096, files.back().get()});
  }
  const size_t before = openFds();
  {
    SocketPair s;
    ASSERT_TRUE(sendReply(s.daemon.get(), ReplyStatus::kAccepted, extents).ok());
    s.daemon = nullptr;
    auto got = receiveReply(s.client.get(), milliseconds(5000));
    ASSERT_TRUE(got.ok()) << got.error();
    ASSERT_EQ(got->size(), kCount);
    for (uint32_t i = 0; i < kCount; ++i) {
      ReceivedExtent& e = (*got)[i];
      EXPECT_EQ(e.id, i + 7);
      EXPECT_EQ(e.bytes, 4096u);
      auto seg = ShmSegment::adopt(kj::mv(e.fd), e.bytes);
      ASSERT_TRUE(seg.ok()) << seg.error();
      uint32_t said = 0;
      std::memcpy(&said, (*seg)->data(), sizeof said);
      EXPECT_EQ(said, 1000 + i) << "extent " << i << " came with another's descriptor";
    }
  }
  EXPECT_EQ(openFds(), before);  // every received descriptor was closed
}

TEST(PoolFds, ARefusalIsPermissionDeniedAndCarriesNoDescriptor) {
  auto file = memfdSaying(1);
  const ExtentFd extent{0, 4096, file.get()};
  SocketPair s;
  ASSERT_TRUE(sendReply(s.daemon.get(), ReplyStatus::kRefused, {&extent, 1}).ok());
  auto got = receiveReply(s.client.get(), milliseconds(5000));
  EXPECT_EQ(got.code(), ErrorCode::kPermissionDenied);
}

TEST(PoolFds, AnEmptyPoolIsAnEmptyAnswer) {
  SocketPair s;
  ASSERT_TRUE(sendReply(s.daemon.get(), ReplyStatus::kAccepted, {}).ok());
  auto got = receiveReply(s.client.get(), milliseconds(5000));
  ASSERT_TRUE(got.ok()) << got.error();
  EXPECT_TRUE(got->empty());
}

TEST(PoolFds, AReplyNamingTooManyExtentsIsRefusedBeforeItIsRead) {
  SocketPair s;
  const ReplyHeader header{0, kMaxExtents + 1};
  ASSERT_EQ(::write(s.daemon.get(), &header, sizeof header), static_cast<ssize_t>(sizeof header));
  EXPECT_EQ(receiveReply(s.client.get(), milliseconds(5000)).code(), ErrorCode::kProtocolMismatch);
}

TEST(PoolFds, AReplyShortOfDescriptorsIsRefusedAndLeaksNone) {
  auto file = memfdSaying(1);
  const size_t before = openFds();
  {
    SocketPair s;
    // Two extents named, one descriptor attached.
    const ReplyHeader header{0, 2};
    const Extent extents[2] = {{0, 0, 4096}, {1, 0, 4096}};
    int fd = file.get();
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    iovec iov[2] = {{const_cast<ReplyHeader*>(&header), sizeof header},
                    {const_cast<Extent*>(extents), sizeof extents}};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
    ASSERT_GT(::sendmsg(s.daemon.get(), &msg, 0), 0);
    auto got = receiveReply(s.client.get(), milliseconds(5000));
    EXPECT_EQ(got.code(), ErrorCode::kProtocolMismatch);
  }
  EXPECT_EQ(openFds(), before);
}

// A daemon whose listen backlog is full (it accepts nothing): the request gives up at its deadline
// instead of waiting in connect for as long as the backlog stays full.
TEST(PoolFds, ADaemonThatAcceptsNothingCostsTheDeadlineNotAHang) {
  char dir[] = "/tmp/kvtier-pool-fds-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string path = std::string(dir) + "/sock";
  struct Cleanup {  // also when an assertion below fails
    ~Cleanup() {
      ::unlink(path.c_str());
      ::rmdir(dir);
    }
    const std::string& path;
    const char* dir;
  } cleanup{path, dir};
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size());
  kj::AutoCloseFd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 0), 0);
  // Fill the backlog with connections nobody accepts.
  std::vector<kj::AutoCloseFd> queued;
  for (int i = 0; i < 8; ++i) {
    kj::AutoCloseFd c(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (::connect(c.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) break;
    queued.push_back(kj::mv(c));
  }
  const auto got = request(path, milliseconds(200));
  EXPECT_EQ(got.code(), ErrorCode::kUnavailable);
}

TEST(PoolFds, AConnectionThatEndsMidReplyIsUnavailable) {
  SocketPair s;
  const ReplyHeader header{0, 3};
  ASSERT_EQ(::write(s.daemon.get(), &header, sizeof header), static_cast<ssize_t>(sizeof header));
  s.daemon = nullptr;
  EXPECT_EQ(receiveReply(s.client.get(), milliseconds(5000)).code(), ErrorCode::kUnavailable);
}

}  // namespace
}  // namespace kvtier::pool_fds
