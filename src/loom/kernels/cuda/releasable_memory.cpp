#include "loom/kernels/cuda/releasable_memory.h"

#include <cuda.h>

#include <iterator>
#include <string>

#include "loom/core/error.h"
#include "loom/core/granules.h"
#include "loom/kernels/cuda/compute_streams.h"
#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

namespace {

// The driver entry points of virtual memory management, typed as this toolkit declares them.
struct Driver {
  decltype(&::cuGetErrorName) error_name = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
};

template <typename F>
void entry_point(const char* name, F& fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check_cuda(cudaGetDriverEntryPointByVersion(name, &p, CUDA_VERSION, cudaEnableDefault, &found),
             std::string("cudaGetDriverEntryPointByVersion(") + name + ")");
  LOOM_CHECK(found == cudaDriverEntryPointSuccess && p != nullptr,
             std::string("CUDA: the driver has no ") + name + " for CUDA " + std::to_string(CUDA_VERSION) +
                 " (releasable device memory needs a driver of that version or newer)");
  fn = reinterpret_cast<F>(p);
}

const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    entry_point("cuGetErrorName", d.error_name);
    entry_point("cuMemGetAllocationGranularity", d.granularity);
    entry_point("cuMemAddressReserve", d.reserve);
    entry_point("cuMemAddressFree", d.address_free);
    entry_point("cuMemCreate", d.create);
    entry_point("cuMemRelease", d.release);
    entry_point("cuMemMap", d.map);
    entry_point("cuMemUnmap", d.unmap);
    entry_point("cuMemSetAccess", d.set_access);
    return d;
  }();
  return d;
}

