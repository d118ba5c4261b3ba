#include "loom/kernels/cuda/caching_allocator.h"

#include <cuda_runtime.h>

#include "loom/core/error.h"
#include "loom/kernels/cuda/compute_streams.h"
#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

size_t CachingAllocator::rounded_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = 2u << 20, kSmallLimit = 1u << 20;
  const size_t unit = bytes < kSmallLimit ? kSmall : kLarge;
  return (bytes + unit - 1) / unit * unit;
}

CachingAllocator::~CachingAllocator() {
  for (auto& [ptr, size] : sizes_) cudaFree(ptr);  // destructors cannot throw; the process may be ending
}

void* CachingAllocator::allocate(size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  const size_t size = rounded_size(bytes);
  auto it = free_.find({stream, size});
  if (it != free_.end()) {
    void* ptr = it->second;
    free_.erase(it);
    stats_.cached_bytes -= static_cast<int64_t>(size);
    stats_.allocated_bytes += static_cast<int64_t>(size);
    ++stats_.reuses;
    return ptr;
  }
  void* ptr = nullptr;
  cudaError_t result = cudaMalloc(&ptr, size);
  if (result == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    empty_cache();  // cached blocks of other sizes or streams may make room
    result = cudaMalloc(&ptr, size);
  }
  check_cuda(result, "cudaMalloc of " + std::to_string(size) + " bytes (" +
                         std::to_string(stats_.allocated_bytes) + " bytes already held)");
  sizes_[ptr] = size;
  stats_.allocated_bytes += static_cast<int64_t>(size);
  ++stats_.device_allocations;
  return ptr;
}

void CachingAllocator::release(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return;
  auto it = sizes_.find(ptr);
  LOOM_CHECK(it != sizes_.end(), "CachingAllocator: released a pointer it did not allocate");
  free_.emplace(std::make_pair(stream, it->second), ptr);
  stats_.allocated_bytes -= static_cast<int64_t>(it->second);
  stats_.cached_bytes += static_cast<int64_t>(it->second);
}

void CachingAllocator::empty_cache() {
  if (free_.empty()) return;
  // A block's last stream may still have work on it queued; cudaFree is not ordered by streams.
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  synchronize_compute_streams(device);
  for (auto& [key, ptr] : free_) {
    check_cuda(cudaFree(ptr), "cudaFree");
    sizes_.erase(ptr);
  }
  free_.clear();
  stats_.cached_bytes = 0;
}

}  // namespace loom::kernels::cuda
