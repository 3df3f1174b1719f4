// Writes the fuzz harnesses' seed corpus: kvtier_fuzz_seeds DIR writes DIR/<harness>/<name> for
// each harness of tests/fuzz/. The committed corpus (tests/fuzz/corpus/) was made with it; run it
// again when a schema or an encoding changes, and commit what changed.
//
// Seeds are small, well-formed inputs that reach deep: a conversation that puts, commits, looks up
// and reads; a peer that authenticates and pins; a real cold record and manifest; a real command
// line; real trace lines. The fuzzer mutates from there.
#include <capnp/message.h>
#include <capnp/rpc.capnp.h>
#include <capnp/serialize.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "daemon/cold_tier.h"
#include "daemon/snapshot_codec.h"
#include "integrations/llama/seq_state.h"
#include "schemas/kvtier.capnp.h"
#include "schemas/peer.capnp.h"
#include "tests/fuzz/cold_fuzz_keys.h"
#include "tests/fuzz/peer_fuzz_world.h"
#include "tests/fuzz/rpc_calls.h"
#include "transport/lane_codec.h"
#include "transport/rpc_codec.h"

namespace kvtier::fuzz {
namespace {

std::filesystem::path outDir;

void write(const std::string& harness, const std::string& name, const std::string& bytes) {
  const auto dir = outDir / harness;
  std::filesystem::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + (dir / name).string());
}

// A builder whose first segment holds any seed's parameters.
struct Params {
  capnp::MallocMessageBuilder message{kMaxParamBytes / sizeof(capnp::word)};
  template <typename T>
  typename T::Builder init() {
    return message.initRoot<T>();
  }
};

// --- client -> daemon. Interfaces as daemon_rpc_fuzz.cc lists them.
enum DaemonInterface : uint8_t { kDaemon, kSession, kSpace, kWriteLease, kReadLease };

Layout tinyLayout() { return Layout{"test/tiny", 4, 2, 32, DType::kFloat16, 16, {}}; }

void fillTokens(capnp::List<uint32_t>::Builder out, uint32_t seed) {
  for (uint32_t i = 0; i < out.size(); ++i) out.set(i, seed * 7919 + i);
}

// hello (cap 1: the session), open (cap 2: the space).
std::string openConversation(uint32_t protocolVersion = rpc::PROTOCOL_VERSION) {
  std::string out(1, '\0');  // mode: calls
  {
    Params p;
    auto hello = p.init<rpc::Daemon::HelloParams>();
    hello.setProtocolVersion(protocolVersion);
    hello.setClientName("fuzz");
    appendCall(out, 0, kDaemon, 0, p.message);
  }
  {
    Params p;
    auto open = p.init<rpc::Session::OpenParams>();
    layoutToRpc(tinyLayout(), open.initLayout());
    open.setDevice(-1);
    appendCall(out, 1, kSession, 0, p.message);
  }
  return out;
}

// put of `tokens` tokens of sequence `seq` at `begin` (the next cap: its write lease).
void appendPut(std::string& out, const char* seq, uint64_t begin, uint32_t tokens, uint32_t seed) {
  Params p;
  auto put = p.init<rpc::Space::PutParams>();
  put.setSeq(seq);
  put.setBegin(begin);
  fillTokens(put.initTokens(tokens), seed);
  appendCall(out, 2, kSpace, 0, p.message);
}

void appendCommit(std::string& out, uint8_t lease) {
  Params p;
  p.init<rpc::WriteLease::CommitParams>().setUpTo(UINT64_MAX);
  appendCall(out, lease, kWriteLease, 1, p.message);
}

void appendSeqCall(std::string& out, uint8_t method, const char* seq, uint64_t a, uint64_t b) {
  Params p;
  switch (method) {
    case 1: {
      auto get = p.init<rpc::Space::GetParams>();
      get.setSeq(seq);
      get.setBegin(a);
      get.setEnd(b);
      get.setInline(true);
      break;
    }
    case 4: {
      auto remove = p.init<rpc::Space::RemoveParams>();
      remove.setSeq(seq);
      remove.setBegin(a);
      remove.setEnd(b);
      break;
    }
    case 5: {
      auto truncate = p.init<rpc::Space::TruncateParams>();
      truncate.setSeq(seq);
      truncate.setLen(a);
      break;
    }
    case 6: {
      auto resume = p.init<rpc::Space::CanResumeParams>();
      resume.setSeq(seq);
      resume.setPos(a);
      break;
    }
    case 7:
      p.init<rpc::Space::LengthParams>().setSeq(seq);
      break;
    case 9: {
      auto snapshot = p.init<rpc::Space::SnapshotParams>();
      snapshot.setSeq(seq);
      snapshot.setFrom(a);
      break;
    }
    default:
      throw std::runtime_error("no seed for this method");
  }
  appendCall(out, 2, kSpace, method, p.message);
}

template <typename T>
void appendEmpty(std::string& out, uint8_t target, uint8_t interface, uint8_t method) {
  Params p;
  p.init<T>();
  appendCall(out, target, interface, method, p.message);
}

void daemonSeeds() {
  const std::string harness = "daemon_rpc";
  {
    // put, commit, lookup, get, release, length, snapshot, copy, truncate, remove, stats.
    std::string s = openConversation();
    appendPut(s, "s", 0, 40, 1);  // cap 3
    appendCommit(s, 3);
    {
      Params p;
      auto lookup = p.init<rpc::Space::LookupParams>();
      fillTokens(lookup.initTokens(40), 1);
      lookup.setBindSeq("t");
      lookup.setRemote(rpc::RemoteMode::LOCAL_ONLY);
      appendCall(s, 2, kSpace, 2, p.message);  // cap 4: its read lease
    }
    appendSeqCall(s, 1, "s", 0, UINT64_MAX);  // get inline: cap 5
    appendEmpty<rpc::ReadLease::ReleaseParams>(s, 4, kReadLease, 0);
    appendSeqCall(s, 7, "s", 0, 0);
    appendSeqCall(s, 6, "s", 32, 0);
    appendSeqCall(s, 9, "s", 16, 0);
    {
      Params p;
      auto copy = p.init<rpc::Space::CopyPrefixParams>();
      copy.setSrc("s");
      copy.setDst("u");
      copy.setLen(32);
      appendCall(s, 2, kSpace, 3, p.message);
    }
    appendSeqCall(s, 5, "u", 20, 0);
    appendSeqCall(s, 4, "s", 16, 32);
    appendEmpty<rpc::Session::StatsParams>(s, 1, kSession, 1);
    write(harness, "put_lookup_get", s);
  }
  {
    // An inline write of a whole block, a partial commit, then reads by reference.
    std::string s = openConversation();
    appendPut(s, "w", 0, 20, 2);  // cap 3
    {
      Params p;
      auto w = p.init<rpc::WriteLease::WriteParams>();
      w.setBlock(0);
      w.setFirstSlot(0);
      w.setSlots(16);
      auto data = w.initData(static_cast<uint32_t>(tinyLayout().blockBytes()));
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 31);
      appendCall(s, 3, kWriteLease, 0, p.message);
    }
    {
      Params p;
      p.init<rpc::WriteLease::CommitParams>().setUpTo(16);
      appendCall(s, 3, kWriteLease, 1, p.message);
    }
    appendSeqCall(s, 1, "w", 0, 16);  // get inline: cap 4
    {
      Params p;
      auto read = p.init<rpc::Space::ReadParams>();
      auto ref = read.initRefs(1)[0];
      ref.setExtent(0);
      ref.setOffset(0);
      ref.setBytes(static_cast<uint32_t>(tinyLayout().blockBytes()));
      ref.setGeneration(1);
      appendCall(s, 2, kSpace, 8, p.message);
    }
    appendEmpty<rpc::WriteLease::AbortParams>(s, 3, kWriteLease, 2);
    write(harness, "inline_write_read", s);
  }
  {
    // Entries and checkpoints: blob leases, blob writes, commits, reads.
    std::string s = openConversation();
    {
      Params p;
      auto put = p.init<rpc::Space::PutEntryParams>();
      auto key = put.initKey(16);
      for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(i);
      put.setBytes(1000);
      appendCall(s, 2, kSpace, 18, p.message);  // cap 3
    }
    {
      Params p;
      auto w = p.init<rpc::WriteLease::WriteBlobParams>();
      w.setOffset(0);
      auto data = w.initData(1000);
      for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i);
      appendCall(s, 3, kWriteLease, 3, p.message);
    }
    appendCommit(s, 3);
    {
      Params p;
      auto get = p.init<rpc::Space::GetEntryParams>();
      auto key = get.initKey(16);
      for (size_t i = 0; i < key.size(); ++i) key[i] = static_cast<uint8_t>(i);
      get.setInline(true);
      appendCall(s, 2, kSpace, 19, p.message);  // cap 4
    }
    appendPut(s, "c", 0, 32, 3);  // cap 5
    appendCommit(s, 5);
    {
      Params p;
      auto put = p.init<rpc::Space::PutCheckpointParams>();
      put.setSeq("c");
      put.setPos(32);
      put.setBytes(500);
      appendCall(s, 2, kSpace, 15, p.message);  // cap 6
    }
    appendCommit(s, 6);
    {
      Params p;
      auto get = p.init<rpc::Space::GetCheckpointParams>();
      get.setSeq("c");
      get.setPos(32);
      get.setInline(true);
      appendCall(s, 2, kSpace, 16, p.message);  // cap 7
    }
    {
      Params p;
      p.init<rpc::Space::CheckpointsParams>().setSeq("c");
      appendCall(s, 2, kSpace, 17, p.message);
    }
    write(harness, "entries_checkpoints", s);
  }
  {
    // Snapshots: take, split, merge, restore, drop; a lease let go before its commit.
    std::string s = openConversation();
    appendPut(s, "s", 0, 64, 4);  // cap 3
    appendCommit(s, 3);
    appendSeqCall(s, 9, "s", 0, 0);
    {
      Params p;
      auto split = p.init<rpc::Space::SplitSnapshotParams>();
      split.setSnapshot(1);
      split.setAt(32);
      appendCall(s, 2, kSpace, 12, p.message);
    }
    {
      Params p;
      auto merge = p.init<rpc::Space::MergeSnapshotsParams>();
      merge.setA(2);
      merge.setB(3);
      appendCall(s, 2, kSpace, 11, p.message);
    }
    {
      Params p;
      auto restore = p.init<rpc::Space::RestoreParams>();
      restore.setSeq("r");
      restore.setSnapshot(1);
      restore.setTarget(48);
      appendCall(s, 2, kSpace, 10, p.message);
    }
    {
      Params p;
      p.init<rpc::Space::SnapshotInfoParams>().setSnapshot(4);
      appendCall(s, 2, kSpace, 13, p.message);
    }
    {
      Params p;
      p.init<rpc::Space::DropSnapshotParams>().setSnapshot(1);
      appendCall(s, 2, kSpace, 14, p.message);
    }
    appendPut(s, "s", 64, 16, 5);  // cap 4
    appendDrop(s, 4);
    appendEmpty<rpc::Session::ClusterParams>(s, 1, kSession, 2);
    write(harness, "snapshots_dropped_lease", s);
  }
  write(harness, "wrong_protocol_version", openConversation(rpc::PROTOCOL_VERSION + 1));
  {
    // Raw mode: the RPC stream itself, a bootstrap and a hello.
    std::string s(1, '\1');
    auto frame = [&s](capnp::MessageBuilder& m) {
      auto words = capnp::messageToFlatArray(m);
      s.append(reinterpret_cast<const char*>(words.asBytes().begin()), words.asBytes().size());
    };
    {
      capnp::MallocMessageBuilder m;
      m.initRoot<capnp::rpc::Message>().initBootstrap().setQuestionId(0);
      frame(m);
    }
    {
      capnp::MallocMessageBuilder m;
      auto call = m.initRoot<capnp::rpc::Message>().initCall();
      call.setQuestionId(1);
      call.initTarget().initPromisedAnswer().setQuestionId(0);
      call.setInterfaceId(Interface::of<rpc::Daemon>().id);
      call.setMethodId(0);
      auto hello = call.initParams().getContent().initAs<rpc::Daemon::HelloParams>();
      hello.setProtocolVersion(rpc::PROTOCOL_VERSION);
      hello.setClientName("raw");
      frame(m);
    }
    write(harness, "raw_bootstrap_hello", s);
  }
}

