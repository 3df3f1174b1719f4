#include "transport/unix_connect.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvtier {

using Clock = std::chrono::steady_clock;

Result<kj::AutoCloseFd> connectUnixSocket(const std::string& path, Clock::time_point deadline) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof addr.sun_path) {
    return makeError(ErrorCode::kInvalidArgument, "socket path too long: ", path);
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  // Non-blocking while it connects, blocking after.
  const int raw = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (raw < 0) return makeError(ErrorCode::kUnavailable, "socket: ", std::strerror(errno));
  kj::AutoCloseFd fd(raw);
  while (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    if ((errno == EAGAIN || errno == EINTR) && Clock::now() < deadline) {
      ::usleep(1000);  // a full backlog: no event says when it has room
      continue;
    }
    return makeError(ErrorCode::kUnavailable, "connect ", path, ": ",
                     errno == EAGAIN ? "the daemon's backlog stayed full" : std::strerror(errno));
  }
  if (::fcntl(fd.get(), F_SETFL, ::fcntl(fd.get(), F_GETFL) & ~O_NONBLOCK) != 0) {
    return makeError(ErrorCode::kUnavailable, "fcntl: ", std::strerror(errno));
  }
  return fd;
}

bool waitReadable(int fd, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left) + 1);
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

}  // namespace kvtier
