// The data path against a raw copy on the same memory (put_write_vs_raw_pool_copy,
// get_copy_vs_raw_pool_copy and their unchecked twins in the local suite).
//
// A put's write and a get's copy move 16 MiB as runs of 16 KiB (one per layer, K or V, and block:
// the block layout), between the caller's packed buffer and pool blocks. Their anchor here does
// the same work on the same memory: plain code copying the same runs into the very blocks the put
// was granted (or out of the very blocks the lookup pinned), in the same process, right beside
// the SDK's copy into (out of) the same addresses, with the best of two methods: glibc memcpy and
// AVX2 streaming stores. What the SDK adds to a raw copy — the layout's loop, the writer's
// checksum fused into the write, the choice of copy method — is what the ratio shows, whatever
// this machine's memory is worth.
#pragma once

#include "bench/local_workload.h"
#include "kvtier/client.h"

namespace kvtier::bench {

// Seconds of each, over `iterations` fresh puts and as many gets of the prefix.
struct PoolCopySeconds {
  double write = 0, writeUnsummed = 0, copyOut = 0, copyOutUnchecked = 0;
  double rawInto[2] = {}, rawOut[2] = {};  // by method: memcpy, streaming (0: not run)
};

// Per iteration: a put's grant of 64 fresh blocks; into them the SDK's write with and without the
// writer's checksums and the raw copy by both methods, in an order that rotates; the grant
// aborted. Then a lookup of the prefix; out of its blocks copyTo and the raw copy by both
// methods, likewise. The anchor is the method faster over the whole repetition (not the faster
// of each pair, which would favour the anchor with the noise).
Result<PoolCopySeconds> timePoolCopies(Space& space, Workload& w, int iterations);

}  // namespace kvtier::bench
