#include "store/snapshot_manifest.h"

#include "kvtier/layout.h"
#include "store/engine_util.h"

namespace kvtier {

using engine_util::ceilDiv;
using engine_util::invalid;

Status checkManifest(const SnapshotManifest& m) {
  if (m.id == 0) return invalid("snapshot id 0 names no snapshot");
  if (m.blockTokens == 0 || m.blockBytes == 0 || m.blockBytes > kMaxBlockBytes) {
    return invalid("block of ", m.blockTokens, " tokens and ", m.blockBytes, " bytes");
  }
  if (m.window > 0 && m.chunk > 0) return invalid("both a window and a chunk");
  if (m.from > m.to) return invalid("from ", m.from, " is past to ", m.to);
  if (m.tokens.size() > m.to) return invalid(m.tokens.size(), " tokens for [0, ", m.to, ")");
  if (m.keys.size() > m.to / m.blockTokens) {
    return invalid(m.keys.size(), " keys for ", m.to / m.blockTokens, " full blocks");
  }
  const uint64_t blocks = m.from < m.to ? ceilDiv(m.to, m.blockTokens) - m.from / m.blockTokens : 0;
  if (m.from < m.to && m.tokens.size() != m.to) {
    return invalid(m.tokens.size(), " tokens for a snapshot ending at ", m.to);
  }
  if (m.blocks.size() != blocks) return invalid(m.blocks.size(), " blocks where ", blocks, " are");
  if (m.blocks.size() >= kCheckpointSlotBit || m.checkpoints.size() >= kCheckpointSlotBit) {
    return invalid("too many blocks or checkpoints");
  }
  if (m.from == m.to && !m.checkpoints.empty()) return invalid("an empty snapshot's checkpoints");
  for (size_t i = 0; i < m.checkpoints.size(); ++i) {
    const auto& c = m.checkpoints[i];
    if (c.position < m.from || c.position > m.to) {
      return invalid("checkpoint at ", c.position, " outside [", m.from, ", ", m.to, "]");
    }
    if (i > 0 && c.position <= m.checkpoints[i - 1].position) {
      return invalid("checkpoints out of order at ", c.position);
    }
    if (c.bytes == 0 || c.bytes > kMaxBlockBytes) {
      return invalid("checkpoint of ", c.bytes, " bytes");
    }
  }
  return {};
}

}  // namespace kvtier
