#pragma once
// Device memory through a caching allocator: cudaMalloc and cudaFree synchronise the device and
// cost tens of microseconds, so freed blocks are kept in free lists by rounded size and handed
// out again. Sizes round up to 512 bytes below 1 MiB and to 2 MiB above (bounded waste, few
// distinct sizes). Not thread-safe: its owner locks around it.
//
// Streams: a block released on a stream (the releasing thread's compute stream) is kept for that
// stream and handed out again only to it, so the work queued there before the release, which may
// still touch the block, runs before anything its next holder queues. Another stream gets it only
// after empty_cache(), which waits for every compute stream of the device first.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>

namespace loom::kernels::cuda {

struct AllocatorStats {
  int64_t allocated_bytes = 0;  // held by callers now
  int64_t cached_bytes = 0;     // in the free lists
  int64_t device_allocations = 0;  // cudaMalloc calls so far
  int64_t reuses = 0;           // requests served from a free list
};

class CachingAllocator {
 public:
  CachingAllocator() = default;
  ~CachingAllocator();  // returns every cached block to the device
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // At least `bytes` of device memory (256-byte aligned) for work on `stream`; nullptr for 0.
  // Throws loom::Error naming the size when the device has none left even after emptying the
  // cache.
  void* allocate(size_t bytes, cudaStream_t stream);
  // Back to `stream`'s free list (not to the device). `ptr` must come from allocate().
  void release(void* ptr, cudaStream_t stream);
  // Waits for the current device's compute streams, then frees every cached block of every
  // stream.
  void empty_cache();

  const AllocatorStats& stats() const { return stats_; }
  static size_t rounded_size(size_t bytes);

 private:
  std::multimap<std::pair<cudaStream_t, size_t>, void*> free_;  // (stream, rounded size) -> block
  std::map<void*, size_t> sizes_;                                 // every live block's rounded size
  AllocatorStats stats_;
};

}  // namespace loom::kernels::cuda
