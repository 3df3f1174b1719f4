// A session's fast lane in kvtierd (the protocol: transport/lane_codec.h).
//
// Hello hands each session a random token; the client connects to the daemon's socket a second
// time and attaches with it (Server checks the token and that the peer's credentials are the
// session's). The lane then serves lookups and their leases' releases on the daemon's event loop,
// beside the session's Cap'n Proto connection: the same engine, the same prepareLookup, the same
// leases — only the framing is lighter. Leases granted over the lane belong to it: released by the
// client's release frames, or all at once when the lane's connection ends or the session does.
#pragma once

#include <kj/async-io.h>

#include <array>
#include <cstdint>
#include <span>
#include <unordered_set>
#include <utility>
#include <vector>

#include "daemon/access.h"
#include "daemon/lookup.h"
#include "transport/lane_codec.h"

namespace kvtier {

// What the daemon counts of its lanes (stats, metrics).
struct LaneStats {
  uint64_t lookups = 0;   // served
  uint64_t puts = 0;      // write leases granted
  uint64_t attached = 0;  // lanes attached and not ended
  uint64_t refused = 0;   // attaches refused
};

class Lane final : private kj::TaskSet::ErrorHandler {
 public:
  using Token = std::array<uint8_t, lane::kTokenBytes>;

  // `site` without a space: the session's owner and the daemon's services (borrowed).
  Lane(const LookupSite& site, const PeerCredentials& peer, LaneStats& stats);
  ~Lane() noexcept(false);
  Lane(const Lane&) = delete;
  Lane& operator=(const Lane&) = delete;

  const Token& token() const { return token_; }
  const PeerCredentials& peer() const { return peer_; }
  // The number lane frames name a space by (from 1), for a space the session opened.
  uint32_t addSpace(SpaceId space, uint8_t tier);
  bool attached() const { return attached_; }
  // Serves frames read from `stream` (buffered, reads past the Attach) until the peer closes it
  // or sends a frame that cannot be parsed.
  void attach(kj::Own<kj::AsyncIoStream> stream);
  // Read and write leases the lane holds.
  uint64_t leases() const { return leases_.size() + writes_.size(); }
  // Ends the lane now (the session ends): its leases are released.
  void close() { end(""); }

 private:
  void taskFailed(kj::Exception&& e) override;
  // Reads what the client sent and serves every whole frame of it; again until the lane ends.
  kj::Promise<void> readMore();
  void serveBuffered();
  void serve(const lane::Header& header, std::span<const uint8_t> body);
  // Where a request naming the lane's space `number` runs.
  Result<LookupSite> siteOf(uint32_t number) const;
  void lookup(uint64_t id, lane::LookupRequest req);
  void put(uint64_t id, lane::PutRequest req);
  void commit(uint64_t id, const lane::CommitRequest& req);
  void release(const std::vector<uint64_t>& ids);
  void abort(const std::vector<uint64_t>& ids);
  void logUnknown(const char* what, size_t unknown, size_t of);
  void answer(uint64_t id, SpaceId space, uint8_t tier, const lane::LookupRequest& req,
              const std::vector<Key128>& chain);
  void reply(const Error& error, uint16_t op, uint64_t id);
  void flush();
  // Stops reading, says so to the peer and lets go of every lease the lane holds.
  void end(const std::string& why);
  void shutdown();
  void releaseAll();

  LookupSite site_;
  PeerCredentials peer_;
  LaneStats& stats_;
  Token token_{};
  std::vector<std::pair<SpaceId, uint8_t>> spaces_;  // number n is spaces_[n - 1]
  std::unordered_set<LeaseId> leases_;               // read leases
  std::unordered_set<LeaseId> writes_;               // write leases
  bool attached_ = false;
  bool ended_ = false;
  kj::Own<kj::AsyncIoStream> stream_;
  // Bytes read: [inBegin_, inEnd_) not yet served; frameBytes_ is the size of the frame at inBegin_
  // once its header has come (0 before).
  static constexpr size_t kReadBytes = (64 << 10) + 1;
  std::vector<uint8_t> in_;
  size_t inBegin_ = 0, inEnd_ = 0, frameBytes_ = 0;
  std::vector<uint8_t> out_;  // frames not yet handed to the stream
  bool writing_ = false;
  // Replies queued behind a write the client has not taken: past this many bytes the lane reads
  // no more requests until it has (a client that sends and never reads costs the daemon this
  // much, not all its memory).
  static constexpr size_t kMaxQueuedReplyBytes = 8 << 20;
  kj::Own<kj::PromiseFulfiller<void>> drained_;  // the paused reader's, until the write is taken
  kj::TaskSet tasks_;                            // after stream_: destroyed (cancelled) first
};

}  // namespace kvtier
