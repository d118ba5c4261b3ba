#pragma once
// Releasable device memory (Allocator::allocate_releasable, decommit and commit; core/device.h)
// through CUDA's virtual memory management. An allocation reserves its whole address range
// (cuMemAddressReserve) and backs each granule of it (the device's allocation granularity,
// usually 2 MiB) with a physical chunk of its own (cuMemCreate, cuMemMap, cuMemSetAccess).
// Decommitting a whole granule unmaps and frees its chunk (cuMemUnmap, cuMemRelease) after the
// stream's work in flight, which may still use it, is done; committing it again makes and maps a
// new chunk, zeroed in stream order. The parts of a range on granules it shares with neighbouring
// data are zeroed and keep their chunk. The driver API is reached through the runtime
// (cudaGetDriverEntryPointByVersion), so the build needs no libcuda. Not thread-safe: the
// device's allocator locks around it.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <vector>

namespace loom::kernels::cuda {

class ReleasableMemory {
 public:
  explicit ReleasableMemory(int device);  // the device's granularity, from the driver
  ~ReleasableMemory();                    // unmaps and frees what is left (errors ignored)
  ReleasableMemory(const ReleasableMemory&) = delete;
  ReleasableMemory& operator=(const ReleasableMemory&) = delete;

  // `bytes` of device memory, every granule committed (not zeroed, as cudaMalloc's).
  void* allocate(size_t bytes);
  // Frees `ptr` when it is one of these allocations (after the work of every compute stream of the
  // device: the freeing thread's need not be the last to have used it) and says how many of its
  // bytes were decommitted then; false otherwise.
  bool free(void* ptr, size_t& decommitted);
  // Allocator::decommit and commit; the bytes given back / taken again. An Error when the range
  // is not inside one of these allocations.
  size_t decommit(void* ptr, size_t bytes, cudaStream_t stream);
  size_t commit(void* ptr, size_t bytes, cudaStream_t stream);
  // Whether `ptr` lies in one of these allocations (committed or not).
  bool holds(const void* ptr) const;
  size_t granule() const { return granule_; }

 private:
  struct Reservation {
    uintptr_t base = 0;
    size_t bytes = 0, reserved = 0;             // asked for; the address range (whole granules)
    std::vector<unsigned long long> chunks;     // per granule: its physical chunk when mapped
    std::vector<char> mapped;                   // per granule
    size_t decommitted = 0;                     // bytes
  };
  Reservation& find(const void* ptr, size_t bytes, const char* what);
  void map(Reservation& r, size_t granule);
  void unmap(Reservation& r, size_t granule);

  int device_;
  size_t granule_ = 0;
  std::map<uintptr_t, Reservation> reservations_;  // by base address
};

}  // namespace loom::kernels::cuda