// --- daemon <-> daemon. Interfaces as peer_rpc_fuzz.cc lists them.
enum PeerInterface : uint8_t { kGate, kPeer, kPinLease };

std::string authenticate(const std::string& token) {
  std::string out;
  Params p;
  auto auth = p.init<rpc::peer::PeerGate::AuthenticateParams>();
  auth.setToken(capnp::Data::Reader(reinterpret_cast<const uint8_t*>(token.data()), token.size()));
  auth.setProtocolVersion(rpc::peer::PEER_PROTOCOL_VERSION);
  auth.setNodeId("fuzz-peer");
  auth.setAddress("127.0.0.1:9");
  appendCall(out, 0, kGate, 0, p.message);  // cap 1: the Peer
  return out;
}

void setKeys(capnp::Data::Builder out, uint32_t first) {
  for (uint32_t b = 0; b * 16 < out.size(); ++b) {
    const Key128 k = worldKey(first + b);
    std::memcpy(out.begin() + b * 16, k.bytes.data(), 16);
  }
}

void setSalt(capnp::Data::Builder out) {
  const Salt salt = worldSalt();
  std::memcpy(out.begin(), salt.data(), salt.size());
}

void peerSeeds() {
  const std::string harness = "peer_rpc";
  {
    // ping, publish, whoHolds, pin and release, transportInfo, members.
    std::string s = authenticate(kFuzzToken);
    appendEmpty<rpc::peer::Peer::PingParams>(s, 1, kPeer, 0);
    {
      Params p;
      auto publish = p.init<rpc::peer::Peer::PublishParams>();
      auto group = publish.initAdd(1)[0];
      group.initSpace().setFingerprint(worldLayout().fingerprint());
      setSalt(group.getSpace().initSalt(16));
      setKeys(group.initKeys(2 * 16), 0);
      publish.initWithdraw(0);
      appendCall(s, 1, kPeer, 1, p.message);
    }
    {
      Params p;
      auto who = p.init<rpc::peer::Peer::WhoHoldsParams>();
      who.initSpace().setFingerprint(worldLayout().fingerprint());
      setSalt(who.getSpace().initSalt(16));
      setKeys(who.initKeys(kWorldBlocks * 16), 0);
      appendCall(s, 1, kPeer, 2, p.message);
    }
    {
      Params p;
      auto pin = p.init<rpc::peer::Peer::PinParams>();
      layoutToRpc(worldLayout(), pin.initLayout());
      setSalt(pin.initSalt(16));
      setKeys(pin.initKeys(kWorldBlocks * 16), 0);
      pin.setLeaseMs(500);
      appendCall(s, 1, kPeer, 3, p.message);  // cap 2: the pin lease
    }
    appendEmpty<rpc::peer::PinLease::ReleaseParams>(s, 2, kPinLease, 0);
    appendEmpty<rpc::peer::Peer::TransportInfoParams>(s, 1, kPeer, 4);
    appendEmpty<rpc::peer::Peer::MembersParams>(s, 1, kPeer, 6);
    write(harness, "publish_pin_release", s);
  }
  {
    // Snapshots by id, a pin kept to the end (the connection's end releases it).
    std::string s = authenticate(kFuzzToken);
    {
      Params p;
      auto manifest = p.init<rpc::peer::Peer::SnapshotManifestParams>();
      manifest.initSpace().setFingerprint(worldLayout().fingerprint());
      setSalt(manifest.getSpace().initSalt(16));
      manifest.setId(1);
      appendCall(s, 1, kPeer, 5, p.message);
    }
    {
      Params p;
      auto pin = p.init<rpc::peer::Peer::PinSnapshotParams>();
      layoutToRpc(worldLayout(), pin.initLayout());
      setSalt(pin.initSalt(16));
      pin.setId(1);
      pin.setLeaseMs(500);
      appendCall(s, 1, kPeer, 7, p.message);
    }
    {
      Params p;
      auto drop = p.init<rpc::peer::Peer::DropSnapshotParams>();
      layoutToRpc(worldLayout(), drop.initLayout());
      setSalt(drop.initSalt(16));
      drop.setId(1);
      appendCall(s, 1, kPeer, 8, p.message);
    }
    {
      Params p;
      auto pin = p.init<rpc::peer::Peer::PinParams>();
      layoutToRpc(worldLayout(), pin.initLayout());
      setSalt(pin.initSalt(16));
      setKeys(pin.initKeys(2 * 16), 0);
      pin.setLeaseMs(500);
      appendCall(s, 1, kPeer, 3, p.message);
    }
    write(harness, "snapshots_pin_held", s);
  }
  {
    // Calls before authenticating, then a wrong token.
    std::string s;
    appendEmpty<rpc::peer::Peer::PingParams>(s, 0, kPeer, 0);
    s += authenticate(std::string(kFuzzToken) + "x");
    appendEmpty<rpc::peer::Peer::PingParams>(s, 1, kPeer, 0);
    write(harness, "unauthenticated", s);
  }
}

