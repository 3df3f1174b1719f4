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
