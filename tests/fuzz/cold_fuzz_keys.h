// The names cold_record_fuzz.cc decodes its inputs under, shared with make_seeds.cc (whose seeds
// are records and manifests written under them).
#pragma once

#include <cstdint>

#include "daemon/cold_tier.h"

namespace kvtier::fuzz {

inline constexpr uint64_t kFuzzFingerprint = 0x6b76746965720001ull;
inline constexpr uint64_t kFuzzSnapshotId = 7;

inline Salt fuzzSalt() {
  Salt salt{};
  for (size_t i = 0; i < salt.size(); ++i) salt[i] = static_cast<uint8_t>(i + 1);
  return salt;
}

inline ColdKey fuzzColdKey() {
  ColdKey key{kFuzzFingerprint, fuzzSalt(), {}};
  for (size_t i = 0; i < key.key.bytes.size(); ++i)
    key.key.bytes[i] = static_cast<uint8_t>(0xa0 + i);
  return key;
}

}  // namespace kvtier::fuzz