// --- cold tier: a real record (read back raw from a ColdTier) and a real manifest.
void coldSeeds(const std::filesystem::path& scratch) {
  const std::string harness = "cold_record";
  auto tier = ColdTier::open({.path = (scratch / "cold").string()});
  if (!tier) throw std::runtime_error("cold tier: " + tier.error().message());
  std::vector<uint8_t> payload(64);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
  const ColdKey key = fuzzColdKey();
  const ColdRecord record{key, payload.data(), static_cast<uint32_t>(payload.size())};
  if (auto s = (*tier)->putBatch(std::span<const ColdRecord>(&record, 1)); !s) {
    throw std::runtime_error("put: " + s.error().message());
  }
  std::string value;
  auto status =
      (*tier)->rawDb()->Get(rocksdb::ReadOptions(), (*tier)->blocksFamily(), key.encode(), &value);
  if (!status.ok()) throw std::runtime_error("raw read: " + status.ToString());
  write(harness, "record", std::string(1, '\0') + value);

  SnapshotManifest m;
  m.id = kFuzzSnapshotId;
  m.fingerprint = kFuzzFingerprint;
  m.salt = fuzzSalt();
  m.blockTokens = 16;
  m.blockBytes = 1024;
  m.from = 0;
  m.to = 40;
  for (uint32_t t = 0; t < 40; ++t) m.tokens.push_back(t);
  m.keys = {key.key, key.key};
  m.blocks = {ManifestBlock{ManifestBlock::Kind::kSealed, key.key},
              ManifestBlock{ManifestBlock::Kind::kSealed, key.key},
              ManifestBlock{ManifestBlock::Kind::kOwn, {}}};
  m.checkpoints = {ManifestCheckpoint{40, 100}};
  if (auto s = checkManifest(m); !s) throw std::runtime_error("manifest: " + s.error().message());
  const std::string encoded = encodeManifest(m);
  write(harness, "manifest", std::string(1, '\1') + encoded.substr(8));  // the harness seals it
  write(harness, "manifest_stored", std::string(1, '\4') + encoded);     // 4 % 3 == 1: as stored
  write(harness, "key", std::string(1, '\2') + key.encode());
}

