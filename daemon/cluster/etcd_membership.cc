#include "daemon/cluster/etcd_membership.h"

#include <capnp/compat/json.h>
#include <capnp/message.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "daemon/log.h"
#include "transport/rpc_codec.h"

namespace kvtier::cluster {
namespace {

using capnp::JsonValue;

constexpr int64_t kMaxLeaseTtlSeconds = 3600;
// Most characters of a peer-supplied string quoted in a log line.
constexpr size_t kMaxLoggedBytes = 160;

bool hasControl(std::string_view text) {
  return std::any_of(text.begin(), text.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u < 0x20 || u == 0x7f;
  });
}

Status checkName(std::string_view what, std::string_view name) {
  if (name.empty() || name.size() > kMaxEtcdNameBytes || name.find('/') != std::string_view::npos ||
      hasControl(name)) {
    return makeError(ErrorCode::kInvalidArgument, what, " '", name.substr(0, kMaxEtcdNameBytes),
                     "' must be 1 .. ", kMaxEtcdNameBytes,
                     " bytes without '/' or control characters");
  }
  return {};
}

Status checkRecord(const MemberRecord& record) {
  if (auto valid = checkName("node id", record.nodeId); !valid) return valid;
  if (record.address.empty() || record.address.size() > kMaxMemberAddressBytes ||
      hasControl(record.address)) {
    return makeError(ErrorCode::kInvalidArgument, "address of node ", record.nodeId,
                     " must be 1 .. ", kMaxMemberAddressBytes, " printable bytes");
  }
  if (record.capabilities.size() > kMaxMemberCapabilitiesBytes || hasControl(record.capabilities)) {
    return makeError(ErrorCode::kInvalidArgument, "capabilities of node ", record.nodeId,
                     " must be at most ", kMaxMemberCapabilitiesBytes, " printable bytes");
  }
  return {};
}

// A peer-supplied string made safe for a quoted one-line log value: bounded, with control
// bytes, non-ASCII and quotes replaced.
std::string printable(std::string_view text) {
  std::string out(text.substr(0, kMaxLoggedBytes));
  for (char& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f || c == '"') c = '?';
  }
  if (text.size() > kMaxLoggedBytes) out += "...";
  return out;
}

std::string errorText(const kj::Exception& e) { return fromKjException(e).toString(); }

}  // namespace

std::string encodeMemberValue(const MemberRecord& record) {
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<JsonValue>();
  auto fields = root.initObject(2);
  fields[0].setName("address");
  fields[0].initValue().setString(record.address);
  fields[1].setName("capabilities");
  fields[1].initValue().setString(record.capabilities);
  auto text = capnp::JsonCodec().encodeRaw(root);
  return std::string(text.cStr(), text.size());
}

Result<MemberRecord> decodeMemberValue(std::string_view nodeId, std::string_view value) {
  if (value.size() > kMaxMemberAddressBytes + kMaxMemberCapabilitiesBytes + 64) {
    return makeError(ErrorCode::kInvalidArgument, "member value of ", value.size(),
                     " bytes is too long");
  }
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<JsonValue>();
  capnp::JsonCodec codec;
  KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                      [&]() { codec.decodeRaw(kj::arrayPtr(value.data(), value.size()), root); })) {
    return makeError(ErrorCode::kInvalidArgument, "member value is not JSON");
  }
  if (!root.isObject())
    return makeError(ErrorCode::kInvalidArgument, "member value is not an object");
  MemberRecord record;
  record.nodeId = std::string(nodeId);
  bool haveAddress = false;
  for (auto field : root.getObject()) {
    auto v = field.getValue();
    const bool isAddress = field.getName() == "address";
    if (!isAddress && field.getName() != "capabilities") continue;  // newer fields: ignored
    if (!v.isString()) {
      return makeError(ErrorCode::kInvalidArgument, "member field ", field.getName().cStr(),
                       " is not a string");
    }
    std::string text(v.getString().cStr(), v.getString().size());
    if (isAddress) {
      record.address = std::move(text);
      haveAddress = true;
    } else {
      record.capabilities = std::move(text);
    }
  }
  if (!haveAddress) return makeError(ErrorCode::kInvalidArgument, "member value has no address");
  if (auto valid = checkRecord(record); !valid) return valid.error();
  return record;
}

Status EtcdMembership::validate(const EtcdMembershipOptions& options) {
  if (auto valid = EtcdClient::validateEndpoint(options.endpoint); !valid) return valid;
  if (auto valid = checkName("cluster", options.cluster); !valid) return valid;
  if (auto valid = checkRecord(options.self); !valid) return valid;
  if (options.leaseTtlSeconds < 1 || options.leaseTtlSeconds > kMaxLeaseTtlSeconds) {
    return makeError(ErrorCode::kInvalidArgument, "lease TTL ", options.leaseTtlSeconds,
                     " s is outside 1 .. ", kMaxLeaseTtlSeconds);
  }
  if (options.requestTimeout <= 0 * kj::SECONDS || options.retryDelay <= 0 * kj::SECONDS ||
      options.watchRenewal <= 0 * kj::SECONDS) {
    return makeError(ErrorCode::kInvalidArgument,
                     "etcd request timeout, retry delay and watch renewal must be positive");
  }
  return {};
}