void check_driver(CUresult result, const std::string& what) {
  if (result == CUDA_SUCCESS) return;
  const char* name = nullptr;
  if (driver().error_name(result, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown error";
  throw Error("CUDA: " + what + " failed: " + name + " (" + std::to_string(static_cast<int>(result)) + ")");
}

CUmemAllocationProp chunk_properties(int device) {
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

}  // namespace

ReleasableMemory::ReleasableMemory(int device) : device_(device) {
  const CUmemAllocationProp prop = chunk_properties(device);
  check_driver(driver().granularity(&granule_, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
               "cuMemGetAllocationGranularity (cuda:" + std::to_string(device) + ")");
  LOOM_CHECK(granule_ > 0, "CUDA: cuda:" + std::to_string(device) + " reports an allocation granularity of 0");
}

ReleasableMemory::~ReleasableMemory() {
  const Driver& d = driver();
  for (auto& [base, r] : reservations_) {  // destructors cannot throw; the process may be ending
    for (size_t g = 0; g < r.mapped.size(); ++g) {
      if (!r.mapped[g]) continue;
      d.unmap(static_cast<CUdeviceptr>(base + g * granule_), granule_);
      d.release(r.chunks[g]);
    }
    d.address_free(static_cast<CUdeviceptr>(base), r.reserved);
  }
}

void* ReleasableMemory::allocate(size_t bytes) {
  const size_t granules = (bytes + granule_ - 1) / granule_;
  CUdeviceptr base = 0;
  check_driver(driver().reserve(&base, granules * granule_, granule_, 0, 0),
               "cuMemAddressReserve of " + std::to_string(granules * granule_) + " bytes");
  Reservation r;
  r.base = static_cast<uintptr_t>(base);
  r.bytes = bytes;
  r.reserved = granules * granule_;
  r.chunks.assign(granules, 0);
  r.mapped.assign(granules, 0);
  r.pending.assign(granules, 0);
  Reservation& kept = reservations_.emplace(r.base, std::move(r)).first->second;
  try {
    releases_.collect(releaser());
    for (size_t g = 0; g < granules; ++g) map_reclaiming(kept, g);
  } catch (...) {
    size_t ignored = 0;
    free(reinterpret_cast<void*>(kept.base), ignored);
    throw;
  }
  return reinterpret_cast<void*>(static_cast<uintptr_t>(base));
}

bool ReleasableMemory::free(void* ptr, size_t& decommitted) {
  auto it = reservations_.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == reservations_.end()) return false;
  Reservation& r = it->second;
  synchronize_compute_streams(device_);  // any of them may have used it last
  releases_.drain(releaser(), r.base);
  for (size_t g = 0; g < r.mapped.size(); ++g) {
    if (r.mapped[g]) unmap(r, g);
  }
  check_driver(driver().address_free(static_cast<CUdeviceptr>(r.base), r.reserved), "cuMemAddressFree");
  decommitted = r.decommitted;
  reservations_.erase(it);
  return true;
}

size_t ReleasableMemory::decommit(void* ptr, size_t bytes, cudaStream_t stream) {
  Reservation& r = find(ptr, bytes, "decommit");
  releases_.collect(releaser());
  // A granule waiting for its release is decommitted already: nothing may touch it.
  auto live = [&](size_t g) { return r.mapped[g] && !r.pending[g]; };
  const size_t offset = reinterpret_cast<uintptr_t>(ptr) - r.base;
  for (const GranuleEdge& e : granule_edges(offset, bytes, granule_)) {
    if (!live(e.granule)) continue;
    check_cuda(cudaMemsetAsync(reinterpret_cast<void*>(r.base + e.offset), 0, e.bytes, stream),
               "cudaMemsetAsync (the ends of a decommitted range)");
  }
  const GranuleRange whole = whole_granules(offset, bytes, granule_);
  std::vector<Releases::Granule> released;
  for (size_t g = whole.first; g < whole.last; ++g) {
    if (live(g)) released.push_back({r.base, g});
  }
  if (released.empty()) return 0;
  // Kernels and copies queued before may still use the granules: their chunks go after them.
  const size_t bytes_released = released.size() * granule_;
  std::vector<size_t> indices;
  for (const Releases::Granule& g : released) indices.push_back(g.index);
  releases_.defer(reinterpret_cast<uintptr_t>(stream), StreamEvent(stream), std::move(released), releaser());
  for (size_t g : indices) r.pending[g] = 1;  // once queued (a throw above leaves them live)
  r.decommitted += bytes_released;
  return bytes_released;
}

size_t ReleasableMemory::commit(void* ptr, size_t bytes, cudaStream_t stream) {
  Reservation& r = find(ptr, bytes, "commit");
  const GranuleRange touched = touched_granules(reinterpret_cast<uintptr_t>(ptr) - r.base, bytes, granule_);
  releases_.collect(releaser());
  // A granule still waiting for its release keeps its chunk; the stream's next use of it (the
  // zeroing below, then the caller's) follows the work its release waited for.
  auto follow = [&](const StreamEvent& fence) {
    check_cuda(cudaStreamWaitEvent(stream, fence.event(), 0), "cudaStreamWaitEvent (a granule committed again)");
  };
  size_t taken = 0;
  for (size_t g = touched.first; g < touched.last; ++g) {
    if (r.pending[g] && releases_.take_back({r.base, g}, follow)) {
      r.pending[g] = 0;
      check_cuda(cudaMemsetAsync(reinterpret_cast<void*>(r.base + g * granule_), 0, granule_, stream),
                 "cudaMemsetAsync (a committed granule)");
      taken += granule_;
      continue;
    }
    if (r.mapped[g]) continue;
    map_reclaiming(r, g);
    check_cuda(cudaMemsetAsync(reinterpret_cast<void*>(r.base + g * granule_), 0, granule_, stream),
               "cudaMemsetAsync (a committed granule)");
    taken += granule_;
  }
  r.decommitted -= taken;
  return taken;
}

void ReleasableMemory::collect() { releases_.collect(releaser()); }

bool ReleasableMemory::free_pending() {
  if (releases_.pending_releases() == 0) return false;
  releases_.drain(releaser());
  return true;
}

bool ReleasableMemory::holds(const void* ptr) const {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = reservations_.upper_bound(p);
  if (it == reservations_.begin()) return false;
  --it;
  return p < it->first + it->second.reserved;
}

ReleasableMemory::Reservation& ReleasableMemory::find(const void* ptr, size_t bytes, const char* what) {
  const uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = reservations_.upper_bound(p);
  LOOM_CHECK(it != reservations_.begin() && p + bytes <= std::prev(it)->first + std::prev(it)->second.bytes,
             std::string("CUDA: ") + what + " of " + std::to_string(bytes) +
                 " bytes outside releasable device memory (only Allocator::allocate_releasable's can be)");
  return std::prev(it)->second;
}

void ReleasableMemory::map(Reservation& r, size_t granule) {
  const Driver& d = driver();
  const CUmemAllocationProp prop = chunk_properties(device_);
  CUmemGenericAllocationHandle chunk = 0;
  check_driver(d.create(&chunk, granule_, &prop, 0), "cuMemCreate of " + std::to_string(granule_) + " bytes on cuda:" +
                                                          std::to_string(device_) + " (committing device memory)");
  const CUdeviceptr at = static_cast<CUdeviceptr>(r.base + granule * granule_);
  const CUresult mapped = d.map(at, granule_, 0, chunk, 0);
  if (mapped != CUDA_SUCCESS) d.release(chunk);
  check_driver(mapped, "cuMemMap");
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  const CUresult accessible = d.set_access(at, granule_, &access, 1);
  if (accessible != CUDA_SUCCESS) {
    d.unmap(at, granule_);
    d.release(chunk);
  }
  check_driver(accessible, "cuMemSetAccess");
  r.chunks[granule] = chunk;
  r.mapped[granule] = 1;
}

void ReleasableMemory::map_reclaiming(Reservation& r, size_t granule) {
  if (releases_.pending_releases() == 0) return map(r, granule);
  try {
    map(r, granule);
  } catch (const Error&) {  // out of device memory, maybe: the chunks waiting to go, first
    releases_.drain(releaser());
    map(r, granule);
  }
}

void ReleasableMemory::release(const Releases::Granule& granule) {
  auto it = reservations_.find(granule.owner);
  if (it == reservations_.end()) return;
  it->second.pending[granule.index] = 0;
  if (it->second.mapped[granule.index]) unmap(it->second, granule.index);
}

void ReleasableMemory::unmap(Reservation& r, size_t granule) {
  check_driver(driver().unmap(static_cast<CUdeviceptr>(r.base + granule * granule_), granule_), "cuMemUnmap");
  r.mapped[granule] = 0;
  check_driver(driver().release(r.chunks[granule]), "cuMemRelease");
}

}  // namespace loom::kernels::cuda
