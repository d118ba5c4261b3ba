#pragma once
// Device memory for the length of one entry's call (casts, copies, partial results), from a cache
// per device: what a call takes goes back to the cache when the call ends. Every entry runs on its
// device's compute stream, so stream order makes the reuse safe. A call holds its device's cache
// until it ends, so calls on one device from several threads (ranks sharing a GPU) take turns.
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
  std::vector<void*> held_;
};

}  // namespace loom::kernels::cuda