std::string joinArgs(const std::vector<std::string>& args) {
  std::string out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (i > 0) out.push_back('\0');
    out += args[i];
  }
  return out;
}

void configSeeds() {
  const std::string harness = "config";
  write(harness, "typical",
        joinArgs({"--data-dir", "/var/lib/kvtier", "--host-pool-bytes", "64G", "--cold-tier", "on",
                  "--disk-bytes=512GiB", "--gpus", "0,1", "--gpu-pool-bytes", "8G",
                  "--metrics-addr", "127.0.0.1:9400", "--busy-poll-us", "50"}));
  write(harness, "cluster",
        joinArgs({"--listen",
                  "0.0.0.0:7400",
                  "--advertise",
                  "10.0.0.5:7400",
                  "--cluster-token-file",
                  "/etc/kvtier/token",
                  "--etcd",
                  "http://127.0.0.1:2379",
                  "--cluster",
                  "prod",
                  "--node-id",
                  "node-a",
                  "--peer-timeout-ms",
                  "2000",
                  "--pin-lease-ms",
                  "5000",
                  "--etcd-lease-ttl",
                  "5",
                  "--peers",
                  "10.0.0.6:7400,10.0.0.7:7400"}));
  write(harness, "sizes",
        joinArgs({"--host-pool-bytes", "18446744073709551615K", "--extent-bytes", "1Ti",
                  "--flush-on-exit", "off", "--eviction", "lru", "--help"}));
}

