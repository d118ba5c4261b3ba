#pragma once
// A GEMM library's workspace per stream its calls run on (cuBLAS, cuBLASLt): products queued on
// two streams may run at once, so they must not share one. Each is taken from the owner's caching
// allocator on the stream's first call and kept for the process. Not thread-safe: the owner
// serialises its calls (a mutex per device).
#include <cuda_runtime.h>

#include <cstddef>
#include <map>

#include "loom/kernels/cuda/caching_allocator.h"

namespace loom::kernels::cuda {

class StreamWorkspaces {
 public:
  StreamWorkspaces(CachingAllocator& allocator, size_t bytes) : allocator_(allocator), bytes_(bytes) {}
  void* get(cudaStream_t stream) {
    void*& w = workspaces_[stream];
    if (w == nullptr) w = allocator_.allocate(bytes_, stream);
    return w;
  }
  size_t bytes() const { return bytes_; }

 private:
  CachingAllocator& allocator_;
  size_t bytes_;
  std::map<cudaStream_t, void*> workspaces_;
};

}  // namespace loom::kernels::cuda
