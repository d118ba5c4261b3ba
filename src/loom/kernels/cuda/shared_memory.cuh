#pragma once
// Dynamic shared memory beyond the default: without the kernel's consent a block gets 48 KiB of
// shared memory in all, its static share included, so dynamic bytes just under 48 KiB may still
// need it (the attention kernels' token metadata and statistics arrays are static).
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "loom/kernels/cuda/device.h"

namespace loom::kernels::cuda {

// A kernel's static shared memory, asked of the runtime once per kernel (allow_shared runs at
// every launch).
inline size_t static_shared_bytes(const void* kernel, const char* name) {
  static std::mutex mutex;
  static std::map<const void*, size_t> known;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = known.find(kernel);
  if (it != known.end()) return it->second;
  cudaFuncAttributes attributes{};
  const cudaError_t asked = cudaFuncGetAttributes(&attributes, kernel);
  if (asked != cudaSuccess) check_cuda(asked, std::string("cudaFuncGetAttributes(") + name + ")");
  return known.emplace(kernel, attributes.sharedSizeBytes).first->second;
}

// The kernel's consent to `bytes` of dynamic shared memory on the current device, only ever raised
// (per device and kernel): rank threads sharing a GPU at other sizes never lower it between
// another's setting and its launch.
template <typename Kernel>
void allow_shared(Kernel kernel, size_t bytes, const char* name) {
  const void* key = reinterpret_cast<const void*>(kernel);
  if (static_shared_bytes(key, name) + bytes <= 48 * 1024) return;
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t> allowed;
  std::lock_guard<std::mutex> lock(mutex);
  size_t& most = allowed[{device, key}];
  if (bytes <= most) return;
  const cudaError_t set =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (set != cudaSuccess) check_cuda(set, std::string("cudaFuncSetAttribute(") + name + ")");
  most = bytes;
}

}  // namespace loom::kernels::cuda
