#include "loom/kernels/cuda/scratch.h"

#include <algorithm>
#include <array>
#include <memory>
#include <string>

#include "loom/core/error.h"
#include "loom/kernels/cuda/caching_allocator.h"
#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

namespace {

constexpr int kMaxDevices = 16;

struct Cache {
  std::mutex mutex;
  CachingAllocator allocator;
};

Cache& current_cache() {
  // Never destroyed: at exit the CUDA runtime may already be gone.
  static auto* caches = new std::array<std::unique_ptr<Cache>, kMaxDevices>();
  static std::mutex mutex;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  LOOM_CHECK(device < kMaxDevices, "device scratch: device " + std::to_string(device) + " beyond the supported " +
                                       std::to_string(kMaxDevices));
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = (*caches)[static_cast<size_t>(device)];
  if (!slot) slot = std::make_unique<Cache>();
  return *slot;
}

}  // namespace

Scratch::Scratch() {
  Cache& cache = current_cache();
  lock_ = std::unique_lock<std::mutex>(cache.mutex);
  allocator_ = &cache.allocator;
}

Scratch::~Scratch() {
  for (void* p : held_) allocator_->release(p);
}

void* Scratch::bytes(int64_t n) {
  held_.push_back(allocator_->allocate(static_cast<size_t>(std::max<int64_t>(n, 1))));
  return held_.back();
}

}  // namespace loom::kernels::cuda
