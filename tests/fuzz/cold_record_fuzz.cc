// Fuzz harness: what the cold tier reads back from disk — block records (verifyColdRecord),
// snapshot manifests (decodeManifest) and record keys (ColdKey::decode). Every byte on disk is
// input: each must be answered (a payload or CHECKSUM_MISMATCH), never trusted.
//
// Input: its first byte picks the decoder (modulo 3), the rest is the stored value (a manifest is
// also tried behind its correct checksum, so that mutations get past it). Properties
// checked besides "no crash": an accepted record's payload lies inside the value and is as long as
// its header says; an accepted manifest encodes and decodes back to itself; a decoded key encodes
// back to the same bytes.
#include <xxhash.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "daemon/cold_tier.h"
#include "daemon/snapshot_codec.h"
#include "tests/fuzz/cold_fuzz_keys.h"

namespace {

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "kvtier fuzz: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier;
  using namespace kvtier::fuzz;
  if (size == 0) return 0;
  const std::string_view value(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0: {
      auto payload = verifyColdRecord(fuzzColdKey(), value);
      if (payload) {
        check(payload->data() >= value.data() &&
                  payload->data() + payload->size() == value.data() + value.size(),
              "a record's payload is not the value's tail");
      } else {
        check(payload.error().code() == ErrorCode::kChecksumMismatch,
              "a bad record is not CHECKSUM_MISMATCH");
      }
      break;
    }
    case 1: {
      // As stored, and with its checksum made right, so that mutations reach the parser.
      std::string sealed(8, '\0');
      const uint64_t sum = XXH3_64bits(value.data(), value.size());
      for (int i = 0; i < 8; ++i) sealed[i] = static_cast<char>(sum >> (8 * i));
      sealed.append(value);
      for (std::string_view stored : {value, std::string_view(sealed)}) {
        auto m = decodeManifest(stored, kFuzzFingerprint, fuzzSalt(), kFuzzSnapshotId);
        if (m) {
          auto again =
              decodeManifest(encodeManifest(*m), kFuzzFingerprint, fuzzSalt(), kFuzzSnapshotId);
          check(again.ok() && *again == *m, "a manifest does not survive encode/decode");
        } else {
          check(m.error().code() == ErrorCode::kChecksumMismatch,
                "a bad manifest is not CHECKSUM_MISMATCH");
        }
      }
      break;
    }
    default: {
      ColdKey key;
      if (ColdKey::decode(value, &key)) check(key.encode() == value, "a key does not round-trip");
      break;
    }
  }
  return 0;
}
