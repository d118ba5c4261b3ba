#pragma once
// An emulated CUDA device for tests on machines without a GPU. It registers an allocator for
// Device::cuda(i) whose memory is host memory behind TAGGED pointers (bit 62 set: a
// non-canonical address on x86-64, so any host load or store through one faults with SIGSEGV),
// and fills kernels::cuda_entries() with wrappers that check and untag every pointer argument
// (also those inside AttentionVisibility and AdamWTensor arrays) and run the CPU kernel. Model
// or trainer code that touches device memory from the host crashes, a host pointer handed to a
// device op is an Error naming the op, and the device path's numerics are the CPU's bit for bit.
// Releasable memory (Allocator::allocate_releasable: the model's flat buffers) is a mapping of
// its own whose granules are the host pages: decommit makes its whole pages PROT_NONE (and drops
// their memory), commit makes them readable and writable again, zeroed, and the allocator counts
// committed bytes. So any access to released memory dies with SIGSEGV too, as on a GPU with no
// demand paging, and bytes_in_use() / peak_bytes() measure what ZeRO 2 and 3 give back.
// Test support only: never linked into the product.
#include <cstdint>
#include <map>
#include <string>

#include "loom/core/device.h"

namespace loom::testing {

// Registers the emulated device as Device::cuda(0) .. cuda(devices - 1) and its entries: exactly
// the ops the real backend has a kernel for (where this build has one); the precision recipes'
// device-only entries (amax, round_in_place, precision_linear_gemm), which have no CPU kernel, run
// the CPU's emulation of the recipes (emulated_precision.h). Idempotent; `devices` of the first
// call wins (4 by default: runtime.device_comm=nccl, a GPU per rank, on up to 4 ranks).
void install_emulated_cuda(int devices = 4);

// Whether the page of emulated device memory at `ptr` is committed (true outside releasable
// memory).
bool emulated_committed(Device device, const void* ptr);

// What the device path asked of the emulated devices since the last reset: entry calls by op name
// (a kernel launch each on a GPU, or more), device copies and zeroings (copy_2d counts once, as
// one cudaMemcpy2DAsync), and transfers between host and device, each a wait for the device's
// queued work on a GPU (the backend's to_host and from_host synchronise the compute stream).
struct EmulatedCensus {
  std::map<std::string, int64_t> entries;
  int64_t copies = 0, zeroes = 0;
  int64_t to_host = 0, from_host = 0;
  // Transfers not waited for (Allocator::to_host_async / from_host_async; their bytes are counted
  // with the others') and fences waited for.
  int64_t to_host_async = 0, from_host_async = 0, fence_waits = 0;
  int64_t to_host_bytes = 0, from_host_bytes = 0;
  // Of those, the bytes whose host side was the device's transfer staging
  // (Allocator::allocate_transfer_staging: pinned memory on a GPU).
  int64_t staged_transfer_bytes = 0;
  // Each of the above by the compute queue of the thread that asked (core/compute_queue.h): on a
  // GPU the stream it went on.
  std::map<int, int64_t> by_queue;
  int64_t launches() const;  // entry calls + copies + zeroes
};
void reset_emulated_census();
EmulatedCensus emulated_census();

constexpr uintptr_t kDeviceTag = uintptr_t{1} << 62;

inline bool is_emulated_device_pointer(const void* p) { return (reinterpret_cast<uintptr_t>(p) & kDeviceTag) != 0; }

// The host address behind an emulated device pointer (tests that must look inside).
template <typename T>
T* emulated_host_view(T* p) {
  return reinterpret_cast<T*>(reinterpret_cast<uintptr_t>(p) & ~kDeviceTag);
}

}  // namespace loom::testing