EtcdMembership::EtcdMembership(kj::Network& network, kj::Timer& timer,
                               EtcdMembershipOptions options,
                               std::function<void(const std::vector<MemberRecord>&)> onChange)
    : timer_(timer),
      options_(std::move(options)),
      onChange_(std::move(onChange)),
      valid_(validate(options_)),
      client_(network, timer, EtcdClientOptions{options_.endpoint, options_.requestTimeout}),
      prefix_("/kvtier/" + options_.cluster + "/nodes/"),
      selfKey_(prefix_ + options_.self.nodeId),
      selfValue_(encodeMemberValue(options_.self)) {}

kj::Promise<void> EtcdMembership::run() {
  if (!valid_) return kj::Promise<void>(toKjException(valid_.error()));
  // Two loops would register twice and race on lease_: a caller bug, answered as one.
  KJ_REQUIRE(!running_, "EtcdMembership::run() is already running");
  running_ = true;
  return loop(options_.retryDelay).attach(kj::defer([this]() {
    running_ = false;
    stats_.connected = false;
  }));
}

kj::Promise<void> EtcdMembership::loop(kj::Duration delay) {
  return session()
      .then([]() {
        // session() only ends by failing; treat an end like one.
        throwRpcError(makeError(ErrorCode::kUnavailable, "etcd session ended"));
      })
      .catch_([this, delay](kj::Exception&& e) -> kj::Promise<void> {
        const bool wasConnected = stats_.connected;
        stats_.connected = false;
        ++stats_.errors;
        if (wasConnected) {
          logWarn("etcd_disconnected",
                  "cluster=" + options_.cluster + " error=\"" + printable(errorText(e)) +
                      "\" keeping_members=" + std::to_string(published_.size()));
        } else if (!reportedDown_) {
          logWarn("etcd_unreachable", "cluster=" + options_.cluster +
                                          " endpoint=" + options_.endpoint + " error=\"" +
                                          printable(errorText(e)) + "\"");
        }
        reportedDown_ = true;
        // After a session that worked, the backoff starts over.
        const kj::Duration wait = wasConnected ? options_.retryDelay : delay;
        const kj::Duration next =
            std::min(wait * 2, std::max(options_.retryDelay, kMaxEtcdRetryDelay));
        return timer_.afterDelay(wait).then([this, next]() { return loop(next); });
      });
}

kj::Promise<void> EtcdMembership::session() {
  kj::Promise<void> registered = left_ ? kj::Promise<void>(kj::READY_NOW) : registerSelf();
  return registered.then([this]() { return watchMembers(true).exclusiveJoin(keepAliveLoop()); });
}

kj::Promise<void> EtcdMembership::watchMembers(bool first) {
  return client_.range(prefix_).then([this, first](EtcdRange&& range) {
    applyRange(range);
    if (first) {
      stats_.connected = true;
      reportedDown_ = false;
      logInfo("etcd_connected", "cluster=" + options_.cluster + " node=" + options_.self.nodeId +
                                    " lease=" + std::to_string(lease_) +
                                    " revision=" + std::to_string(range.revision) +
                                    " members=" + std::to_string(published_.size()));
    } else {
      ++stats_.watchRenewals;
    }
    auto watch =
        client_.watch(prefix_, range.revision + 1,
                      [this](const std::vector<EtcdEvent>& events) { applyEvents(events); });
    // The watch ends (cancelled) when the renewal is due, and a new one begins.
    return watch.exclusiveJoin(timer_.afterDelay(options_.watchRenewal)).then([this]() {
      return watchMembers(false);
    });
  });
}

kj::Promise<void> EtcdMembership::registerSelf() {
  return client_.grantLease(options_.leaseTtlSeconds)
      .then([this](int64_t lease) -> kj::Promise<void> {
        if (left_) {
          // leave() came while the grant was in flight: give the new lease back.
          return client_.revoke(lease).catch_([](kj::Exception&&) {});
        }
        lease_ = lease;
        return client_.put(selfKey_, selfValue_, lease).then([this, lease](int64_t revision) {
          ++stats_.registrations;
          logInfo("etcd_registered", "key=" + selfKey_ + " lease=" + std::to_string(lease) +
                                         " revision=" + std::to_string(revision));
        });
      });
}

