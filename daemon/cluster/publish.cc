// The directory's publishing side: telling each key's home that this node holds it.
#include "daemon/cluster/cluster_impl.h"

namespace kvtier {

void ClusterService::Impl::schedulePublish() {
  if (publishScheduled_ || held_.pending() == 0) return;
  publishScheduled_ = true;
  const kj::Duration delay =
      held_.pending() >= kPublishBatch ? 0 * kj::MILLISECONDS : options_.publishDelay;
  tasks_.add(timer_.afterDelay(delay).then([this] {
    publishScheduled_ = false;
    flushPublish();
  }));
}

void ClusterService::Impl::flushPublish() {
  for (const std::string& home : held_.pendingHomes()) {
    if (home == options_.nodeId) {
      const auto batch = held_.take(home, SIZE_MAX);
      for (const auto& k : batch.withdraw) home_.withdraw(home, k);
      for (const auto& k : batch.add) home_.add(home, k);
      stats_.published += batch.add.size();
      stats_.withdrawn += batch.withdraw.size();
      continue;
    }
    auto link = linkTo(home);
    if (!link || link->publishing) continue;  // sent once the link is up, or re-homed
    KJ_IF_MAYBE (p, link->peer) {
      auto batch = std::make_shared<HeldKeys::Batch>(held_.take(home, kPublishBatch));
      auto req = p->publishRequest();
      auto sameSpace = [](const DirEntry& a, const DirEntry& b) {
        return a.key.fingerprint == b.key.fingerprint && a.key.salt == b.key.salt;
      };
      auto fill = [&](auto groups, const std::vector<DirEntry>& entries) {
        // One group per run of entries of the same namespace (a batch rarely spans more than a
        // few).
        size_t i = 0, g = 0;
        while (i < entries.size()) {
          size_t j = i;
          while (j < entries.size() && sameSpace(entries[j], entries[i])) ++j;
          auto group = groups[g++];
          group.getSpace().setFingerprint(entries[i].key.fingerprint);
          group.getSpace().setSalt(capnp::Data::Reader(entries[i].key.salt.data(), 16));
          auto keys = group.initKeys((j - i) * 16);
          auto unders = group.initUnders((j - i) * 16);
          auto own = group.initOwn(j - i);
          for (size_t k = i; k < j; ++k) {
            std::memcpy(keys.begin() + 16 * (k - i), entries[k].key.key.bytes.data(), 16);
            std::memcpy(unders.begin() + 16 * (k - i), entries[k].under.bytes.data(), 16);
            own[k - i] = entries[k].own ? 1 : 0;
          }
          i = j;
        }
      };
      auto groupsOf = [&](const std::vector<DirEntry>& entries) {
        size_t n = 0;
        for (size_t i = 0; i < entries.size(); ++i) n += i == 0 || !sameSpace(entries[i], entries[i - 1]);
        return n;
      };
      auto bySpace = [](const DirEntry& a, const DirEntry& b) {
        return std::tie(a.key.fingerprint, a.key.salt) < std::tie(b.key.fingerprint, b.key.salt);
      };
      std::sort(batch->add.begin(), batch->add.end(), bySpace);
      std::sort(batch->withdraw.begin(), batch->withdraw.end(), bySpace);
      fill(req.initAdd(groupsOf(batch->add)), batch->add);
      fill(req.initWithdraw(groupsOf(batch->withdraw)), batch->withdraw);
      link->publishing = true;
      publishInFlight_ += batch->size();
      tasks_.add(withDeadline(timer_, options_.peerTimeout, req.send().ignoreResult())
                     .then(
                         [this, link, batch] {
                           link->publishing = false;
                           publishInFlight_ -= batch->size();
                           stats_.published += batch->add.size();
                           stats_.withdrawn += batch->withdraw.size();
                           schedulePublish();
                         },
                         [this, link, batch, home](kj::Exception&& e) {
                           link->publishing = false;
                           publishInFlight_ -= batch->size();
                           logWarn("publish_failed", "home=" + home +
                                                         " keys=" + std::to_string(batch->size()) +
                                                         " " + e.getDescription().cStr());
                           held_.requeue(home, *batch);
                           // Try again later (the link may come back; if not, a membership
                           // change re-homes the keys).
                           tasks_.add(timer_.afterDelay(options_.peerTimeout).then([this] {
                             schedulePublish();
                           }));
                         }));
    }
  }
}

}  // namespace kvtier
