#include "client/lane.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "transport/unix_connect.h"

namespace kvtier {

namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

Result<std::shared_ptr<ClientLane>> ClientLane::attach(const std::string& socketPath,
                                                       std::span<const uint8_t> token,
                                                       std::chrono::microseconds busyPoll,
                                                       std::chrono::milliseconds timeout) {
  if (token.size() != lane::kTokenBytes) {
    return makeError(ErrorCode::kProtocolMismatch, "lane token of ", token.size(), " bytes");
  }
  const auto deadline = Clock::now() + timeout;
  auto connected = connectUnixSocket(socketPath, deadline);
  if (!connected) return connected.error();
  const int fd = connected->release();
  std::shared_ptr<ClientLane> lane(new ClientLane(fd, busyPoll));
  lane::Attach hello;
  std::memcpy(hello.token, token.data(), token.size());
  std::vector<uint8_t> bytes(sizeof hello);
  std::memcpy(bytes.data(), &hello, sizeof hello);
  std::lock_guard lock(lane->mutex_);
  if (!lane->sendAll(bytes)) {
    return makeError(ErrorCode::kUnavailable, "the daemon closed the lane before its attach");
  }
  uint32_t status = 1;
  size_t got = 0;
  while (got < sizeof status) {
    if (!waitReadable(fd, deadline)) {
      return makeError(ErrorCode::kUnavailable, "the daemon did not accept the lane within ",
                       timeout.count(), " ms");
    }
    const ssize_t n = ::recv(fd, reinterpret_cast<uint8_t*>(&status) + got, sizeof status - got, 0);
    if (n == 0) return makeError(ErrorCode::kUnavailable, "the daemon refused the lane");
    if (n < 0 && errno != EINTR) {
      return makeError(ErrorCode::kUnavailable, "lane attach: ", std::strerror(errno));
    }
    if (n > 0) got += static_cast<size_t>(n);
  }
  if (status != static_cast<uint32_t>(lane::AttachStatus::kAccepted)) {
    return makeError(ErrorCode::kUnavailable, "the daemon refused the lane (", status, ")");
  }
  return lane;
}

ClientLane::ClientLane(int fd, std::chrono::microseconds busyPoll)
    : fd_(fd), pid_(::getpid()), answers_(busyPoll) {}

ClientLane::~ClientLane() { ::close(fd_); }

bool ClientLane::usable() const { return !ended() && ::getpid() == pid_; }

bool ClientLane::sendAll(const std::vector<uint8_t>& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && errno != EINTR) {
      return false;
    }
  }
  return true;
}

