// GPU memory that crosses a process boundary: the daemon's device pools, exported with CUDA IPC,
// and a client's mappings of them. Built only with CUDA (KVTIER_HAVE_CUDA).
//
// A device pool is a set of extents, each one whole cudaMalloc of a 2 MiB-aligned size exported
// with cudaIpcGetMemHandle: IPC shares whole allocations, so extents are never sub-allocations of
// anything. Extents live as long as the daemon: a client may keep a mapping open until its session
// ends, and an extent freed under it would let a later allocation alias its memory.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvtier/error.h"
#include "store/block_pool.h"

namespace kvtier {

inline constexpr uint64_t kDeviceExtentAlignment = uint64_t{2} << 20;  // 2 MiB
using IpcHandleBytes = std::array<uint8_t, sizeof(cudaIpcMemHandle_t)>;

class DevicePool {
 public:
  struct Extent {
    uint32_t id = 0;  // the pool-wide extent id (after the host extents)
    uint8_t* base = nullptr;
    uint64_t bytes = 0;
    IpcHandleBytes handle{};
  };

  // `bytes` on `device`, in extents of at most `extentBytes` (both rounded up to 2 MiB), numbered
  // from `firstId`. UNAVAILABLE when the device or the memory is not there.
  static Result<std::unique_ptr<DevicePool>> create(int device, uint64_t bytes,
                                                    uint64_t extentBytes, uint32_t firstId);
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  int device() const { return device_; }
  const std::vector<Extent>& extents() const { return extents_; }

 private:
  explicit DevicePool(int device) : device_(device) {}
  int device_;
  std::vector<Extent> extents_;
};

// A client's mapping of one exported extent (cudaIpcOpenMemHandle); closed on destruction.
class DeviceMapping {
 public:
  static Result<std::unique_ptr<DeviceMapping>> open(int device, const IpcHandleBytes& handle,
                                                     uint64_t bytes);
  ~DeviceMapping();
  DeviceMapping(const DeviceMapping&) = delete;
  DeviceMapping& operator=(const DeviceMapping&) = delete;
  uint8_t* data() const { return base_; }
  uint64_t size() const { return bytes_; }

 private:
  DeviceMapping(int device, uint8_t* base, uint64_t bytes)
      : device_(device), base_(base), bytes_(bytes) {}
  int device_;
  uint8_t* base_;
  uint64_t bytes_;
};

// Host memory made visible to the GPUs (cudaHostRegister, portable and mapped): copies from and to
// it are asynchronous DMA, and kernels can read and write it in place. Unregisters on destruction.
class HostRegistration {
 public:
  static Result<std::unique_ptr<HostRegistration>> create(uint8_t* base, uint64_t bytes);
  ~HostRegistration();
  HostRegistration(const HostRegistration&) = delete;
  HostRegistration& operator=(const HostRegistration&) = delete;
  // The address a kernel uses for `hostAddress` inside the registration.
  Result<uint8_t*> devicePointer(uint8_t* hostAddress) const;

 private:
  explicit HostRegistration(uint8_t* base) : base_(base) {}
  uint8_t* base_;
};

// The daemon's BlockMemory over the host pool and the device pools: extent ids are the host pool's
// first, then each device pool's. Copies that touch device memory run as cudaMemcpy.
class TieredMemory final : public BlockMemory {
 public:
  TieredMemory(BlockMemory& host, uint32_t hostExtents,
               std::span<const std::unique_ptr<DevicePool>> devices);
  uint8_t* extentBase(uint32_t extent) override;
  bool hostAddressable(uint32_t extent) const override { return extent < hostExtents_; }
  void copy(uint8_t* dst, const uint8_t* src, uint64_t bytes) override;

 private:
  BlockMemory& host_;
  uint32_t hostExtents_;
  std::vector<uint8_t*> deviceBases_;  // by extent id - hostExtents_
};

// Copies blocks between tiers on CUDA streams of its own, one per device (a copy runs on the
// stream of the GPU whose memory it touches): for the tier service's worker thread.
class CudaBlockMover {
 public:
  // `host` are the host pool's extents and `devices` the daemon's device pools (borrowed,
  // outliving the mover): runs are merged within them, and the device of an address is looked up
  // in them (any other address asks CUDA).
  CudaBlockMover(std::vector<MemoryRange> host,
                 std::span<const std::unique_ptr<DevicePool>> devices);
  ~CudaBlockMover();
  // Enqueues every copy (runs contiguous on both sides as one copy), then waits for them. False on
  // any CUDA error.
  bool copy(std::span<const BlockCopy> copies);

 private:
  struct Range {
    const uint8_t* base;
    uint64_t bytes;
    int device;
  };
  // The device whose memory `p` is, or -1 for host memory.
  int deviceOf(const void* p) const;
  // That device's stream (created on first use), or nullptr for host memory or on failure.
  cudaStream_t streamFor(const void* p);
  std::vector<Range> ranges_;         // device extents
  std::vector<MemoryRange> extents_;  // host and device extents, for coalesceCopies
  std::vector<cudaStream_t> streams_;  // by device
};

// The pool extents (id, bytes, tier) of the device pools, for BlockPool: pool `i` of `devices` is
// tier BlockPool::gpuTier(i).
std::vector<BlockPool::Extent> deviceExtents(std::span<const std::unique_ptr<DevicePool>> devices);

// The PCI bus id of CUDA device `device` as this process numbers it ("0000:3b:00.0"); empty when
// CUDA cannot say (the error is cleared).
std::string pciBusId(int device);

}  // namespace kvtier
