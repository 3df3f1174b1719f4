#include "transport/cuda_pool.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kvtier {
namespace {

uint64_t roundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

Error cudaFailure(const char* what, cudaError_t e) {
  cudaGetLastError();  // clear it
  return makeError(ErrorCode::kUnavailable, what, ": ", cudaGetErrorString(e));
}

}  // namespace

Result<std::unique_ptr<DevicePool>> DevicePool::create(int device, uint64_t bytes,
                                                       uint64_t extentBytes, uint32_t firstId) {
  if (bytes == 0) return makeError(ErrorCode::kInvalidArgument, "a GPU pool of 0 bytes");
  if (auto e = cudaSetDevice(device); e != cudaSuccess) return cudaFailure("cudaSetDevice", e);
  std::unique_ptr<DevicePool> pool(new DevicePool(device));
  const uint64_t total = roundUp(bytes, kDeviceExtentAlignment);
  const uint64_t per = roundUp(std::max<uint64_t>(extentBytes, 1), kDeviceExtentAlignment);
  for (uint64_t done = 0; done < total;) {
    Extent x;
    x.id = firstId + static_cast<uint32_t>(pool->extents_.size());
    x.bytes = std::min(per, total - done);
    void* base = nullptr;
    if (auto e = cudaMalloc(&base, x.bytes); e != cudaSuccess) return cudaFailure("cudaMalloc", e);
    x.base = static_cast<uint8_t*>(base);
    cudaIpcMemHandle_t handle;
    if (auto e = cudaIpcGetMemHandle(&handle, base); e != cudaSuccess) {
      cudaFree(base);
      return cudaFailure("cudaIpcGetMemHandle", e);
    }
    std::memcpy(x.handle.data(), &handle, sizeof handle);
    pool->extents_.push_back(x);
    done += x.bytes;
  }
  return pool;
}

// Exported memory is not freed: a client may still have it mapped when the daemon stops, and
// freeing memory another process has open is undefined. The pool lives as long as the daemon;
// the process's exit returns it.
DevicePool::~DevicePool() = default;

Result<std::unique_ptr<DeviceMapping>> DeviceMapping::open(int device, const IpcHandleBytes& handle,
                                                           uint64_t bytes) {
  int previous = 0;
  if (auto e = cudaGetDevice(&previous); e != cudaSuccess) return cudaFailure("cudaGetDevice", e);
  if (auto e = cudaSetDevice(device); e != cudaSuccess) return cudaFailure("cudaSetDevice", e);
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof h);
  void* base = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
  cudaSetDevice(previous);  // the caller's current device is theirs
  if (e != cudaSuccess) return cudaFailure("cudaIpcOpenMemHandle", e);
  return std::unique_ptr<DeviceMapping>(
      new DeviceMapping(device, static_cast<uint8_t*>(base), bytes));
}

DeviceMapping::~DeviceMapping() {
  int previous = 0;
  const bool restore = cudaGetDevice(&previous) == cudaSuccess;
  cudaSetDevice(device_);
  cudaIpcCloseMemHandle(base_);
  if (restore) cudaSetDevice(previous);
}

Result<std::unique_ptr<HostRegistration>> HostRegistration::create(uint8_t* base, uint64_t bytes) {
  if (auto e = cudaHostRegister(base, bytes, cudaHostRegisterPortable | cudaHostRegisterMapped);
      e != cudaSuccess) {
    return cudaFailure("cudaHostRegister", e);
  }
  return std::unique_ptr<HostRegistration>(new HostRegistration(base));
}

HostRegistration::~HostRegistration() { cudaHostUnregister(base_); }

Result<uint8_t*> HostRegistration::devicePointer(uint8_t* hostAddress) const {
  void* d = nullptr;
  if (auto e = cudaHostGetDevicePointer(&d, hostAddress, 0); e != cudaSuccess) {
    return cudaFailure("cudaHostGetDevicePointer", e);
  }
  return static_cast<uint8_t*>(d);
}

