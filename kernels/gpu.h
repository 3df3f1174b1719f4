// The GPU side of kernels/: device discovery, paged KV scatter/gather launched from host-side
// pointer tables, and RoPE re-rotation of K in device memory. Built only with CUDA
// (KVTIER_HAVE_CUDA); every function reports CUDA's own error code and never aborts.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/paged_copy.h"
#include "kvtier/layout.h"

namespace kvtier::kernels::gpu {

// Usable CUDA devices: 0 without a driver or a device.
int deviceCount();
// Why no device is usable ("" when one is): for logs and for GPU tests that skip.
std::string noDeviceReason();

// Tables up to this size travel in the kernel's launch parameters (see PagedCopier).
inline constexpr size_t kInlineTableBytes = 31 * 1024;

// Launches paged copies whose pointer tables the caller holds in host memory (the pointers in
// them are device pointers, or host memory mapped for the device): one kernel on `stream`,
// asynchronously (the call returns once the work is queued). Tables of up to `inlineTableBytes`
// (a 4k-token prompt of a 80-layer model needs ~4 KiB) are passed in the launch itself; larger
// ones are staged into pinned memory and copied to the device ahead of the kernel, the staging
// reused once the previous call's copy of the tables has finished. One copier per thread (not
// thread-safe).
class PagedCopier {
 public:
  explicit PagedCopier(int device, size_t inlineTableBytes = kInlineTableBytes)
      : device_(device), inlineTableBytes_(inlineTableBytes) {}
  ~PagedCopier();
  PagedCopier(const PagedCopier&) = delete;
  PagedCopier& operator=(const PagedCopier&) = delete;

  cudaError_t scatter(const PagedKv& kv, const PagedCopy& hostTables, cudaStream_t stream) {
    return run(true, kv, hostTables, stream);
  }
  cudaError_t gather(const PagedKv& kv, const PagedCopy& hostTables, cudaStream_t stream) {
    return run(false, kv, hostTables, stream);
  }

 private:
  cudaError_t run(bool scatter, const PagedKv& kv, const PagedCopy& hostTables,
                  cudaStream_t stream);
  cudaError_t launch(bool scatter, const PagedKv& kv, const PagedCopy& hostTables,
                     cudaStream_t stream);
  cudaError_t reserve(size_t bytes);

  int device_;
  size_t inlineTableBytes_;
  uint8_t* hostStage_ = nullptr;    // pinned
  uint8_t* deviceStage_ = nullptr;  // device copy of the tables
  size_t capacity_ = 0;
  cudaEvent_t staged_ = nullptr;  // recorded after the last copy of the tables (host side free)
  cudaEvent_t done_ = nullptr;    // recorded after the last kernel (device side free)
};

// Rotates `tokens` tokens of K, packed [token][kvHead][headDim] in device memory, by `delta`
// positions, with the same cos/sin table and arithmetic as kernels::rotateK; synchronous.
cudaError_t rotateK(const Layout& layout, uint8_t* k, uint64_t tokens, int64_t delta,
                    cudaStream_t stream);

}  // namespace kvtier::kernels::gpu
