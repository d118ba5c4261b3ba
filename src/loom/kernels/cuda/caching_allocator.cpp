#include "loom/kernels/cuda/caching_allocator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <vector>

#include "loom/core/error.h"
#include "loom/kernels/cuda/compute_streams.h"
#include "loom/kernels/cuda/device.h"
#include "loom/kernels/cuda/per_device.h"

namespace loom::kernels::cuda {

namespace {

// Every cache that has allocated on a device, for a cache short of memory to ask the others.
// A lock per device: emptying a cache frees to the device, which waits for its work, and that may
// be a collective waiting for a rank on another GPU that must not wait for this one's list.
// Never destroyed (caches of per-device objects live to the end of the process).
struct DeviceCaches {
  std::mutex mutex;
  std::vector<CachingAllocator*> caches;
};
DeviceCaches& caches_of(int device) {
  static auto* made = new std::array<DeviceCaches, kMaxDevices>();
  return (*made)[static_cast<size_t>(device)];
}

}  // namespace

size_t CachingAllocator::rounded_size(size_t bytes) {
  constexpr size_t kSmall = 512, kLarge = 2u << 20, kSmallLimit = 1u << 20;
  const size_t unit = bytes < kSmallLimit ? kSmall : kLarge;
  return (bytes + unit - 1) / unit * unit;
}

CachingAllocator::~CachingAllocator() {
  if (device_ >= 0) {
    DeviceCaches& list = caches_of(device_);
    std::lock_guard<std::mutex> lock(list.mutex);
    list.caches.erase(std::remove(list.caches.begin(), list.caches.end(), this), list.caches.end());
  }
  for (auto& [ptr, size] : sizes_) cudaFree(ptr);  // destructors cannot throw; the process may be ending
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void* CachingAllocator::allocate(size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return nullptr;
  const size_t size = rounded_size(bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = free_.find({stream, size});
  if (it != free_.end()) {
    void* ptr = it->second;
    free_.erase(it);
    stats_.cached_bytes -= static_cast<int64_t>(size);
    stats_.allocated_bytes += static_cast<int64_t>(size);
    ++stats_.reuses;
    return ptr;
  }
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  if (device_ < 0) {
    LOOM_CHECK(device < kMaxDevices, "CachingAllocator: device " + std::to_string(device) + " beyond the supported " +
                                         std::to_string(kMaxDevices));
    DeviceCaches& list = caches_of(device);
    std::lock_guard<std::mutex> list_lock(list.mutex);
    list.caches.push_back(this);
    device_ = device;
  }
  LOOM_CHECK(device == device_, "CachingAllocator: asked for memory on cuda:" + std::to_string(device) +
                                    " by a cache of cuda:" + std::to_string(device_));
  void* ptr = nullptr;
  cudaError_t result = cudaMalloc(&ptr, size);
  if (result == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    give_back_device_memory();
    result = cudaMalloc(&ptr, size);
  }
  if (result == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)cudaMemGetInfo(&free_bytes, &total_bytes);
    throw OutOfMemory("cuda:" + std::to_string(device_) + " is out of memory: cudaMalloc of " +
                      std::to_string(size) +
                      " bytes failed also after every cache of the device gave back its free blocks (the device has " +
                      std::to_string(free_bytes) + " of " + std::to_string(total_bytes) +
                      " bytes free; this cache holds " + std::to_string(stats_.allocated_bytes) + " bytes in use)");
  }
  check_cuda(result, "cudaMalloc of " + std::to_string(size) + " bytes (" + std::to_string(stats_.allocated_bytes) +
                         " bytes already held)");
  sizes_[ptr] = size;
  stats_.allocated_bytes += static_cast<int64_t>(size);
  ++stats_.device_allocations;
  return ptr;
}

void CachingAllocator::release(void* ptr, cudaStream_t stream) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sizes_.find(ptr);
  LOOM_CHECK(it != sizes_.end(), "CachingAllocator: released a pointer it did not allocate");
  free_.emplace(std::make_pair(stream, it->second), ptr);
  stats_.allocated_bytes -= static_cast<int64_t>(it->second);
  stats_.cached_bytes += static_cast<int64_t>(it->second);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  empty_cache_locked();
}

void CachingAllocator::try_empty_cache() {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (lock.owns_lock()) empty_cache_locked();
}

void CachingAllocator::empty_cache_locked() {
  if (free_.empty()) return;
  // A block's last stream may still have work on it queued; cudaFree is not ordered by streams.
  synchronize_compute_streams(device_);
  while (!free_.empty()) {  // off the lists before its cudaFree: a failure leaves no freed block there
    const auto it = free_.begin();
    void* ptr = it->second;
    const size_t size = it->first.second;
    free_.erase(it);
    sizes_.erase(ptr);
    stats_.cached_bytes -= static_cast<int64_t>(size);
    check_cuda(cudaFree(ptr), "cudaFree");
  }
}

void CachingAllocator::give_back_device_memory() {
  empty_cache_locked();
  {
    DeviceCaches& list = caches_of(device_);
    std::lock_guard<std::mutex> lock(list.mutex);
    for (CachingAllocator* other : list.caches)
      if (other != this) other->try_empty_cache();
  }
  // cudaMallocAsync's pool keeps what its temporaries freed (the backend asks it to, so each step
  // reuses the last one's): once the streams that freed it are done, it can go back too.
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceGetDefaultMemPool(&pool, device_) == cudaSuccess) {
    synchronize_compute_streams(device_);
    check_cuda(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo");
  }
  (void)cudaGetLastError();
}

}  // namespace loom::kernels::cuda