bool ClientLane::fill(size_t want, bool poll) {
  // Reads until `want` unconsumed bytes are buffered; while `poll`, without sleeping for up to the
  // busy-poll window.
  const auto deadline = Clock::now() + answers_.window();
  while (in_.size() - inBegin_ < want) {
    if (inBegin_ > 0) {
      in_.erase(in_.begin(), in_.begin() + static_cast<ptrdiff_t>(inBegin_));
      inBegin_ = 0;
    }
    const size_t have = in_.size();
    in_.resize(std::max(have + 4096, want));
    const int flags = poll ? MSG_DONTWAIT : 0;
    const ssize_t n = ::recv(fd_, in_.data() + have, in_.size() - have, flags);
    in_.resize(have + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    if (n > 0) continue;
    if (n == 0) return false;  // the daemon ended the lane
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (Clock::now() >= deadline) poll = false;
  }
  return true;
}

bool ClientLane::receive(uint16_t op, uint64_t id, std::vector<uint8_t>& body) {
  const uint16_t want = static_cast<uint16_t>(op | lane::kReply);
  if (auto early = early_.find(id); early != early_.end()) {
    if (early->second.first != want) return false;
    body = std::move(early->second.second);
    early_.erase(early);
    answered(id);
    return true;
  }
  bool poll = answers_.hot();
  for (;;) {
    if (!fill(sizeof(lane::Header), poll)) return false;
    lane::Header h;
    std::memcpy(&h, in_.data() + inBegin_, sizeof h);
    // An answer to a request never sent, or a second answer to one, cannot be trusted.
    if (!lane::checkHeader(h) || (h.op & lane::kReply) == 0 || h.id == 0 || h.id >= nextId_ ||
        early_.count(h.id)) {
      return false;
    }
    inBegin_ += sizeof h;
    if (!fill(h.bodyBytes, poll)) return false;
    std::vector<uint8_t> got(in_.begin() + static_cast<ptrdiff_t>(inBegin_),
                             in_.begin() + static_cast<ptrdiff_t>(inBegin_ + h.bodyBytes));
    inBegin_ += h.bodyBytes;
    if (h.id == id) {
      if (h.op != want) return false;
      body = std::move(got);
      break;
    }
    early_.emplace(h.id, std::make_pair(h.op, std::move(got)));
  }
  answers_.arrived();
  answered(id);
  return true;
}

void ClientLane::answered(uint64_t id) {
  // The daemon serves a lane's frames in the order they come, one-way frames at once: an answer
  // to a request sent after the last release or abort means every one of them has been served.
  // (An answer to an earlier request, still in flight in a batch, does not.)
  if (id > oneWayAfter_) unsynced_.store(false, std::memory_order_relaxed);
}

void ClientLane::sentOneWay() {
  oneWayAfter_ = nextId_ - 1;
  unsynced_.store(true, std::memory_order_relaxed);
}

void ClientLane::appendPendingReleases(std::vector<uint8_t>& out) {
  std::vector<uint64_t> releases, aborts;
  {
    std::lock_guard lock(releasesMutex_);
    releases.swap(releases_);
    aborts.swap(aborts_);
  }
  if (!releases.empty()) lane::appendRelease(out, releases);
  if (!aborts.empty()) lane::appendAbort(out, aborts);
  if (!releases.empty() || !aborts.empty()) sentOneWay();
}

void ClientLane::sendPendingReleases() {
  std::vector<uint8_t> out;
  appendPendingReleases(out);
  if (out.empty()) return;
  if (!sendAll(out)) return endLane();
}

void ClientLane::endLane() { ended_.store(true, std::memory_order_relaxed); }

template <typename Reply, typename Append, typename Decode>
std::optional<Result<Reply>> ClientLane::exchange(uint16_t op, Append append, Decode decode) {
  std::vector<uint8_t> out;
  appendPendingReleases(out);
  const uint64_t id = nextId_++;
  append(out, id);
  std::vector<uint8_t> body;
  if (!sendAll(out) || !receive(op, id, body)) {
    endLane();
    return std::nullopt;
  }
  auto reply = decode(std::span<const uint8_t>(body));
  // A malformed answer (not the daemon's typed error) ends the lane: any lease it granted stays
  // pinned until the client closes.
  if (!reply) {
    endLane();
    return std::nullopt;
  }
  return std::move(reply).value();
}

template <typename Reply, typename Append, typename Decode>
std::optional<Result<Reply>> ClientLane::tryExchange(uint16_t op, Append append, Decode decode) {
  std::optional<Result<Reply>> answer;
  {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() || !usable()) return std::nullopt;
    answer = exchange<Reply>(op, append, decode);
  }
  // Releases queued while this call held the lane: their threads left them to this one.
  flushReleases();
  return answer;
}

std::optional<Result<lane::LookupReply>> ClientLane::lookup(uint32_t space, uint32_t remote,
                                                            std::span<const uint32_t> tokens,
                                                            std::span<const Key128> keys) {
  return tryExchange<lane::LookupReply>(
      lane::kLookup,
      [&](std::vector<uint8_t>& out, uint64_t id) {
        lane::appendLookup(out, id, space, remote, tokens, keys);
      },
      lane::decodeLookupReply);
}

std::optional<Result<lane::PutReply>> ClientLane::put(const lane::PutArgs& args) {
  return tryExchange<lane::PutReply>(
      lane::kPut, [&](std::vector<uint8_t>& out, uint64_t id) { lane::appendPut(out, id, args); },
      lane::decodePutReply);
}

Result<lane::CommitReply> ClientLane::commit(uint64_t lease, uint64_t upTo,
                                             std::span<const uint64_t> sums) {
  std::optional<Result<lane::CommitReply>> answer;
  {
    std::unique_lock lock(mutex_);
    if (usable()) {
      answer = exchange<lane::CommitReply>(
          lane::kCommit,
          [&](std::vector<uint8_t>& out, uint64_t id) {
            lane::appendCommit(out, id, {lease, upTo, {sums.begin(), sums.end()}});
          },
          lane::decodeCommitReply);
    }
  }
  flushReleases();
  if (!answer) {
    return makeError(ErrorCode::kUnavailable,
                     "the fast lane ended before the commit: its write lease is lost");
  }
  return std::move(*answer);
}

