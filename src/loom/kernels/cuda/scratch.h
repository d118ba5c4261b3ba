#pragma once
// Device memory for the length of one entry's call (casts, copies, partial results), from a cache
// per device whose free lists are kept per compute stream (caching_allocator.h): what a call takes
// goes back to the calling thread's stream's list when the call ends, while its kernels may still
// be queued; the next call on that stream queues after them, so stream order makes the reuse safe,
// and no other stream gets the memory. So the kernels using it must run on that stream (every
// entry's), or on the legacy default stream, which every compute stream is ordered with (the GPU
// tests' direct calls). A call holds its device's cache until it ends, so calls on one device from
// several threads (ranks sharing a GPU) take turns on the host.
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace loom::kernels::cuda {

class CachingAllocator;

class Scratch {
 public:
  Scratch();  // from the current device's cache
  ~Scratch();
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;

  void* bytes(int64_t n);
  template <typename T>
  T* of(int64_t n) {
    return static_cast<T*>(bytes(n * static_cast<int64_t>(sizeof(T))));
  }
  float* floats(int64_t n) { return of<float>(n); }

 private:
  std::unique_lock<std::mutex> lock_;
  CachingAllocator* allocator_;
  cudaStream_t stream_;
  std::vector<void*> held_;
};

}  // namespace loom::kernels::cuda
