// The SDK's end of a session's fast lane (transport/lane_codec.h; the daemon's end is
// daemon/lane.h): a blocking Unix socket, used from the calling thread (either threading mode),
// one call at a time. A lookup or put that finds the lane busy with another thread's call, or
// ended, or in a forked child, goes over Cap'n Proto instead — the lane is a shortcut, never the
// only way. A write lease the lane granted is committed over the lane.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvtier/error.h"
#include "transport/busy_poll.h"
#include "transport/lane_codec.h"

namespace kvtier {

class ClientLane {
 public:
  // Connects to `socketPath` and attaches with the session's `token`; waits at most `timeout` for
  // the daemon to accept. `busyPoll`: how long a call polls for its answer while calls come within
  // that window of each other (transport/busy_poll.h).
  static Result<std::shared_ptr<ClientLane>> attach(const std::string& socketPath,
                                                    std::span<const uint8_t> token,
                                                    std::chrono::microseconds busyPoll,
                                                    std::chrono::milliseconds timeout);
  ~ClientLane();
  ClientLane(const ClientLane&) = delete;
  ClientLane& operator=(const ClientLane&) = delete;

  // A lookup over the lane: the daemon's answer (or its typed error); nothing when the lane
  // cannot take the call now (another thread's call holds it, it ended, this is a forked child).
  std::optional<Result<lane::LookupReply>> lookup(uint32_t space, uint32_t remote,
                                                  std::span<const uint32_t> tokens,
                                                  std::span<const Key128> keys);
  // A put's write lease over the lane: the daemon's grant (or its typed error); nothing when the
  // lane cannot take the call now, as for lookup.
  std::optional<Result<lane::PutReply>> put(const lane::PutArgs& args);
  // Commits a write lease put() granted. The lease lives on the lane, so this waits for a call
  // another thread has under way; UNAVAILABLE when the lane has ended (the lease with it).
  // `sums`: the writer's block checksums (Engine::commit).
  Result<lane::CommitReply> commit(uint64_t lease, uint64_t upTo, std::span<const uint64_t> sums);
  // Several puts with their commits, pipelined: the next item's PUT goes out before this item's
  // bytes are written (`write` writes them into the grant), so the daemon grants it meanwhile —
  // unless it names the same sequence, whose put must follow this commit. Commits are read as
  // they come. One result per item: the commit's answer, the grant's error, `write`'s error (the
  // lease is then aborted), or UNAVAILABLE for items the lane ended before. Nothing when the lane
  // cannot take the batch now, as for lookup.
  // `write` also gives the checksums the item's commit carries (Engine::commit).
  using WriteGrant =
      std::function<Status(size_t item, const lane::PutReply& grant, std::vector<uint64_t>& sums)>;
  std::optional<std::vector<Result<lane::CommitReply>>> putMany(
      std::span<const lane::PutArgs> items, const WriteGrant& write);
  // Releases a lease a lookup over the lane granted (any thread; does not wait for the daemon).
  void release(uint64_t lease);
  // Ends a write lease put() granted without a trace (any thread; does not wait).
  void abort(uint64_t lease);
  // Before a Cap'n Proto call: returns once the daemon has served every release sent over the
  // lane, so that the call sees them (the two connections are read independently).
  void sync();
  bool ended() const { return ended_.load(std::memory_order_relaxed); }

 private:
  ClientLane(int fd, std::chrono::microseconds busyPoll);
  bool usable() const;
  // One request and its answer, with mutex_ held: what release() and abort() queued goes first,
  // in the same write. `append` adds the request's frame given its id; `decode` reads the answer's
  // body. Nothing when the lane ended on the way (no answer, or one that does not parse).
  template <typename Reply, typename Append, typename Decode>
  std::optional<Result<Reply>> exchange(uint16_t op, Append append, Decode decode);
  // exchange() unless another thread's call holds the lane or it cannot be used (nothing then);
  // sends the releases queued meanwhile after.
  template <typename Reply, typename Append, typename Decode>
  std::optional<Result<Reply>> tryExchange(uint16_t op, Append append, Decode decode);
  // With mutex_ held.
  bool sendAll(const std::vector<uint8_t>& bytes);
  // Reads the answer to request `id` of `op`; answers to other requests in flight that come first
  // are kept for their turn. False ends the lane.
  bool receive(uint16_t op, uint64_t id, std::vector<uint8_t>& body);
  bool fill(size_t want, bool poll);
  // Appends what release() and abort() queued; sentOneWay() when there was any.
  void appendPendingReleases(std::vector<uint8_t>& out);
  // A release or abort goes out after request nextId_ - 1: Cap'n Proto calls sync until an answer
  // to a later request comes (answered()).
  void sentOneWay();
  void answered(uint64_t id);
  void sendPendingReleases();
  // Sends what release() queued, unless another thread holds the lane (it sends it when done).
  void flushReleases();
  // The lane cannot be trusted any more: calls go over Cap'n Proto. Its leases stay pinned until
  // the client closes (the daemon lets go of them when the descriptor closes).
  void endLane();

  const int fd_;
  const pid_t pid_;
  std::mutex mutex_;  // one call at a time; guards everything below but releases_
  uint64_t nextId_ = 1;
  Conversation answers_;
  std::vector<uint8_t> in_;  // bytes read, [inBegin_, in_.size()) not yet consumed
  std::map<uint64_t, std::pair<uint16_t, std::vector<uint8_t>>> early_;  // answers read ahead
  size_t inBegin_ = 0;
  std::atomic<bool> ended_{false};
  std::atomic<bool> unsynced_{false};  // releases were sent and no answer came after them
  uint64_t oneWayAfter_ = 0;           // the last request sent before the last release or abort
  std::mutex releasesMutex_;
  std::vector<uint64_t> releases_;  // guarded by releasesMutex_
  std::vector<uint64_t> aborts_;    // guarded by releasesMutex_
};

}  // namespace kvtier
