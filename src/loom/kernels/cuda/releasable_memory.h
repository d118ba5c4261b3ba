#pragma once
// Releasable device memory (Allocator::allocate_releasable, decommit and commit; core/device.h)
// through CUDA's virtual memory management. An allocation reserves its whole address range
// (cuMemAddressReserve) and backs each granule of it (the device's allocation granularity,
// usually 2 MiB) with a physical chunk of its own (cuMemCreate, cuMemMap, cuMemSetAccess).
// Decommitting a whole granule unmaps and frees its chunk (cuMemUnmap, cuMemRelease) once the
// stream's work queued before the decommit, which may still use it, is done: the decommit records
// an event and returns at once, and the next call of the allocator on this device that finds the
// event passed frees the chunk (core/release_queue.h; per stream at most kMostPendingReleases
// wait, one more waits for the stream's oldest, so its thread stays at most that many decommits
// ahead of the device). Until then the chunk is held though no longer counted as committed.
// Committing a granule again makes and maps a new chunk, or takes back one still waiting to be
// freed, zeroed in stream order either way. The parts of a range on granules it shares with
// neighbouring data are zeroed and keep their chunk. The driver API is reached through the
// runtime (cudaGetDriverEntryPointByVersion), so the build needs no libcuda. Not thread-safe: the
// device's allocator locks around it.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

#include "loom/core/release_queue.h"
#include "loom/kernels/cuda/stream_event.h"

namespace loom::kernels::cuda {

class ReleasableMemory {
 public:
  explicit ReleasableMemory(int device);  // the device's granularity, from the driver
  ~ReleasableMemory();  // unmaps and frees what is left, without waiting (errors ignored)
  ReleasableMemory(const ReleasableMemory&) = delete;
  ReleasableMemory& operator=(const ReleasableMemory&) = delete;

  // `bytes` of device memory, every granule committed (not zeroed, as cudaMalloc's).
  void* allocate(size_t bytes);
  // Frees `ptr` when it is one of these allocations (after the work of every compute stream of the
  // device: the freeing thread's need not be the last to have used it) and says how many of its
  // bytes were decommitted then; false otherwise.
  bool free(void* ptr, size_t& decommitted);
  // Allocator::decommit and commit; the bytes given back / taken again (counted when decommitted,
  // though their chunks go once the stream's work before the decommit is done). An Error when the
  // range is not inside one of these allocations.
  size_t decommit(void* ptr, size_t bytes, cudaStream_t stream);
  size_t commit(void* ptr, size_t bytes, cudaStream_t stream);
  // Frees the chunks of decommitted granules whose stream work is done (Allocator::synchronize:
  // after the stream's, every chunk its decommits released has gone back).
  void collect();
  // Waits for the work before every pending release and frees its chunks (out of device memory);
  // whether there was any.
  bool free_pending();
  // Whether `ptr` lies in one of these allocations (committed or not).
  bool holds(const void* ptr) const;
  size_t granule() const { return granule_; }

 private:
  struct Reservation {
    uintptr_t base = 0;
    size_t bytes = 0, reserved = 0;             // asked for; the address range (whole granules)
    std::vector<unsigned long long> chunks;     // per granule: its physical chunk when mapped
    std::vector<char> mapped;                   // per granule
    std::vector<char> pending;                  // per granule: mapped, its release waiting (releases_)
    size_t decommitted = 0;                     // bytes
  };
  using Releases = ReleaseQueue<StreamEvent>;  // a release's fence: the releasing stream's event
  Reservation& find(const void* ptr, size_t bytes, const char* what);
  void map(Reservation& r, size_t granule);
  // map(), and where the device is out of memory, again after every pending release is freed.
  void map_reclaiming(Reservation& r, size_t granule);
  void unmap(Reservation& r, size_t granule);
  void release(const Releases::Granule& granule);  // unmaps a granule whose release is due
  auto releaser() {
    return [this](const Releases::Granule& g) { release(g); };
  }

  // Per stream: ZeRO-3 releases a layer's parameters and then its gradients, so about two layers'
  // worth of decommits may be ahead of the device.
  static constexpr size_t kMostPendingReleases = 4;

  int device_;
  size_t granule_ = 0;
  std::map<uintptr_t, Reservation> reservations_;  // by base address
  Releases releases_{kMostPendingReleases};        // granules decommitted, chunks not yet freed
};

}  // namespace loom::kernels::cuda