void traceSeeds() {
  write("trace_line", "mooncake",
        "{\"timestamp\": 0, \"input_length\": 6955, \"output_length\": 52, \"hash_ids\": [46, 47, "
        "48, 49, 50]}\n"
        "{\"timestamp\": 27, \"input_length\": 6472, \"output_length\": 26, \"hash_ids\": [46, 47, "
        "2353, 2354]}\n"
        "\n"
        "{\"timestamp\": 30, \"input_length\": 16, \"output_length\": 1, \"hash_ids\": [7]}\n");
  write("trace_line", "bad_lines",
        "{\"timestamp\": -1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n"
        "{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": []}\n");
}

// daemon_rpc's lane mode (first byte 0xF0): frames written to the session's fast lane after the
// harness committed the 40 tokens of fillTokens(1) as space 1's sequence "s".
void laneSeeds() {
  const std::string harness = "daemon_rpc";
  const auto frames = [](std::vector<uint8_t> bytes) {
    return std::string(1, '\xF0') + std::string(bytes.begin(), bytes.end());
  };
  std::vector<uint32_t> tokens(40);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = 7919 + i;
  {
    // A hit, its release (leases are numbered from 1 in a fresh engine), a miss, a sync.
    std::vector<uint8_t> f;
    lane::appendLookup(f, 1, 1, 1, tokens, {});
    lane::appendRelease(f, std::vector<uint64_t>{1});
    lane::appendLookup(f, 2, 1, 0, std::vector<uint32_t>(tokens.begin(), tokens.begin() + 20), {});
    lane::appendSync(f, 3);
    write(harness, "lane_lookup_release_sync", frames(f));
  }
  {
    // Lookups by keys, of an unknown space, with a bad remote mode; a release of leases the lane
    // does not hold; then a frame with an unknown op, which ends the lane.
    std::vector<uint8_t> f;
    Key128 k;
    for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(i);
    lane::appendLookup(f, 1, 1, 1, {}, std::vector<Key128>{k, k});
    lane::appendLookup(f, 2, 9, 1, tokens, {});
    lane::appendLookup(f, 3, 1, 7, tokens, {});
    lane::appendRelease(f, std::vector<uint64_t>{77, 1u << 31});
    lane::Header bad{0, 0x7f, 0, 4};
    const auto* b = reinterpret_cast<const uint8_t*>(&bad);
    f.insert(f.end(), b, b + sizeof bad);
    write(harness, "lane_bad_requests", frames(f));
  }
  {
    // A put and its commit (the harness's own put took write lease 1), a put committed past its
    // grant and then aborted, a commit of the aborted lease, a put of another space, a sync.
    std::vector<uint8_t> f;
    lane::appendPut(f, 1, {1, "t", 0, tokens, {}});
    lane::appendCommit(f, 2, {2, ~uint64_t{0}, {}});
    lane::appendPut(
        f, 3, {1, "s", 40, std::vector<uint32_t>(tokens.begin(), tokens.begin() + 9), {}, true});
    lane::appendCommit(f, 4, {3, 100, {7}});
    lane::appendAbort(f, std::vector<uint64_t>{3, 99});
    lane::appendCommit(f, 5, {3, ~uint64_t{0}, {}});
    lane::appendPut(f, 6, {9, "u", 0, tokens, {}});
    lane::appendSync(f, 7);
    write(harness, "lane_put_commit_abort", frames(f));
  }
}

