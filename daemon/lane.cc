#include "daemon/lane.h"

#include <sys/random.h>

#include <cstring>
#include <tuple>

#include "daemon/log.h"
#include "transport/rpc_codec.h"

namespace kvtier {

namespace {

Lane::Token randomToken() {
  Lane::Token token;
  size_t got = 0;
  while (got < token.size()) {
    const ssize_t n = ::getrandom(token.data() + got, token.size() - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (errno != EINTR) {
      KJ_FAIL_SYSCALL("getrandom", errno);
    }
  }
  return token;
}

}  // namespace

Lane::Lane(const LookupSite& site, const PeerCredentials& peer, LaneStats& stats)
    : site_(site), peer_(peer), stats_(stats), token_(randomToken()), tasks_(*this) {}

Lane::~Lane() noexcept(false) { releaseAll(); }

uint32_t Lane::addSpace(SpaceId space, uint8_t tier) {
  for (uint32_t i = 0; i < spaces_.size(); ++i) {
    if (spaces_[i] == std::make_pair(space, tier)) return i + 1;
  }
  spaces_.emplace_back(space, tier);
  return static_cast<uint32_t>(spaces_.size());
}

void Lane::attach(kj::Own<kj::AsyncIoStream> stream) {
  attached_ = true;
  ++stats_.attached;
  stream_ = kj::mv(stream);
  tasks_.add(readMore());
}

void Lane::taskFailed(kj::Exception&& e) { end(e.getDescription().cStr()); }

kj::Promise<void> Lane::readMore() {
  if (ended_) return kj::READY_NOW;
  // Keep what is unread at the front, with room for a whole frame (the one under way, or any that
  // fits kReadBytes): reads of at least the BufferedIoStream's buffer go straight into in_.
  if (inBegin_ > 0) {
    std::memmove(in_.data(), in_.data() + inBegin_, inEnd_ - inBegin_);
    inEnd_ -= inBegin_;
    inBegin_ = 0;
  }
  const size_t want = std::max(frameBytes_, kReadBytes);
  if (in_.size() < want) {
    in_.resize(want);
  } else if (inEnd_ == 0 && in_.size() > 4 * kReadBytes) {
    // Nothing unread after a large frame: give its memory back (up to ~20 MiB per session).
    in_.resize(want);
    in_.shrink_to_fit();
  }
  return stream_->tryRead(in_.data() + inEnd_, 1, in_.size() - inEnd_)
      .then([this](size_t n) -> kj::Promise<void> {
        if (n == 0) {
          // The client closed its lane.
          end(inEnd_ > 0 ? "the connection ended inside a frame" : "");
          return kj::READY_NOW;
        }
        inEnd_ += n;
        serveBuffered();
        flush();
        if (out_.size() > kMaxQueuedReplyBytes) {
          auto paf = kj::newPromiseAndFulfiller<void>();
          drained_ = kj::mv(paf.fulfiller);
          return paf.promise.then([this] { return readMore(); });
        }
        return readMore();
      });
}

void Lane::serveBuffered() {
  // Every whole frame of the burst, in order, in this turn of the loop.
  while (!ended_ && inEnd_ - inBegin_ >= sizeof(lane::Header)) {
    lane::Header header;
    std::memcpy(&header, in_.data() + inBegin_, sizeof header);
    if (auto s = lane::checkHeader(header); !s || (header.op & lane::kReply) != 0) {
      return end(s ? "a reply sent to the daemon" : s.error().message());
    }
    frameBytes_ = sizeof header + header.bodyBytes;
    if (inEnd_ - inBegin_ < frameBytes_) return;  // the rest of it comes later
    serve(header, std::span(in_.data() + inBegin_ + sizeof header, header.bodyBytes));
    inBegin_ += frameBytes_;
    frameBytes_ = 0;
  }
}

void Lane::serve(const lane::Header& header, std::span<const uint8_t> body) {
  switch (header.op) {
    case lane::kLookup: {
      auto req = lane::decodeLookup(body);
      if (!req) return reply(req.error(), header.op, header.id);
      return lookup(header.id, std::move(req).value());
    }
    case lane::kPut: {
      auto req = lane::decodePut(body);
      if (!req) return reply(req.error(), header.op, header.id);
      return put(header.id, std::move(req).value());
    }
    case lane::kCommit: {
      auto req = lane::decodeCommit(body);
      if (!req) return reply(req.error(), header.op, header.id);
      return commit(header.id, *req);
    }
    case lane::kRelease:
    case lane::kAbort: {
      auto leases = lane::decodeLeases(body);
      if (!leases) return end(leases.error().message());
      return header.op == lane::kRelease ? release(*leases) : abort(*leases);
    }
    case lane::kSync:
      return lane::appendSyncReply(out_, header.id);
  }
}

void Lane::release(const std::vector<uint64_t>& ids) {
  size_t unknown = 0;
  for (uint64_t id : ids) {
    // Only the lane's own leases: another session's are not a client's to release.
    if (leases_.erase(id) == 0) {
      ++unknown;
      continue;
    }
    (void)site_.engine.releaseRead(id);
  }
  if (unknown < ids.size() && site_.cold) site_.cold->kick();
  if (unknown > 0) logUnknown("release", unknown, ids.size());
}

void Lane::abort(const std::vector<uint64_t>& ids) {
  size_t unknown = 0;
  for (uint64_t id : ids) {
    if (writes_.erase(id) == 0) {
      ++unknown;  // committed, never granted, or another session's
      continue;
    }
    (void)site_.engine.abortWrite(id);
  }
  if (unknown > 0) logUnknown("abort", unknown, ids.size());
}

void Lane::logUnknown(const char* what, size_t unknown, size_t of) {
  // One line per frame, however many ids it names.
  logWarn("lane_unknown_lease", "owner=" + std::to_string(site_.owner) + " op=" + what +
                                    " unknown=" + std::to_string(unknown) +
                                    " of=" + std::to_string(of));
}

Result<LookupSite> Lane::siteOf(uint32_t number) const {
  if (number == 0 || number > spaces_.size()) {
    return makeError(ErrorCode::kInvalidArgument, "the lane has no space ", number);
  }
  LookupSite site = site_;
  std::tie(site.space, site.tier) = spaces_[number - 1];
  return site;
}

void Lane::put(uint64_t id, lane::PutRequest req) {
  auto named = siteOf(req.space);
  if (!named) return reply(named.error(), lane::kPut, id);
  const LookupSite& site = *named;
  auto request = kj::heap<lane::PutRequest>(std::move(req));
  // Fills the reply, or throws the engine's error (FULL and the like are tried again once a
  // service has made room).
  auto attempt = [this, id, site, &request = *request]() {
    PutGrant g = orThrow(site_.engine.put(
        site.owner, site.space, request.seq, request.begin, request.tokens, request.keys,
        SeqOptions{request.detached, request.window, request.chunk}, site.tier));
    if (site.tier != 0 && site.tiers) site.tiers->kick();  // the GPU pool filled: demote behind it
    if (ended_) {
      // Nobody is left to write or commit it.
      (void)site_.engine.abortWrite(g.lease);
      return;
    }
    writes_.insert(g.lease);
    ++stats_.puts;
    lane::appendPutReply(out_, id, {g.firstPosition, g.lease, std::move(g.blocks)});
  };
  kj::Maybe<kj::Promise<void>> retries;
  try {
    retries = tryWithRoom(site, kj::mv(attempt));
  } catch (const kj::Exception& e) {
    return reply(fromKjException(e), lane::kPut, id);
  }
  KJ_IF_MAYBE (waiting, retries) {
    // The pool is full until a spill or a demotion makes room: answer then (the lane goes on
    // reading; answers carry their request's id).
    tasks_.add(waiting->attach(kj::mv(request))
                   .then([this]() { flush(); },
                         [this, id](kj::Exception&& e) {
                           if (!ended_) reply(fromKjException(e), lane::kPut, id);
                           flush();
                         }));
  }
}

void Lane::commit(uint64_t id, const lane::CommitRequest& req) {
  if (writes_.count(req.lease) == 0) {
    return reply(makeError(ErrorCode::kReleased, "write lease ", req.lease,
                           " is not the lane's: committed, aborted or never granted"),
                 lane::kCommit, id);
  }
  auto r = site_.engine.commit(req.lease, req.upTo, req.sums);
  // A bad upTo leaves the lease open for another try; anything else ends it.
  if (r || r.code() != ErrorCode::kInvalidArgument) writes_.erase(req.lease);
  if (!r) return reply(r.error(), lane::kCommit, id);
  if (site_.cold) site_.cold->kick();
  lane::appendCommitReply(out_, id, {r->length, r->sealedBlocks});
}

void Lane::lookup(uint64_t id, lane::LookupRequest req) {
  auto named = siteOf(req.space);
  if (!named) return reply(named.error(), lane::kLookup, id);
  if (req.remote > static_cast<uint32_t>(rpc::RemoteMode::PREFETCH)) {
    return reply(makeError(ErrorCode::kInvalidArgument, "unknown remote mode ", req.remote),
                 lane::kLookup, id);
  }
  const LookupSite& site = *named;
  const SpaceId space = site.space;
  const uint8_t tier = site.tier;
  if (site.engine.space(space).layout.hasState()) {
    // Its answers carry a state's chunks and their checksums, which the lane's do not.
    return reply(makeError(ErrorCode::kNotSupported,
                           "lookups in a namespace with states go over Cap'n Proto"),
                 lane::kLookup, id);
  }
  std::vector<Key128> chain;
  kj::Maybe<kj::Promise<void>> waitFor;
  try {
    waitFor =
        prepareLookup(site, req.tokens, req.keys, static_cast<rpc::RemoteMode>(req.remote), chain);
  } catch (const kj::Exception& e) {
    return reply(fromKjException(e), lane::kLookup, id);
  }
  KJ_IF_MAYBE (ready, waitFor) {
    // Blocks come from disk, another tier or the cluster first: answer when they are in place
    // (the lane goes on reading; answers carry their request's id).
    tasks_.add(ready->then(
        [this, id, space = space, tier = tier, req = std::move(req), chain = std::move(chain)]() {
          answer(id, space, tier, req, chain);
          flush();
        },
        [this, id](kj::Exception&& e) {
          reply(fromKjException(e), lane::kLookup, id);
          flush();
        }));
    return;
  }
  answer(id, space, tier, req, chain);
}

void Lane::answer(uint64_t id, SpaceId space, uint8_t tier, const lane::LookupRequest& req,
                  const std::vector<Key128>& chain) {
  auto result =
      site_.engine.lookup(site_.owner, space, req.tokens, req.keys, "", SeqOptions{}, chain, tier);
  if (!result) return reply(result.error(), lane::kLookup, id);
  if (ended_) {
    // Nobody is left to release it.
    if (result->lease != 0) (void)site_.engine.releaseRead(result->lease);
    return;
  }
  if (result->lease != 0) leases_.insert(result->lease);
  ++stats_.lookups;
  lane::appendLookupReply(out_, id,
                          {result->matchedTokens, result->lease, result->blocks, result->sums});
}

void Lane::reply(const Error& error, uint16_t op, uint64_t id) {
  lane::appendErrorReply(out_, op, id, error);
}

void Lane::flush() {
  if (writing_ || out_.empty() || ended_) return;
  writing_ = true;
  auto bytes = kj::heap<std::vector<uint8_t>>(std::move(out_));
  out_.clear();
  auto* data = bytes.get();
  tasks_.add(stream_->write(data->data(), data->size()).attach(kj::mv(bytes)).then([this]() {
    writing_ = false;
    if (ended_) return shutdown();
    flush();  // what queued meanwhile goes out: the queue is empty again
    if (drained_.get() != nullptr) {
      auto resume = kj::mv(drained_);  // the reader goes on
      resume->fulfill();
    }
  }));
}

void Lane::end(const std::string& why) {
  if (ended_) return;
  ended_ = true;
  if (attached_) --stats_.attached;
  if (!why.empty()) {
    logWarn("lane_closed", "owner=" + std::to_string(site_.owner) + " why=\"" + why + "\"");
  }
  releaseAll();
  if (!writing_) shutdown();  // else once the write under way is done
}

void Lane::shutdown() {
  // The client sees the lane end (and goes on over Cap'n Proto): reads find its end, writes fail
  // (nothing more is read: a client still writing must not block on a full socket). The
  // descriptor stays open until the session ends.
  if (!stream_) return;
  try {
    stream_->shutdownWrite();
  } catch (const kj::Exception&) {
  }
  stream_->abortRead();
}

void Lane::releaseAll() {
  for (LeaseId id : leases_) (void)site_.engine.releaseRead(id);
  for (LeaseId id : writes_) (void)site_.engine.abortWrite(id);
  const bool any = !leases_.empty() || !writes_.empty();
  leases_.clear();
  writes_.clear();
  if (any && site_.cold) site_.cold->kick();
}

}  // namespace kvtier
