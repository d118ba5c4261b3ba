#pragma once
// Device memory through a caching allocator: cudaMalloc and cudaFree synchronise the device and
// cost tens of microseconds, so freed blocks are kept in free lists by rounded size and handed
// out again. Sizes round up to 512 bytes below 1 MiB and to 2 MiB above (bounded waste, few
// distinct sizes). Thread-safe.
//
// Streams: a block released on a stream (the releasing thread's compute stream) is kept for that
// stream and handed out again only to it, so the work queued there before the release, which may
// still touch the block, runs before anything its next holder queues. Another stream gets it only
// after empty_cache(), which waits for every compute stream of the device first.
//
// A GPU has several caches (the device allocator's, the entries' scratch, cuBLASLt's workspaces)
// and the stream-ordered pool of cudaMallocAsync. When cudaMalloc finds the device full, the cache
// asking empties itself, every other cache of the device that no thread is using at that moment,
// and the pool's unused memory, then tries once more: memory one cache keeps free never makes
// another run out.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
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

  // At least `bytes` of the current device's memory (256-byte aligned) for work on `stream`;
  // nullptr for 0. Throws loom::Error naming the size, the device and what it has left when the
  // device has no room even after every cache of it gave its free blocks back. A cache allocates
  // on one device: the one current at its first allocation.
  void* allocate(size_t bytes, cudaStream_t stream);
  // Back to `stream`'s free list (not to the device). `ptr` must come from allocate().
  void release(void* ptr, cudaStream_t stream);
  // Waits for its device's compute streams, then frees every cached block of every stream.
  void empty_cache();

  AllocatorStats stats() const;
  static size_t rounded_size(size_t bytes);

 private:
  void empty_cache_locked();
  // empty_cache() unless another thread is inside this cache now (what a cache short of memory
  // asks of the device's other caches: never waiting, so two caches short at once cannot wait for
  // each other).
  void try_empty_cache();
  // After cudaMalloc failed: every cache of the device and the stream-ordered pool give back what
  // they keep free.
  void give_back_device_memory();

  mutable std::mutex mutex_;
  int device_ = -1;  // set at the first device allocation; the cache is then on the device's list
  std::multimap<std::pair<cudaStream_t, size_t>, void*> free_;  // (stream, rounded size) -> block
  std::map<void*, size_t> sizes_;                                 // every live block's rounded size
  AllocatorStats stats_;
};

}  // namespace loom::kernels::cuda
