// The daemon's counters in Prometheus text format (GET /metrics).
#include "daemon/server_internal.h"

namespace kvtier {

using namespace server_internal;

std::string Server::metricsText() {
  const EngineStats s = engine_.stats();
  std::string out;
  auto gauge = [&](const char* name, const char* help, uint64_t v) {
    appendMetric(out, name, "gauge", help, v);
  };
  auto counter = [&](const char* name, const char* help, uint64_t v) {
    appendMetric(out, name, "counter", help, v);
  };
  gauge("kvtier_blocks_total", "Blocks the pool holds or can still carve.", s.blocksTotal);
  gauge("kvtier_blocks_used", "Blocks held by sequences, leases or the prefix index.",
        s.blocksUsed);
  gauge("kvtier_blocks_pinned", "Blocks pinned by leases.", s.blocksPinned);
  gauge("kvtier_blocks_cached", "Sealed blocks held by nothing (evictable).", s.blocksCached);
  gauge("kvtier_pool_bytes", "Bytes of the host pool.", s.bytesTotal);
  gauge("kvtier_pool_bytes_used", "Bytes of the host pool in use.", s.bytesUsed);
  gauge("kvtier_pool_huge_pages",
        "1 when the host pool is on 2 MiB hugetlb pages, 0 on 4 KiB pages (kvtierd --huge-pages).",
        pool_.pages() == PageKind::kHuge2M ? 1 : 0);
  counter("kvtier_lookup_hit_blocks_total", "Blocks found by lookups.", s.hits);
  counter("kvtier_lookup_misses_total", "Lookups that stopped short.", s.misses);
  counter("kvtier_evictions_total", "Blocks evicted from memory.", s.evictions);
  appendMetricHeader(out, "kvtier_eviction_following", "gauge",
                     "The eviction policy (kvtierd --eviction) and the one that orders the blocks "
                     "now (the adaptive policy's current expert; the policy itself otherwise): 1.");
  out += std::string("kvtier_eviction_following{policy=\"") + s.eviction + "\",following=\"" +
         s.evictionFollowing + "\"} 1\n";
  counter("kvtier_eviction_switches_total",
          "Times the adaptive eviction policy changed the expert it follows.", s.evictionSwitches);
  counter("kvtier_blocks_corrupt_total",
          "Blocks a reader found differing from their writer's checksum: out of the index, freed.",
          s.corruptBlocks);
  gauge("kvtier_clients", "Connected sessions.", sessions_);
  gauge("kvtier_sequences", "Sequences.", s.sequences);
  gauge("kvtier_read_leases", "Open read leases.", s.readLeases);
  gauge("kvtier_write_leases", "Open write leases.", s.writeLeases);
  counter("kvtier_put_bytes_total", "Committed KV bytes.", s.bytesPut);
  counter("kvtier_get_bytes_total", "KV bytes handed out under read leases.", s.bytesGot);
  gauge("kvtier_snapshots", "Snapshots.", s.snapshots);
  gauge("kvtier_gpu_blocks_total", "Blocks the GPU pools hold or can carve.", s.gpuBlocksTotal);
  gauge("kvtier_gpu_blocks_used", "GPU pool blocks in use.", s.gpuBlocksUsed);
  counter("kvtier_gpu_demoted_total", "Blocks moved from a GPU pool to the host pool.",
          s.gpuDemoted);
  counter("kvtier_gpu_promoted_total", "Blocks moved from the host pool to a GPU pool.",
          s.gpuPromoted);
  gauge("kvtier_entries", "Position-independent entries cached.", s.entries);
  counter("kvtier_lane_lookups_total", "Lookups served over sessions' fast lanes.",
          laneStats_.lookups);
  counter("kvtier_lane_puts_total", "Write leases granted over sessions' fast lanes.",
          laneStats_.puts);
  gauge("kvtier_lanes_attached", "Sessions whose fast lane is attached.", laneStats_.attached);
  counter("kvtier_lanes_refused_total", "Fast-lane attaches refused.", laneStats_.refused);
  gauge("kvtier_tenant_quota_bytes", "The most host-pool bytes one tenant may take (0: none).",
        s.tenantQuotaBytes);
  if (!s.tenants.empty()) {
    appendMetricHeader(out, "kvtier_tenant_bytes_used", "gauge",
                       "Host-pool bytes of a tenant's blocks.");
    for (const auto& t : s.tenants) {
      std::string name;
      for (const auto& [salt, n] : tenantNames_) {
        if (salt == t.salt) name = n;
      }
      if (name.empty()) {  // a tenant whose namespace came back from disk before its hello
        static constexpr char kHex[] = "0123456789abcdef";
        name = "salt:";
        for (size_t i = 0; i < 4; ++i) {
          name += kHex[t.salt[i] >> 4];
          name += kHex[t.salt[i] & 15];
        }
      }
      out +=
          "kvtier_tenant_bytes_used{tenant=\"" + name + "\"} " + std::to_string(t.bytesUsed) + "\n";
    }
  }
  gauge("kvtier_checkpoints", "Recurrent state checkpoints.", s.checkpoints);
  counter("kvtier_spilled_blocks_total", "Blocks written to the cold tier.", s.spilled);
  counter("kvtier_promoted_blocks_total", "Blocks read back from the cold tier.", s.promoted);
  counter("kvtier_evicted_unspilled_total", "Blocks dropped while spilling was paused.",
          s.evictedUnspilled);
  if (cold_) {
    const ColdServiceStats c = cold_->stats();
    gauge("kvtier_cold_records", "Blocks held on disk.", c.tier.records);
    gauge("kvtier_cold_bytes", "Bytes of the records held on disk (what --disk-bytes bounds).",
          c.tier.bytes);
    gauge("kvtier_cold_disk_bytes",
          "Bytes of the cold tier's files, with what compaction has not yet reclaimed.",
          c.tier.diskBytes);
    counter("kvtier_cold_corrupt_dropped_total", "Records that failed their checks.",
            c.tier.corruptDropped);
    counter("kvtier_cold_quarantined_total",
            "Damaged cold tiers moved aside and replaced by an empty one.", c.tier.quarantined);
    counter("kvtier_cold_spill_errors_total", "Spill batches that failed.", c.spillErrors);
    counter("kvtier_cold_capacity_evicted_total", "Records dropped for the disk bound.",
            c.tier.capacityEvicted);
    gauge("kvtier_cold_spill_paused", "1 while spilling is paused by disk errors.", c.spillPaused);
    gauge("kvtier_cold_snapshots", "Snapshot manifests held on disk.", c.tier.snapshots);
    counter("kvtier_cold_snapshots_dropped_total",
            "Snapshots dropped from disk: their manifest or a record they need failed or was gone.",
            c.tier.snapshotsDropped);
  }
  if (remote_) {
    const RemoteStats r = remote_->stats();
    gauge("kvtier_cluster_members", "Cluster members known, self included.", r.members);
    gauge("kvtier_cluster_members_up", "Live cluster members, self included.", r.membersUp);
    gauge("kvtier_directory_entries", "Directory entries this node is a home of.",
          r.directoryEntries);
    gauge("kvtier_directory_keys", "Distinct block keys this node is the first directory home of.",
          r.directoryKeys);
    gauge("kvtier_directory_held_keys", "Block keys this node holds, as published.", r.heldKeys);
    gauge("kvtier_publish_backlog", "Directory messages not yet sent to their homes.",
          r.publishBacklog);
    counter("kvtier_directory_rehomed_total", "Keys re-sent because their home changed.",
            r.rehomed);
    counter("kvtier_remote_lookups_total", "Lookups that asked the cluster.", r.remoteLookups);
    counter("kvtier_remote_lookups_cut_total",
            "Lookups answered at their deadline, with what had arrived, while their fetch went on.",
            r.remoteLookupsCut);
    counter("kvtier_lookup_peer_messages_total",
            "Peer messages remote lookups sent: directory queries and pins.", r.lookupPeerMessages);
    gauge("kvtier_lookup_peer_messages_max", "The most peer messages one remote lookup sent.",
          r.lookupPeerMessagesMax);
    counter("kvtier_directory_queries_total",
            "Who-holds queries this node answered as a directory home.", r.directoryQueries);
    counter("kvtier_remote_hit_blocks_total", "Blocks fetched from other nodes.",
            r.remoteHitBlocks);
    counter("kvtier_remote_hit_bytes_total", "Bytes fetched from other nodes.", r.remoteHitBytes);
    counter("kvtier_served_blocks_total", "Blocks pinned for other nodes' fetches.",
            r.servedBlocks);
    counter("kvtier_pins_expired_total", "Pins whose lease ran out before release.", r.pinsExpired);
    counter("kvtier_peer_auth_failures_total", "Peers refused for a wrong token.", r.authFailures);
    gauge("kvtier_peer_rtt_microseconds", "Median heartbeat round trip to live peers.",
          r.peerRttMicros);
    const std::pair<const char*, uint64_t> kinds[] = {{"timeout", r.fetchTimeouts},
                                                      {"unavailable", r.fetchUnavailable},
                                                      {"transfer", r.fetchTransfer},
                                                      {"checksum", r.fetchChecksum},
                                                      {"full", r.fetchFull}};
    appendMetricHeader(out, "kvtier_fetch_errors_total", "counter", "Remote fetch errors by kind.");
    for (const auto& [kind, v] : kinds) {
      out += std::string("kvtier_fetch_errors_total{kind=\"") + kind + "\"} " + std::to_string(v) +
             "\n";
    }
  }
  return out;
}
}  // namespace kvtier
