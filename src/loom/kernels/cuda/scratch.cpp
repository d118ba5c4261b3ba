#include "loom/kernels/cuda/scratch.h"

#include <algorithm>
#include <memory>

#include "loom/kernels/cuda/caching_allocator.h"
#include "loom/kernels/cuda/compute_streams.h"
#include "loom/kernels/cuda/per_device.h"

namespace loom::kernels::cuda {

namespace {

struct Cache {
  std::mutex mutex;
  CachingAllocator allocator;
};

}  // namespace

Scratch::Scratch() {
  Cache& cache = current_device_object<Cache>("device scratch", [] { return std::make_unique<Cache>(); });
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  lock_ = std::unique_lock<std::mutex>(cache.mutex);
  allocator_ = &cache.allocator;
  stream_ = compute_stream(device);
}

Scratch::~Scratch() {
  for (void* p : held_) allocator_->release(p, stream_);
}

void* Scratch::bytes(int64_t n) {
  held_.push_back(allocator_->allocate(static_cast<size_t>(std::max<int64_t>(n, 1)), stream_));
  return held_.back();
}

}  // namespace loom::kernels::cuda
