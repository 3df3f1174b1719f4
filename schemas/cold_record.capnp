# On-disk record header of the cold tier (RocksDB, column family "blocks").
#
# A record's value is: a 4-byte little-endian header size, this header as a flat Cap'n Proto
# message, then the block's bytes. A record whose header does not parse, does not name the key it
# is stored under, or whose bytes fail the xxh3 checksum is a miss (counted, deleted), never served.

@0xc1d5a3a7e0f2b641;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("kvtier::disk");

const formatVersion :UInt32 = 1;

struct ColdRecordHeader {
  formatVersion @0 :UInt32;
  fingerprint @1 :UInt64;   # the layout's
  salt @2 :Data;            # the tenant's (16 bytes)
  key @3 :Data;             # the block key (16 bytes)
  bytes @4 :UInt32;         # payload size
  checksum @5 :UInt64;      # xxh3-64 of the payload
}

# Snapshot manifests (column family "snapshots"), one per snapshot, keyed by (layout fingerprint,
# tenant salt, snapshot id). A manifest's value is an 8-byte little-endian xxh3-64 of the message
# followed by this struct as a flat Cap'n Proto message. A manifest whose checksum, format version,
# key or contents fail their checks is dropped (counted), never half-used.
# The snapshot's own records (partial or unindexed blocks, checkpoints) live in the same column
# family under (fingerprint, salt, id, slot), framed like block records (header above + bytes);
# their header's key is (id, slot, "snap"), so a record is never read under another name.

const manifestFormatVersion :UInt32 = 1;

struct SnapshotManifest {
  formatVersion @0 :UInt32;
  fingerprint @1 :UInt64;
  salt @2 :Data;                 # 16 bytes
  id @3 :UInt64;
  blockTokens @4 :UInt32;        # the layout's: checked against the namespace that restores it
  blockBytes @5 :UInt32;
  from @6 :UInt64;
  to @7 :UInt64;
  tokens @8 :List(UInt32);       # [0, to) of the sequence it came from
  keys @9 :List(Data);           # 16 bytes each: the keys of its full blocks [0, to / blockTokens)
  detached @10 :Bool;            # the options of the sequence it came from
  window @11 :UInt64;
  chunk @12 :UInt64;
  clientKeyed @13 :Bool;
  unindexed @14 :Bool;
  blocks @15 :List(SnapshotBlock);          # cover [from / blockTokens * blockTokens, to)
  checkpoints @16 :List(SnapshotCheckpoint); # by position; the i-th is own record slot 2^31 + i
}

struct SnapshotBlock {
  union {
    released @0 :Void;   # a sliding window released it
    sealed @1 :Data;     # its 16-byte content key: the bytes are that key's record in "blocks"
    own @2 :Void;        # a record of the snapshot's own; slot = the block's index
  }
}

struct SnapshotCheckpoint {
  position @0 :UInt64;
  bytes @1 :UInt32;
}