// --- the fast lane's codec alone (lane_codec_fuzz.cc): byte 0 picks the decoder.
std::string bodyOf(const std::vector<uint8_t>& frame) {
  return std::string(frame.begin() + sizeof(lane::Header), frame.end());
}

void laneCodecSeeds() {
  const std::string harness = "lane_codec";
  std::vector<uint32_t> tokens(40);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = 7919 + i;
  Key128 k;
  for (size_t i = 0; i < k.bytes.size(); ++i) k.bytes[i] = static_cast<uint8_t>(i);
  std::vector<uint8_t> f;
  lane::appendLookup(f, 1, 1, 1, tokens, std::vector<Key128>{k});
  write(harness, "lookup", std::string(1, '\0') + bodyOf(f));
  f.clear();
  lane::appendPut(f, 1, {1, "seq", 16, tokens, std::vector<Key128>{k, k}, true, 64, 32});
  write(harness, "put", std::string(1, '\1') + bodyOf(f));
  f.clear();
  lane::appendCommit(f, 1, {5, 40, {1, 2}});
  write(harness, "commit", std::string(1, '\2') + bodyOf(f));
  f.clear();
  lane::appendRelease(f, std::vector<uint64_t>{1, 2, 3});
  write(harness, "release", std::string(1, '\3') + bodyOf(f));
  const BlockLocation block{0, 16384, 16384, 3};
  f.clear();
  lane::appendLookupReply(f, 1, {32, 9, {block, block}, {11, 12}});
  write(harness, "lookup_reply", std::string(1, '\4') + bodyOf(f));
  f.clear();
  lane::appendPutReply(f, 1, {0, 4, {block}});
  write(harness, "put_reply", std::string(1, '\5') + bodyOf(f));
  f.clear();
  lane::appendCommitReply(f, 1, {40, 2});
  write(harness, "commit_reply", std::string(1, '\6') + bodyOf(f));
  f.clear();
  lane::appendErrorReply(f, lane::kLookup, 1, Error(ErrorCode::kNotFound, "no such space"));
  write(harness, "error_reply", std::string(1, '\4') + bodyOf(f));
  f.clear();
  lane::appendPut(f, 2, {1, "s", 0, tokens, {}});
  write(harness, "framed_put", std::string(1, '\7') + std::string(f.begin(), f.end()));
}