TieredMemory::TieredMemory(BlockMemory& host, uint32_t hostExtents,
                           std::span<const std::unique_ptr<DevicePool>> devices)
    : host_(host), hostExtents_(hostExtents) {
  for (const auto& d : devices) {
    for (const auto& x : d->extents()) {
      deviceBases_.resize(std::max<size_t>(deviceBases_.size(), x.id - hostExtents_ + 1));
      deviceBases_[x.id - hostExtents_] = x.base;
    }
  }
}

uint8_t* TieredMemory::extentBase(uint32_t extent) {
  return extent < hostExtents_ ? host_.extentBase(extent) : deviceBases_.at(extent - hostExtents_);
}

void TieredMemory::copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  // Unified addressing tells host from device memory. A failure here is a broken device (CUDA
  // errors of a copy are sticky): the engine cannot undo the call that asked for the copy, and
  // carrying on would serve a block whose bytes were never written. Stop instead; what is on
  // disk survives the restart.
  if (auto e = cudaMemcpy(dst, src, bytes, cudaMemcpyDefault); e != cudaSuccess) {
    std::fprintf(stderr,
                 "kvtierd: device copy failed (%s): stopping rather than serve wrong bytes\n",
                 cudaGetErrorString(e));
    std::abort();
  }
}

CudaBlockMover::~CudaBlockMover() {
  for (cudaStream_t s : streams_) {
    if (s) cudaStreamDestroy(s);
  }
}

CudaBlockMover::CudaBlockMover(std::vector<MemoryRange> host,
                               std::span<const std::unique_ptr<DevicePool>> devices)
    : extents_(std::move(host)) {
  for (const auto& d : devices) {
    for (const auto& x : d->extents()) {
      ranges_.push_back({x.base, x.bytes, d->device()});
      extents_.push_back({x.base, x.bytes});
    }
  }
}

int CudaBlockMover::deviceOf(const void* p) const {
  const auto* a = static_cast<const uint8_t*>(p);
  for (const Range& r : ranges_) {
    if (a >= r.base && a < r.base + r.bytes) return r.device;
  }
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return attributes.type == cudaMemoryTypeDevice ? attributes.device : -1;
}

cudaStream_t CudaBlockMover::streamFor(const void* p) {
  const int device = deviceOf(p);
  if (device < 0) return nullptr;
  const auto i = static_cast<size_t>(device);
  if (streams_.size() <= i) streams_.resize(i + 1, nullptr);
  if (!streams_[i]) {
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking) != cudaSuccess) {
      cudaGetLastError();
      streams_[i] = nullptr;
    }
  }
  return streams_[i];
}

bool CudaBlockMover::copy(std::span<const BlockCopy> copies) {
  bool ok = true;
  for (const BlockCopy& c : coalesceCopies({copies.begin(), copies.end()}, extents_)) {
    // Host <-> GPU moves: the GPU side names the stream (and the copy engine doing the work).
    cudaStream_t stream = streamFor(c.dst);
    if (!stream) stream = streamFor(c.src);
    if (!stream ||
        cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, stream) != cudaSuccess) {
      cudaGetLastError();
      ok = false;
      break;
    }
  }
  for (cudaStream_t s : streams_) {
    if (s && cudaStreamSynchronize(s) != cudaSuccess) {
      cudaGetLastError();
      ok = false;
    }
  }
  return ok;
}

std::string pciBusId(int device) {
  char pci[32] = {};
  if (cudaDeviceGetPCIBusId(pci, sizeof pci, device) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return pci;
}

std::vector<BlockPool::Extent> deviceExtents(std::span<const std::unique_ptr<DevicePool>> devices) {
  std::vector<BlockPool::Extent> out;
  for (size_t i = 0; i < devices.size(); ++i) {
    for (const auto& x : devices[i]->extents()) {
      out.push_back(BlockPool::Extent{x.id, x.bytes, BlockPool::gpuTier(i)});
    }
  }
  return out;
}

}  // namespace kvtier
