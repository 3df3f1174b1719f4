// The launch functions kernels/cuda/kernels.cu defines: the boundary between nvcc-compiled code and
// the host code in kernels/gpu.cc (compiled by the C++ compiler). Device pointers only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/paged_copy.h"

namespace kvtier::kernels::gpu::detail {

// `c`'s tables must be readable by the device. `alignment` from pagedCopyAlignment.
cudaError_t pagedCopy(bool scatter, const PagedKv& kv, const PagedCopy& c, uint32_t alignment,
                      cudaStream_t stream);

// Where a copy's tables go when they are small enough to travel in the kernel's launch
// parameters instead of through a staging copy (CUDA 12.1+ takes 32,764 bytes of parameters on
// Volta and later): no host-to-device copy to wait for before the kernel starts, and every thread
// block reads its table entries through the constant cache. Byte offsets of the three tables in
// the parameter block, each table running to the next offset (the last to `bytes`).
inline constexpr size_t kMaxInlineTableBytes = 32 * 1024 - 1024;
struct InlineLayout {
  size_t tensors = 0, poolBlocks = 0, blockTable = 0;  // 8-byte aligned
  size_t bytes = 0;                                    // <= kMaxInlineTableBytes
};
// As pagedCopy, with `hostTables`' tables in host memory: packed into the launch at `layout`.
cudaError_t pagedCopyInline(bool scatter, const PagedKv& kv, const PagedCopy& hostTables,
                            const InlineLayout& layout, uint32_t alignment, cudaStream_t stream);

struct RotateArgs {
  uint8_t* k = nullptr;               // [heads][headDim] elements, in device memory
  const float* cosSin = nullptr;      // half cosines, then half sines, in device memory
  uint64_t heads = 0;                 // tokens * kvHeads
  uint32_t headDim = 0, half = 0;     // half = rotaryDims / 2
  uint32_t dtype = 0, elemBytes = 0;  // DType value (fp16, bf16, fp32) and its size
  bool neox = true;
};
cudaError_t rotateK(const RotateArgs& args, cudaStream_t stream);

}  // namespace kvtier::kernels::gpu::detail
