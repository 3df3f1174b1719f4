// Snapshots, and blocks copied to other cluster nodes.

#include "client/client_internal.h"

namespace kvtier {

Result<SnapshotInfo> Space::snapshot(std::string_view seq, uint64_t from) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().snapshotRequest();
    req.setSeq(WireText(seq));
    req.setFrom(from);
    return req.send().then([](capnp::Response<rpc::Space::SnapshotResults>&& r) {
      return snapshotFrom(r.getSnapshot());
    });
  });
}

Status Space::restore(std::string_view seq, uint64_t snapshotId, uint64_t target,
                      const PutOptions& options, std::string_view node) {
  if (snapshotId == 0) return invalid("snapshot id 0 names no snapshot (use rewind)");
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().restoreRequest();
    req.setSeq(WireText(seq));
    req.setSnapshot(snapshotId);
    req.setTarget(target);
    setSeqOptions(req.initOptions(), options);
    req.setNode(WireText(node));
    return req.send().ignoreResult();
  });
}

Result<SnapshotInfo> Space::copySnapshot(std::string_view node, uint64_t snapshotId, bool move) {
  if (snapshotId == 0) return invalid("snapshot id 0 names no snapshot");
  if (node.empty()) return invalid("copySnapshot needs the node that holds the snapshot");
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().copySnapshotRequest();
    req.setNode(WireText(node));
    req.setSnapshot(snapshotId);
    req.setMove(move);
    return req.send().then([](capnp::Response<rpc::Space::CopySnapshotResults>&& r) {
      return snapshotFrom(r.getSnapshot());
    });
  });
}

namespace {

BlockTransfer transferFrom(const capnp::Response<rpc::Space::PushBlocksResults>& r) {
  return BlockTransfer{r.getBlocks(), r.getHeld(), r.getDropped()};
}

}  // namespace

Result<BlockTransfer> Space::copyRange(std::string_view node, std::string_view seq,
                                       uint64_t begin, uint64_t end, bool move) {
  if (node.empty()) return invalid("copyRange needs the node to copy to");
  if (seq.empty()) return invalid("copyRange needs a sequence");
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().pushBlocksRequest();
    req.setNode(WireText(node));
    req.setSeq(WireText(seq));
    req.setBegin(begin);
    req.setEnd(end);
    req.setMove(move);
    return req.send().then([](auto&& r) { return transferFrom(r); });
  });
}

Result<BlockTransfer> Space::copyKeys(std::string_view node, std::span<const Key128> keys,
                                      bool move) {
  if (node.empty()) return invalid("copyKeys needs the node to copy to");
  if (keys.empty()) return BlockTransfer{};
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().pushBlocksRequest();
    req.setNode(WireText(node));
    setKeys(req.initKeys(keys.size()), keys);
    req.setMove(move);
    return req.send().then([](auto&& r) { return transferFrom(r); });
  });
}

Result<BlockTransfer> Space::copyPrompt(std::string_view node, std::span<const uint32_t> tokens,
                                        bool move) {
  if (node.empty()) return invalid("copyPrompt needs the node to copy to");
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().pushBlocksRequest();
    req.setNode(WireText(node));
    setTokens(req.initTokens(tokens.size()), tokens);
    req.setMove(move);
    return req.send().then([](auto&& r) { return transferFrom(r); });
  });
}

Status Space::rewind(std::string_view seq, uint64_t target) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().restoreRequest();
    req.setSeq(WireText(seq));
    req.setTarget(target);
    return req.send().ignoreResult();
  });
}

Result<SnapshotInfo> Space::mergeSnapshots(uint64_t a, uint64_t b) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().mergeSnapshotsRequest();
    req.setA(a);
    req.setB(b);
    return req.send().then([](capnp::Response<rpc::Space::MergeSnapshotsResults>&& r) {
      return snapshotFrom(r.getSnapshot());
    });
  });
}

Result<std::pair<SnapshotInfo, SnapshotInfo>> Space::splitSnapshot(uint64_t id, uint64_t at) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().splitSnapshotRequest();
    req.setSnapshot(id);
    req.setAt(at);
    return req.send().then([](capnp::Response<rpc::Space::SplitSnapshotResults>&& r) {
      return std::make_pair(snapshotFrom(r.getLeft()), snapshotFrom(r.getRight()));
    });
  });
}

Result<SnapshotInfo> Space::snapshotInfo(uint64_t id) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().snapshotInfoRequest();
    req.setSnapshot(id);
    return req.send().then([](capnp::Response<rpc::Space::SnapshotInfoResults>&& r) {
      return snapshotFrom(r.getSnapshot());
    });
  });
}

Status Space::dropSnapshot(uint64_t id) {
  if (auto s = refresh(); !s) return s.error();
  return client_.impl_->run([&] {
    auto req = impl_->space().dropSnapshotRequest();
    req.setSnapshot(id);
    return req.send().ignoreResult();
  });
}

}  // namespace kvtier
