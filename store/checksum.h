// The checksum of a block's bytes: xxh3-64 with seed 0 (the function kvtier verifies a block
// against on every move: promote from disk, fetch from a peer, snapshot pull). Its writer takes
// it once, fused into the copy that writes the block (kernels/block_sum.h computes the same
// value); the engine takes it itself only for bytes no writer summed.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvtier {

uint64_t blockChecksum(const void* data, size_t bytes);

}  // namespace kvtier