// --- a layout as a client sends it (layout_fuzz.cc): a flat Cap'n Proto message.
void layoutSeeds() {
  const std::string harness = "layout";
  const auto flat = [](const Layout& layout) {
    capnp::MallocMessageBuilder message;
    layoutToRpc(layout, message.initRoot<rpc::Layout>());
    const auto words = capnp::messageToFlatArray(message);
    const auto bytes = words.asBytes();
    return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  };
  write(harness, "tiny", flat(tinyLayout()));
  Layout llama{"llama.cpp/llama/f16-f16/0123456789abcdef0123456789abcdef01234567",
               16,
               8,
               64,
               DType::kFloat16,
               64,
               {}};
  write(harness, "llama", flat(llama));
  Layout hybrid = llama;
  hybrid.modelId = "llama.cpp/lfm2/f16-f16/0123456789abcdef0123456789abcdef01234567";
  hybrid.dtype = DType::kInt8;
  hybrid.stateBytes = 70 << 10;
  write(harness, "hybrid", flat(hybrid));
}

// --- llama.cpp sequence states (llama_state_fuzz.cc): kind, streams - 1, window, then the state.
void llamaStateSeeds() {
  using namespace kvtier::llama;
  const std::string harness = "llama_state";
  const StateShape full{2, 1, 1, 64, 64, false, 0, 0};
  const StateShape transposed{2, 1, 1, 64, 64, true, 2, 32};
  const auto prefix = [](uint8_t kind, uint8_t nSwa) {
    return std::string{static_cast<char>(kind), '\0', static_cast<char>(nSwa)};
  };
  const auto kvState = [](const StateShape& shape, uint32_t cells) {
    std::vector<uint8_t> state(seqStateBytes(shape, cells, 1));
    buildSeqState(state, shape, cells, 1, 0, 0);
    return std::string(state.begin(), state.end());
  };
  // One recurrent cell (llama-memory-recurrent.cpp state_write): cell count 1, its position, no
  // sequence, then the conv and SSM rows (opaque here).
  const auto recurrent = [](int32_t pos) {
    std::string out(12 + 256, '\0');
    const uint32_t one = 1;
    std::memcpy(out.data(), &one, 4);
    std::memcpy(out.data() + 4, &pos, 4);
    return out;
  };
  write(harness, "kv", prefix(0, 0) + kvState(full, 4));
  write(harness, "kv_transposed", prefix(0, 0) + kvState(transposed, 4));
  {
    // iSWA: header, the base section (every cell), the SWA section (the window's cells).
    std::vector<uint8_t> state(kSeqHeaderBytes + kvSectionBytes(full, 6, 1) +
                               kvSectionBytes(full, 2, 1));
    writeSeqHeader(state, 0);
    writeKvSection(state, kSeqHeaderBytes, full, 6, 1, 0, 0);
    writeKvSection(state, kSeqHeaderBytes + kvSectionBytes(full, 6, 1), full, 2, 1, 0, 4);
    write(harness, "iswa", prefix(1, 2) + std::string(state.begin(), state.end()));
  }
  {
    std::vector<uint8_t> header(kSeqHeaderBytes);
    writeSeqHeader(header, 0);
    write(harness, "recurrent",
          prefix(2, 0) + std::string(header.begin(), header.end()) + recurrent(5));
  }
  write(harness, "hybrid", prefix(3, 0) + kvState(full, 6) + recurrent(5));
}

}  // namespace
}  // namespace kvtier::fuzz

int main(int argc, char** argv) {
  using namespace kvtier::fuzz;
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  outDir = argv[1];
  char tmpl[] = "/tmp/kvtier-fuzz-seeds-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const std::filesystem::path scratch = tmpl;
  int rc = 0;
  try {
    daemonSeeds();
    laneSeeds();
    peerSeeds();
    coldSeeds(scratch);
    configSeeds();
    traceSeeds();
    laneCodecSeeds();
    layoutSeeds();
    llamaStateSeeds();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    rc = 1;
  }
  std::error_code ignored;
  std::filesystem::remove_all(scratch, ignored);
  return rc;
}
