# kvtier daemon <-> daemon protocol (TCP, Cap'n Proto RPC): the cluster's control plane.
#
# Separate from the client protocol (kvtier.capnp): peers never get a Session, and clients never
# get a Peer. The KV bytes do not travel in these messages: a fetcher pins blocks on their holder
# and reads them with UCX (ucp_get_nbx) straight from the holder's registered pool extents.
#
# Every list and size below is bounded by the receiving daemon (daemon/cluster/peer_limits.h); a
# call that exceeds a bound fails with invalidArgument and changes nothing.

@0xd1c5b6e3a0f2c4e7;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kvtier::rpc::peer");

using Kv = import "kvtier.capnp";

const peerProtocolVersion :UInt32 = 2;

struct Namespace {
  # Blocks are shared only inside one namespace: (layout fingerprint, tenant salt).
  fingerprint @0 :UInt64;
  salt @1 :Data;            # 16 bytes
}

struct KeyGroup {
  # Block keys of one namespace, packed: 16 bytes each.
  space @0 :Namespace;
  keys @1 :Data;
  unders @2 :Data;
  # In a publish: for each key, the anchor it is filed under (16 bytes each, as many as keys):
  # the directory's entry is (key, anchor), at the anchor's home (daemon/cluster/directory.h).
  own @3 :Data;
  # In a publish: one byte per key, 1 where the anchor is the key's own segment's (each key has
  # one such entry: the homes count distinct keys by them).
}

struct PinnedBlock {
  extent @0 :UInt32;        # the holder's extent id (see transportInfo)
  offset @1 :UInt64;        # byte offset inside the extent
  bytes @2 :UInt32;
  checksum @3 :UInt64;      # xxh3-64 of the block's bytes, checked by the fetcher before sealing
  key @4 :Data;             # the block key it holds: the fetcher checks it against the one it asked for
  under @5 :Data;           # the anchors the holder files the block under (16 bytes each; empty:
                            # unknown): the fetcher files its copy the same
}

struct RemoteExtent {
  id @0 :UInt32;
  address @1 :UInt64;       # the extent's base address in the holder's process (what gets name)
  bytes @2 :UInt64;
  rkey @3 :Data;            # no longer sent: a fetcher asks the holder for bytes (active messages)
}

struct HotAnchor {
  # An anchor whose home answers many who-holds queries: askers skip it when a later anchor of
  # their chain is not hot, and take its holders from here.
  space @0 :Namespace;
  anchor @1 :Data;          # 16 bytes
  holders @2 :List(Text);   # the nodes that hold the anchor's block, newest last
}

struct Member {
  nodeId @0 :Text;
  address @1 :Text;         # HOST:PORT of its peer listener
  up @2 :Bool;
}

interface PeerGate {
  # The bootstrap capability of a peer connection. Nothing but authenticate is offered; a
  # connection that does not authenticate within the peer timeout is dropped.
  authenticate @0 (token :Data, protocolVersion :UInt32, nodeId :Text, address :Text)
      -> (peer :Peer, nodeId :Text, protocolVersion :UInt32);
  # `token`: the cluster token (compared in constant time); a wrong one is permissionDenied and
  # the connection is dropped. `nodeId`, `address`: the caller's identity and listener.
}

interface Peer {
  ping @0 () -> (nodeId :Text, hot :List(HotAnchor), queries :UInt64);
  # `hot`: the anchors this node is home for that are hot now (sent with every heartbeat).
  # `queries`: the who-holds queries it has answered: an asker sends its query to the least loaded
  # of an anchor's homes.

  publish @1 (add :List(KeyGroup), withdraw :List(KeyGroup)) -> ();
  # The caller holds the keys of `add` (in any tier) and no longer holds those of `withdraw`,
  # each filed under its anchor (KeyGroup.unders). Sent to the anchors' home (the consistent-hash
  # ring of the live members), in batches.

  whoHolds @2 (space :Namespace, keys :Data, under :Data)
      -> (nodes :List(Text), holders :List(UInt64), hot :Bool, anchorHolders :List(Text));
  # For each key (packed, 16 bytes each) filed under anchor `under` (16 bytes), a bit mask of the
  # `nodes` that hold it, as far as this home knows; the list stops after the last key anyone
  # holds. `hot`: `under` is hot (this query or earlier ones made it so), and `anchorHolders`
  # hold it (as a heartbeat's HotAnchor says).

  pin @3 (layout :Kv.Layout, salt :Data, keys :Data, leaseMs :UInt32)
      -> (lease :PinLease, blocks :List(PinnedBlock), grant :Data);
  # `grant` (16 bytes): the token the caller names in its UCX gets of these blocks; the holder
  # answers a get only for bytes a live grant covers (until the lease ends).
  # Pins the longest prefix of `keys` that this node holds, in memory (blocks only on disk are
  # read back first), for at most leaseMs (or until the lease is released or dropped), and
  # describes where each block lies in the extents of transportInfo.

  transportInfo @4 () -> (workerAddress :Data, extents :List(RemoteExtent), transports :Text,
                          ucxPort :UInt16);
  # This node's UCX listener port (on the host of its peer address: a fetcher connects there) and
  # the bounds of its pool extents (a fetcher asks for bytes inside them). workerAddress: no longer
  # sent (endpoints are made through the listener only).

  snapshotManifest @5 (space :Namespace, id :UInt64) -> (manifest :Data);
  # The encoded manifest of snapshot `id` (daemon/snapshot_codec.h), from memory or disk.

  members @6 () -> (members :List(Member));
  # The members this node sees (for `kvtier cluster`).

  pinSnapshot @7 (layout :Kv.Layout, salt :Data, id :UInt64, leaseMs :UInt32)
      -> (manifest :Data, lease :PinLease, parts :List(PinnedBlock), grant :Data);
  # `grant`: as pin's, for the parts.
  # Snapshot `id` of the namespace (read back from disk first if memory does not hold it): its
  # encoded manifest, and where the bytes of each manifest block (a released one: bytes 0) and
  # then of each checkpoint lie, with their xxh3 (keys are empty), pinned as for pin().

  dropSnapshot @8 (layout :Kv.Layout, salt :Data, id :UInt64) -> ();
  # Drops snapshot `id` from memory and disk (the last step of a move). notFound if absent.

  take @9 (layout :Kv.Layout, salt :Data, snapshot :UInt64, keys :Data, from :Text)
      -> (snapshot :UInt64, blocks :UInt32);
  # A drain hands over: this node pulls snapshot `snapshot` (when not 0) of node `from` and keeps
  # it as a snapshot of its own (the answer's id), and fetches the blocks `keys` (packed) from
  # `from`; `blocks` is how many it now holds.
}

interface PinLease {
  release @0 () -> ();
}
