// The caching allocator on a real GPU when the device fills up (kernels/cuda/caching_allocator.h):
// a cache short of memory takes back what the device's other caches keep free, and what
// cudaMallocAsync's pool keeps; a request the device cannot hold is an Error naming the device,
// the size and what is free. Skipped, saying why, without a GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "cuda_test_util.h"
#include "loom/core/error.h"
#include "loom/kernels/cuda/compute_streams.h"

namespace loom::kernels::cuda {
namespace {

class CudaDeviceMemory : public testing::GpuTest<> {
 protected:
  // 60% of what the device has free now: two such blocks cannot be held at once.
  static size_t most_of_the_free_memory() {
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    size_t free_bytes = 0, total_bytes = 0;
    check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    return free_bytes / 5 * 3;
  }
};

TEST_F(CudaDeviceMemory, ACacheShortOfMemoryTakesBackWhatAnotherKeepsFree) {
  const size_t big = most_of_the_free_memory();
  CachingAllocator keeper, asker;
  keeper.release(keeper.allocate(big, nullptr), nullptr);
  EXPECT_EQ(keeper.stats().cached_bytes, static_cast<int64_t>(CachingAllocator::rounded_size(big)));
  void* got = asker.allocate(big, nullptr);  // room only once the keeper gave its block back
  EXPECT_NE(got, nullptr);
  EXPECT_EQ(keeper.stats().cached_bytes, 0);
  asker.release(got, nullptr);
}

TEST_F(CudaDeviceMemory, TheStreamOrderedPoolGivesBackWhatItKeeps) {
  const size_t big = most_of_the_free_memory();
  const cudaStream_t stream = compute_stream(0);
  void* temporary = nullptr;
  check_cuda(cudaMallocAsync(&temporary, big, stream), "cudaMallocAsync");
  check_cuda(cudaFreeAsync(temporary, stream), "cudaFreeAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaMemPool_t pool = nullptr;
  check_cuda(cudaDeviceGetDefaultMemPool(&pool, 0), "cudaDeviceGetDefaultMemPool");
  uint64_t reserved = 0;
  check_cuda(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved), "cudaMemPoolGetAttribute");
  EXPECT_GE(reserved, big);  // kept (start_backend: the pool's release threshold is unlimited)
  CachingAllocator asker;
  void* got = asker.allocate(big, nullptr);
  EXPECT_NE(got, nullptr);
  check_cuda(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved), "cudaMemPoolGetAttribute");
  EXPECT_LT(reserved, big);
  asker.release(got, nullptr);
}

// The error is an OutOfMemory, which a training command extends with what to change
// (cli/memory_advice.h).
TEST_F(CudaDeviceMemory, MoreThanTheDeviceHoldsIsAnErrorSayingSo) {
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  CachingAllocator asker;
  try {
    asker.allocate(total_bytes * 2, nullptr);
    FAIL() << "allocated twice the device's memory";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cuda:0 is out of memory"), std::string::npos) << what;
    EXPECT_NE(what.find(std::to_string(CachingAllocator::rounded_size(total_bytes * 2))), std::string::npos) << what;
    EXPECT_NE(what.find("bytes free"), std::string::npos) << what;
  }
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // nothing left for the next call to trip on
}

}  // namespace
}  // namespace loom::kernels::cuda