kj::Promise<void> EtcdMembership::keepAliveLoop() {
  const kj::Duration interval = options_.leaseTtlSeconds * kj::SECONDS / 3;
  return timer_.afterDelay(interval).then([this]() -> kj::Promise<void> {
    if (left_ || lease_ == 0) return kj::NEVER_DONE;
    const int64_t lease = lease_;
    return client_.keepAlive(lease).then([this, lease](int64_t ttl) -> kj::Promise<void> {
      if (left_) return kj::NEVER_DONE;
      if (ttl > 0) {
        ++stats_.keepAlives;
        return keepAliveLoop();
      }
      // The lease expired (we were cut off longer than its TTL) or was revoked by someone else:
      // our record is gone, so register again under a new one.
      logWarn("etcd_lease_lost", "key=" + selfKey_ + " lease=" + std::to_string(lease));
      lease_ = 0;
      return registerSelf().then([this]() { return keepAliveLoop(); });
    });
  });
}

kj::Promise<void> EtcdMembership::leave() {
  left_ = true;
  const int64_t lease = lease_;
  lease_ = 0;
  if (lease == 0) return kj::READY_NOW;
  return client_.revoke(lease).then(
      [this, lease]() {
        logInfo("etcd_left", "key=" + selfKey_ + " lease=" + std::to_string(lease));
      },
      [this, lease](kj::Exception&& e) {
        if (fromKjException(e).code() == ErrorCode::kNotFound) {
          logInfo("etcd_left",
                  "key=" + selfKey_ + " lease=" + std::to_string(lease) + " already_gone=true");
          return;
        }
        logWarn("etcd_leave_failed",
                "key=" + selfKey_ + " error=\"" + printable(errorText(e)) + "\"");
        kj::throwFatalException(kj::mv(e));
      });
}

std::optional<MemberRecord> EtcdMembership::parseRecord(std::string_view key,
                                                        std::string_view value) const {
  std::string_view nodeId = key.substr(prefix_.size());
  if (auto valid = checkName("node id", nodeId); !valid) {
    logWarn("etcd_member_skipped",
            "key=\"" + printable(key) + "\" error=\"" + printable(valid.error().toString()) + "\"");
    return std::nullopt;
  }
  auto record = decodeMemberValue(nodeId, value);
  if (!record) {
    logWarn("etcd_member_skipped", "key=\"" + printable(key) + "\" error=\"" +
                                       printable(record.error().toString()) + "\"");
    return std::nullopt;
  }
  return std::move(record).value();
}

void EtcdMembership::applyRange(const EtcdRange& range) {
  std::map<std::string, MemberRecord> records;
  for (const auto& kv : range.kvs) {
    if (kv.key.compare(0, prefix_.size(), prefix_) != 0) continue;
    if (auto record = parseRecord(kv.key, kv.value)) {
      std::string id = record->nodeId;
      records.emplace(std::move(id), std::move(*record));
    }
  }
  records_ = std::move(records);
  publish();
}

void EtcdMembership::applyEvents(const std::vector<EtcdEvent>& events) {
  stats_.watchEvents += events.size();
  for (const auto& event : events) {
    if (event.key.compare(0, prefix_.size(), prefix_) != 0) continue;
    const std::string nodeId = event.key.substr(prefix_.size());
    if (event.type == EtcdEvent::Type::kDelete) {
      records_.erase(nodeId);
      continue;
    }
    if (auto record = parseRecord(event.key, event.value)) {
      records_[nodeId] = std::move(*record);
    } else {
      records_.erase(nodeId);  // a record overwritten with garbage is no member any more
    }
  }
  publish();
}

void EtcdMembership::publish() {
  // We are a member for ourselves whatever etcd says right now (our record may be between
  // leases); a stale record under our id is replaced by what we know.
  auto merged = records_;
  merged[options_.self.nodeId] = options_.self;
  std::vector<MemberRecord> list;
  list.reserve(merged.size());
  for (auto& [id, record] : merged) list.push_back(std::move(record));
  if (havePublished_ && list == published_) return;

  // Both lists are sorted by node id: walk them together to log joins and leaves.
  auto before = published_.begin();
  auto after = list.begin();
  while (before != published_.end() || after != list.end()) {
    if (after == list.end() || (before != published_.end() && before->nodeId < after->nodeId)) {
      logInfo("cluster_member_left", "node=" + before->nodeId);
      ++before;
    } else if (before == published_.end() || after->nodeId < before->nodeId) {
      logInfo("cluster_member_joined", "node=" + after->nodeId + " address=" + after->address);
      ++after;
    } else {
      if (!(*before == *after)) {
        logInfo("cluster_member_updated", "node=" + after->nodeId + " address=" + after->address);
      }
      ++before;
      ++after;
    }
  }
  published_ = std::move(list);
  havePublished_ = true;
  if (onChange_) onChange_(published_);
}

}  // namespace kvtier::cluster