std::optional<std::vector<Result<lane::CommitReply>>> ClientLane::putMany(
    std::span<const lane::PutArgs> items, const WriteGrant& write) {
  const size_t n = items.size();
  std::vector<Result<lane::CommitReply>> results;
  results.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    results.push_back(makeError(ErrorCode::kUnavailable, "the fast lane ended before this put"));
  }
  {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() || !usable()) return std::nullopt;
    std::vector<uint64_t> putIds(n, 0), commitIds(n, 0), sums;
    std::vector<uint8_t> out;
    appendPendingReleases(out);
    const auto sendPut = [&](size_t i) {
      putIds[i] = nextId_++;
      lane::appendPut(out, putIds[i], items[i]);
    };
    const auto flush = [&] {
      const bool sent = out.empty() || sendAll(out);
      out.clear();
      return sent;
    };
    // The answer to commit `i`, into its result; false ends the lane.
    const auto awaitCommit = [&](size_t i) {
      std::vector<uint8_t> body;
      if (!receive(lane::kCommit, commitIds[i], body)) return false;
      auto reply = lane::decodeCommitReply(body);
      if (!reply) return false;
      results[i] = std::move(reply).value();
      commitIds[i] = 0;
      return true;
    };
    bool alive = true;
    if (n > 0) {
      sendPut(0);
      alive = flush();
    }
    for (size_t i = 0; alive && i < n; ++i) {
      std::vector<uint8_t> body;
      if (!(alive = receive(lane::kPut, putIds[i], body))) break;
      auto grant = lane::decodePutReply(body);
      if (!grant) {
        alive = false;
        break;
      }
      // The daemon grants the next item while this one's bytes are written, unless the next names
      // the same sequence: its put must see this commit.
      const bool overlap = i + 1 < n && items[i + 1].seq != items[i].seq;
      if (overlap) {
        sendPut(i + 1);
        if (!(alive = flush())) break;
      }
      if (!*grant) {
        results[i] = grant->error();
      } else if (Status written = write(i, grant->value(), sums); !written) {
        const uint64_t lease = grant->value().lease;
        lane::appendAbort(out, std::span(&lease, 1));
        sentOneWay();
        results[i] = written.error();
      } else {
        commitIds[i] = nextId_++;
        lane::appendCommit(out, commitIds[i],
                           {grant->value().lease, ~uint64_t{0}, std::move(sums)});
      }
      if (!(alive = flush())) break;
      if (i + 1 < n && !overlap) {
        if (commitIds[i] != 0 && !(alive = awaitCommit(i))) break;
        sendPut(i + 1);
        if (!(alive = flush())) break;
      }
    }
    for (size_t i = 0; alive && i < n; ++i) {
      if (commitIds[i] != 0) alive = awaitCommit(i);
    }
    if (!alive) endLane();
  }
  flushReleases();
  return results;
}

void ClientLane::release(uint64_t lease) {
  if (::getpid() != pid_) return;  // a forked child: the leases are its parent's
  {
    std::lock_guard lock(releasesMutex_);
    releases_.push_back(lease);
  }
  flushReleases();
}

void ClientLane::abort(uint64_t lease) {
  if (::getpid() != pid_) return;
  {
    std::lock_guard lock(releasesMutex_);
    aborts_.push_back(lease);
  }
  flushReleases();
}

void ClientLane::flushReleases() {
  // Sent now unless another thread's call holds the lane: that thread comes here once it has let
  // go of it, and finds what was queued meanwhile.
  for (;;) {
    {
      std::lock_guard lock(releasesMutex_);
      if (releases_.empty() && aborts_.empty()) return;
    }
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock() || !usable()) return;
    sendPendingReleases();
  }
}

void ClientLane::sync() {
  if (::getpid() != pid_) return;
  const auto pending = [this] {
    std::lock_guard lock(releasesMutex_);
    return !releases_.empty() || !aborts_.empty();
  };
  // Nothing to wait for: no release or abort went out since the lane's last answer, and none is
  // queued (one another thread's call left for later).
  if (!unsynced_.load(std::memory_order_relaxed) && !pending()) return;
  {
    std::unique_lock lock(mutex_);
    if (!usable() || (!unsynced_.load(std::memory_order_relaxed) && !pending())) return;
    (void)exchange<bool>(
        lane::kSync, [](std::vector<uint8_t>& out, uint64_t id) { lane::appendSync(out, id); },
        [](std::span<const uint8_t> body) -> Result<Result<bool>> {
          if (!body.empty()) return makeError(ErrorCode::kInvalidArgument, "sync reply body");
          return Result<bool>(true);
        });
  }
  flushReleases();
}

}  // namespace kvtier
