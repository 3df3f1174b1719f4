// The CUDA kernels against the CPU reference, byte for byte. Needs a GPU: without one every test
// skips with the reason (CI builds and links this binary, and runs it to that skip).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "kernels/gpu.h"
#include "kernels/paged_copy_test_util.h"
#include "kernels/rope.h"

namespace kvtier::kernels {
namespace {

using testing::PagedBuffers;
using testing::pagedCases;

#define SKIP_WITHOUT_GPU()                   \
  do {                                       \
    if (gpu::deviceCount() == 0) {           \
      GTEST_SKIP() << gpu::noDeviceReason(); \
    }                                        \
  } while (0)

#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

// Device mirrors of a case's tensors and pool blocks (pool blocks carved from one allocation, as
// kvtierd's extents are), at a chosen misalignment to exercise the narrow access paths.
struct DeviceMirror {
  std::vector<uint8_t*> tensors, pool;
  std::vector<void*> allocations;
  ~DeviceMirror() {
    for (void* p : allocations) cudaFree(p);
  }
  void upload(const PagedBuffers& b, uint64_t skew) {
    for (const auto& t : b.tensors) {
      void* p = nullptr;
      ASSERT_EQ(cudaMalloc(&p, t.size() + 64), cudaSuccess);
      allocations.push_back(p);
      tensors.push_back(static_cast<uint8_t*>(p) + skew);
      ASSERT_EQ(cudaMemcpy(tensors.back(), t.data(), t.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
    }
    void* p = nullptr;
    ASSERT_EQ(cudaMalloc(&p, b.poolBlocks * b.poolBlockBytes + 64), cudaSuccess);
    allocations.push_back(p);
    for (uint64_t j = 0; j < b.poolBlocks; ++j) {
      pool.push_back(static_cast<uint8_t*>(p) + skew + j * b.poolBlockBytes);
      ASSERT_EQ(cudaMemcpy(pool.back(), b.pool[j].data(), b.poolBlockBytes, cudaMemcpyHostToDevice),
                cudaSuccess);
    }
  }
  void download(PagedBuffers& b) {
    for (size_t i = 0; i < tensors.size(); ++i) {
      ASSERT_EQ(
          cudaMemcpy(b.tensors[i].data(), tensors[i], b.tensors[i].size(), cudaMemcpyDeviceToHost),
          cudaSuccess);
    }
    for (size_t j = 0; j < pool.size(); ++j) {
      ASSERT_EQ(cudaMemcpy(b.pool[j].data(), pool[j], b.poolBlockBytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
  }
};

void runBothWays(const testing::PagedCase& pc, uint64_t skew, size_t inlineBytes) {
  for (bool scatter : {true, false}) {
    PagedBuffers expected(pc, 7), actual(pc, 7);
    DeviceMirror dev;
    dev.upload(actual, skew);
    auto host = testing::hostTables(expected);
    testing::PagedTables devTables{dev.tensors, dev.pool};
    gpu::PagedCopier copier(0, inlineBytes);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    if (scatter) {
      scatterCpu(expected.kv(), host.copy(expected));
      CUDA_OK(copier.scatter(actual.kv(), devTables.copy(actual), stream));
    } else {
      gatherCpu(expected.kv(), host.copy(expected));
      CUDA_OK(copier.gather(actual.kv(), devTables.copy(actual), stream));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaStreamDestroy(stream));
    dev.download(actual);
    EXPECT_EQ(actual.pool, expected.pool) << (scatter ? "scatter" : "gather");
    EXPECT_EQ(actual.tensors, expected.tensors) << (scatter ? "scatter" : "gather");
  }
}

// Each copy both ways, with its tables in the launch parameters (when they fit) and staged
// through device memory.
void runBothWays(const testing::PagedCase& pc, uint64_t skew) {
  for (size_t inlineBytes : {gpu::kInlineTableBytes, size_t{0}}) {
    SCOPED_TRACE(pc.name + " skew " + std::to_string(skew) +
                 (inlineBytes ? " inline tables" : " staged tables"));
    runBothWays(pc, skew, inlineBytes);
  }
}

TEST(GpuKernels, ScatterAndGatherEqualTheCpuReference) {
  SKIP_WITHOUT_GPU();
  for (const auto& pc : pagedCases()) runBothWays(pc, 0);
}

TEST(GpuKernels, MisalignedRowsTakeNarrowerAccessesAndStillMatch) {
  SKIP_WITHOUT_GPU();
  for (uint64_t skew : {8u, 4u, 2u, 1u}) runBothWays(pagedCases()[1], skew);
}

// Many calls in a row on one copier and stream: staging is reused only after its tables left, and
// tables passed in the launch are each call's own.
TEST(GpuKernels, BackToBackCopiesReuseStagingSafely) {
  SKIP_WITHOUT_GPU();
  for (size_t inlineBytes : {size_t{0}, gpu::kInlineTableBytes}) {
    SCOPED_TRACE(inlineBytes ? "inline tables" : "staged tables");
    testing::PagedCase pc{"chain", 2, 16, 16, 2, 64, 2, 0, 16 * 8, true};
    PagedBuffers b(pc, 3);
    DeviceMirror dev;
    dev.upload(b, 0);
    testing::PagedTables devTables{dev.tensors, dev.pool};
    gpu::PagedCopier copier(0, inlineBytes);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreate(&stream));
    // Scatter block by block, each call with its own range: all of them must land.
    for (uint64_t blk = 0; blk < 8; ++blk) {
      auto c = devTables.copy(b);
      c.begin = blk * 16;
      c.end = c.begin + 16;
      CUDA_OK(copier.scatter(b.kv(), c, stream));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    PagedBuffers expected(pc, 3);
    auto host = testing::hostTables(expected);
    scatterCpu(expected.kv(), host.copy(expected));
    dev.download(b);
    EXPECT_EQ(b.pool, expected.pool);
    CUDA_OK(cudaStreamDestroy(stream));
  }
}

TEST(GpuKernels, RotateKMatchesTheCpuKernelBitForBit) {
  SKIP_WITHOUT_GPU();
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    for (RopeStyle style : {RopeStyle::kNeox, RopeStyle::kGptj}) {
      Layout layout{"m", 1, 4, 128, dtype, 16, RopeScheme{style, 64, 500000.0}};
      const uint64_t tokens = 37;
      const uint32_t eb = dtype == DType::kFloat32 ? 4 : 2;
      std::vector<uint8_t> k(tokens * layout.numKvHeads * layout.headDim * eb);
      std::mt19937 rng(11);
      std::uniform_real_distribution<float> value(-4.0f, 4.0f);
      for (size_t i = 0; i < k.size(); i += eb) {
        const float f = value(rng);
        if (eb == 4) {
          std::memcpy(&k[i], &f, 4);
        } else {
          const uint16_t h = dtype == DType::kFloat16 ? floatToHalf(f) : floatToBf16(f);
          std::memcpy(&k[i], &h, 2);
        }
      }
      for (int64_t delta : {-3, 1, -1000}) {
        auto cpu = k;
        rotateK(layout, cpu.data(), tokens, delta);
        uint8_t* d = nullptr;
        CUDA_OK(cudaMalloc(&d, k.size()));
        CUDA_OK(cudaMemcpy(d, k.data(), k.size(), cudaMemcpyHostToDevice));
        CUDA_OK(gpu::rotateK(layout, d, tokens, delta, nullptr));
        std::vector<uint8_t> out(k.size());
        CUDA_OK(cudaMemcpy(out.data(), d, k.size(), cudaMemcpyDeviceToHost));
        cudaFree(d);
        EXPECT_EQ(out, cpu) << "dtype " << int(dtype) << " style " << int(style) << " delta "
                            << delta;
      }
    }
  }
}

}  // namespace
}  // namespace kvtier::kernels
