#include "daemon/snapshot_codec.h"

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <xxhash.h>

#include <cstring>
#include <vector>

#include "schemas/cold_record.capnp.h"

namespace kvtier {
namespace {

constexpr size_t kChecksumBytes = 8;

capnp::Data::Reader dataOf(const uint8_t* bytes, size_t size) {
  return capnp::Data::Reader(bytes, size);
}

bool sameBytes(capnp::Data::Reader data, const uint8_t* bytes, size_t size) {
  return data.size() == size && std::memcmp(data.begin(), bytes, size) == 0;
}

}  // namespace

std::string encodeManifest(const SnapshotManifest& m) {
  return encodeManifest(m, disk::MANIFEST_FORMAT_VERSION);
}

std::string encodeManifest(const SnapshotManifest& m, uint32_t formatVersion) {
  capnp::MallocMessageBuilder message;
  auto out = message.initRoot<disk::SnapshotManifest>();
  out.setFormatVersion(formatVersion);
  out.setFingerprint(m.fingerprint);
  out.setSalt(dataOf(m.salt.data(), m.salt.size()));
  out.setId(m.id);
  out.setBlockTokens(m.blockTokens);
  out.setBlockBytes(m.blockBytes);
  out.setFrom(m.from);
  out.setTo(m.to);
  auto tokens = out.initTokens(static_cast<unsigned>(m.tokens.size()));
  for (size_t i = 0; i < m.tokens.size(); ++i) tokens.set(static_cast<unsigned>(i), m.tokens[i]);
  auto keys = out.initKeys(static_cast<unsigned>(m.keys.size()));
  for (size_t i = 0; i < m.keys.size(); ++i) {
    keys.set(static_cast<unsigned>(i), dataOf(m.keys[i].bytes.data(), m.keys[i].bytes.size()));
  }
  out.setDetached(m.detached);
  out.setWindow(m.window);
  out.setChunk(m.chunk);
  out.setClientKeyed(m.clientKeyed);
  out.setUnindexed(m.unindexed);
  auto blocks = out.initBlocks(static_cast<unsigned>(m.blocks.size()));
  for (size_t i = 0; i < m.blocks.size(); ++i) {
    auto b = blocks[static_cast<unsigned>(i)];
    switch (m.blocks[i].kind) {
      case ManifestBlock::Kind::kReleased:
        b.setReleased();
        break;
      case ManifestBlock::Kind::kSealed:
        b.setSealed(dataOf(m.blocks[i].key.bytes.data(), m.blocks[i].key.bytes.size()));
        break;
      case ManifestBlock::Kind::kOwn:
        b.setOwn();
        break;
    }
  }
  auto checkpoints = out.initCheckpoints(static_cast<unsigned>(m.checkpoints.size()));
  for (size_t i = 0; i < m.checkpoints.size(); ++i) {
    checkpoints[static_cast<unsigned>(i)].setPosition(m.checkpoints[i].position);
    checkpoints[static_cast<unsigned>(i)].setBytes(m.checkpoints[i].bytes);
  }
  auto words = capnp::messageToFlatArray(message);
  auto bytes = words.asBytes();
  std::string value(kChecksumBytes + bytes.size(), '\0');
  const uint64_t sum = XXH3_64bits(bytes.begin(), bytes.size());
  for (size_t i = 0; i < kChecksumBytes; ++i) value[i] = static_cast<char>(sum >> (8 * i));
  std::memcpy(value.data() + kChecksumBytes, bytes.begin(), bytes.size());
  return value;
}

Result<SnapshotManifest> decodeManifest(std::string_view value, uint64_t fingerprint,
                                        const Salt& salt, uint64_t id) {
  auto corrupt = [id](auto&&... why) {
    return makeError(ErrorCode::kChecksumMismatch, "manifest of snapshot ", id, ": ", why...);
  };
  if (value.size() < kChecksumBytes + sizeof(capnp::word) ||
      (value.size() - kChecksumBytes) % sizeof(capnp::word) != 0) {
    return corrupt("its size is invalid");
  }
  uint64_t sum = 0;
  for (size_t i = 0; i < kChecksumBytes; ++i) {
    sum |= uint64_t{static_cast<uint8_t>(value[i])} << (8 * i);
  }
  const std::string_view message = value.substr(kChecksumBytes);
  if (XXH3_64bits(message.data(), message.size()) != sum) return corrupt("it fails its checksum");
  // Copy into aligned words before parsing; the parser may read no more than the message holds
  // (twice over, for the list headers), so a manifest is bounded by its own size.
  std::vector<capnp::word> words(message.size() / sizeof(capnp::word));
  std::memcpy(words.data(), message.data(), message.size());
  capnp::ReaderOptions limits;
  limits.traversalLimitInWords = 2 * words.size() + 64;
  limits.nestingLimit = 8;
  SnapshotManifest m;
  try {
    capnp::FlatArrayMessageReader reader(
        kj::ArrayPtr<const capnp::word>(words.data(), words.size()), limits);
    auto in = reader.getRoot<disk::SnapshotManifest>();
    if (in.getFormatVersion() != disk::MANIFEST_FORMAT_VERSION) {
      return corrupt("unknown format version ", in.getFormatVersion());
    }
    if (in.getFingerprint() != fingerprint || in.getId() != id ||
        !sameBytes(in.getSalt(), salt.data(), salt.size())) {
      return corrupt("it names another snapshot");
    }
    m.id = id;
    m.fingerprint = fingerprint;
    m.salt = salt;
    m.blockTokens = in.getBlockTokens();
    m.blockBytes = in.getBlockBytes();
    m.from = in.getFrom();
    m.to = in.getTo();
    auto tokens = in.getTokens();
    m.tokens.reserve(tokens.size());
    for (uint32_t t : tokens) m.tokens.push_back(t);
    for (auto k : in.getKeys()) {
      Key128 key;
      if (k.size() != key.bytes.size()) return corrupt("a key of ", k.size(), " bytes");
      std::memcpy(key.bytes.data(), k.begin(), k.size());
      m.keys.push_back(key);
    }
    m.detached = in.getDetached();
    m.window = in.getWindow();
    m.chunk = in.getChunk();
    m.clientKeyed = in.getClientKeyed();
    m.unindexed = in.getUnindexed();
    for (auto b : in.getBlocks()) {
      ManifestBlock block;
      switch (b.which()) {
        case disk::SnapshotBlock::RELEASED:
          break;
        case disk::SnapshotBlock::SEALED: {
          auto k = b.getSealed();
          if (k.size() != block.key.bytes.size()) return corrupt("a block key of ", k.size());
          block.kind = ManifestBlock::Kind::kSealed;
          std::memcpy(block.key.bytes.data(), k.begin(), k.size());
          break;
        }
        case disk::SnapshotBlock::OWN:
          block.kind = ManifestBlock::Kind::kOwn;
          break;
        default:
          return corrupt("a block of an unknown kind");
      }
      m.blocks.push_back(block);
    }
    for (auto c : in.getCheckpoints()) {
      m.checkpoints.push_back(ManifestCheckpoint{c.getPosition(), c.getBytes()});
    }
  } catch (const kj::Exception& e) {
    return corrupt("it does not parse (", e.getDescription().cStr(), ")");
  }
  if (auto s = checkManifest(m); !s) return corrupt(s.error().message());
  return m;
}

}  // namespace kvtier
