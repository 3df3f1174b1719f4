// Hooks for kvtier-bench only (not part of the SDK's API, not installed).
#pragma once

namespace kvtier::bench_hooks {

// With false, puts skip the writer's checksums altogether: writes copy without hashing and
// commits carry checksums of 0, which no block's bytes match — every later move of such a block
// (spill, peer fetch, snapshot pull) fails its check. It exists so the local suite can time a
// put with and without checksums in one run; nothing else may call it. Default true.
void setWriterChecksums(bool enabled);

// With false, ReadHandle::copyTo copies without checking blocks against their writer's checksums
// (as for a block that has none). For the local suite's figures of what the check costs, in the
// same run; nothing else may call it. Default true.
void setReaderChecks(bool enabled);

}  // namespace kvtier::bench_hooks
