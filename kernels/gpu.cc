#include "kernels/gpu.h"

#include <cuda_runtime.h>

#include <cstring>

#include "kernels/gpu_launch.h"
#include "kernels/rope.h"

namespace kvtier::kernels::gpu {

static_assert(kInlineTableBytes <= detail::kMaxInlineTableBytes);

int deviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a missing driver
    return 0;
  }
  return n;
}

std::string noDeviceReason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
  }
  return n == 0 ? "no CUDA device on this machine" : "";
}

PagedCopier::~PagedCopier() {
  if (staged_) {
    cudaEventSynchronize(staged_);
    cudaEventDestroy(staged_);
  }
  if (done_) {
    cudaEventSynchronize(done_);
    cudaEventDestroy(done_);
  }
  cudaFreeHost(hostStage_);
  cudaFree(deviceStage_);
}

cudaError_t PagedCopier::reserve(size_t bytes) {
  if (bytes <= capacity_) return cudaSuccess;
  if (staged_) cudaEventSynchronize(staged_);
  cudaFreeHost(hostStage_);
  cudaFree(deviceStage_);
  hostStage_ = deviceStage_ = nullptr;
  capacity_ = 0;
  const size_t want = bytes < 4096 ? 4096 : bytes * 2;
  if (auto e = cudaMallocHost(&hostStage_, want); e != cudaSuccess) return e;
  if (auto e = cudaMalloc(&deviceStage_, want); e != cudaSuccess) return e;
  capacity_ = want;
  return cudaSuccess;
}

cudaError_t PagedCopier::run(bool scatter, const PagedKv& kv, const PagedCopy& c,
                             cudaStream_t stream) {
  if (!checkPagedCopy(kv, c).empty()) return cudaErrorInvalidValue;
  if (c.begin == c.end) return cudaSuccess;
  int previous = 0;
  if (auto e = cudaGetDevice(&previous); e != cudaSuccess) return e;
  if (previous == device_) return launch(scatter, kv, c, stream);  // the common case: no switch
  if (auto e = cudaSetDevice(device_); e != cudaSuccess) return e;
  const cudaError_t e = launch(scatter, kv, c, stream);
  cudaSetDevice(previous);  // the caller's current device is theirs
  return e;
}

cudaError_t PagedCopier::launch(bool scatter, const PagedKv& kv, const PagedCopy& c,
                                cudaStream_t stream) {
  // The tables, packed: tensor bases, then pool block bases (both pointers), then the block table.
  const size_t tensorBytes = 2ull * kv.numLayers * sizeof(uint8_t*);
  const uint64_t poolCount = poolBlockCount(c);
  const size_t poolBytes = poolCount * sizeof(uint8_t*);
  const uint64_t tableCount = (c.end - 1) / kv.blockTokens + 1;
  const size_t tableBytes = tableCount * sizeof(int32_t);
  const size_t total = tensorBytes + poolBytes + tableBytes;
  if (total <= inlineTableBytes_) {
    const detail::InlineLayout layout{0, tensorBytes, tensorBytes + poolBytes, total};
    return detail::pagedCopyInline(scatter, kv, c, layout, pagedCopyAlignment(kv, c), stream);
  }
  for (cudaEvent_t* ev : {&staged_, &done_}) {
    if (!*ev) {
      if (auto e = cudaEventCreateWithFlags(ev, cudaEventDisableTiming); e != cudaSuccess) {
        return e;
      }
    }
  }
  if (auto e = reserve(total); e != cudaSuccess) return e;
  // The previous call's tables must have left the staging buffer before it is overwritten.
  if (auto e = cudaEventSynchronize(staged_); e != cudaSuccess) return e;
  std::memcpy(hostStage_, c.tensors, tensorBytes);
  std::memcpy(hostStage_ + tensorBytes, c.poolBlocks, poolBytes);
  std::memcpy(hostStage_ + tensorBytes + poolBytes, c.blockTable, tableBytes);
  // The device copy of the tables is rewritten only after the previous kernel read it, even when
  // that kernel ran on another stream.
  if (auto e = cudaStreamWaitEvent(stream, done_, 0); e != cudaSuccess) return e;
  if (auto e = cudaMemcpyAsync(deviceStage_, hostStage_, total, cudaMemcpyHostToDevice, stream);
      e != cudaSuccess) {
    return e;
  }
  if (auto e = cudaEventRecord(staged_, stream); e != cudaSuccess) return e;
  PagedCopy onDevice = c;
  onDevice.tensors = reinterpret_cast<uint8_t* const*>(deviceStage_);
  onDevice.poolBlocks = reinterpret_cast<uint8_t* const*>(deviceStage_ + tensorBytes);
  onDevice.blockTable = reinterpret_cast<const int32_t*>(deviceStage_ + tensorBytes + poolBytes);
  if (auto e = detail::pagedCopy(scatter, kv, onDevice, pagedCopyAlignment(kv, c), stream);
      e != cudaSuccess) {
    return e;
  }
  return cudaEventRecord(done_, stream);
}

cudaError_t rotateK(const Layout& layout, uint8_t* k, uint64_t tokens, int64_t delta,
                    cudaStream_t stream) {
  const uint32_t half = layout.rope.rotaryDims / 2;
  if (layout.rope.style == RopeStyle::kNone || !ropeSupports(layout.dtype) || half == 0) {
    return cudaErrorInvalidValue;
  }
  std::vector<float> table(2 * half);
  ropeTable(layout.rope, delta, table.data(), table.data() + half);
  float* deviceTable = nullptr;
  if (auto e = cudaMalloc(&deviceTable, table.size() * sizeof(float)); e != cudaSuccess) return e;
  cudaError_t e = cudaMemcpyAsync(deviceTable, table.data(), table.size() * sizeof(float),
                                  cudaMemcpyHostToDevice, stream);
  if (e == cudaSuccess) {
    detail::RotateArgs args;
    args.k = k;
    args.cosSin = deviceTable;
    args.heads = tokens * layout.numKvHeads;
    args.headDim = layout.headDim;
    args.half = half;
    args.dtype = static_cast<uint32_t>(layout.dtype);
    args.elemBytes = layout.dtype == DType::kFloat32 ? 4 : 2;
    args.neox = layout.rope.style == RopeStyle::kNeox;
    e = detail::rotateK(args, stream);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
  cudaFree(deviceTable);
  return e;
}

}  // namespace kvtier::kernels::gpu
